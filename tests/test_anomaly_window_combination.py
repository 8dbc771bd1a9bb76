"""`model.score=restoration+window_memory` (tsformer.tasks.anomaly, issue 57): restoration beside the
memory of raw windows, each over its validation rows' 99th percentile, averaged. An untrained network:
the combination's arithmetic is checked, not what a trained network scores."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tsformer.data.window_scores import covering_window_starts, rows_of_windows
from tsformer.tasks.anomaly import PART_QUANTILE, WINDOW_COMBINATION, MaskedAnomalyDetector

SIZES = {"net": {"d_model": 8, "n_heads": 2, "n_layers": 1}, "d_target": 3, "d_known": 0, "d_observed": 0}
N = 8  # rows of a window


def detector(**settings) -> MaskedAnomalyDetector:
    torch.manual_seed(0)
    return MaskedAnomalyDetector(**SIZES, context_len=N, horizon=0, window_norm=False, interpolate_hidden=True,
                                 score=WINDOW_COMBINATION, **settings).eval()  # fmt: skip


def tables(seed: int = 0):
    rng = np.random.default_rng(seed)
    train, val, judged = (
        pd.DataFrame(rng.normal(size=(n, 3)), columns=[f"target_{i}" for i in range(3)]) for n in (60, 40, 50)
    )
    judged.iloc[30:34, 1] += 8.0  # a fault on one channel
    return train, val, judged


def nearest_distance(rows: np.ndarray, memory: list[np.ndarray], stride: int) -> np.ndarray:
    """Row scores, written out: each window (every `stride` rows) at its Euclidean distance to the
    nearest window (stride 1) of the `memory` series, a row the mean of the windows that cover it."""
    kept = np.concatenate([[s[a : a + N].ravel() for a in range(len(s) - N + 1)] for s in memory])
    starts = covering_window_starts(len(rows), N, stride)
    windows = np.stack([rows[a : a + N].ravel() for a in starts])
    distance = np.sqrt(((windows[:, None] - kept[None]) ** 2).sum(-1)).min(1)
    return rows_of_windows(distance, starts, N, len(rows))


@pytest.mark.parametrize("power", [0.5, 1.0])
def test_the_combination_is_the_mean_of_each_part_over_its_validation_quantile(power):
    task = detector(restoration_power=power)
    train, val, judged = tables()
    assert task.parts == ("restoration", "window_memory")
    val_scores = task.prepare_scoring(train, val)
    # the scales: each part's 99th percentile on the validation rows, their windows measured against
    # the train rows' windows alone (a window is never its own neighbour)
    restoration_val = task.row_parts(val)["restoration"].sum(1)
    memory_val = nearest_distance(val.to_numpy(), [train.to_numpy()], task.stride)
    scales = task.hparams.part_scales
    assert scales["restoration"] == pytest.approx(np.quantile(restoration_val, PART_QUANTILE))
    assert scales["window_memory"] == pytest.approx(np.quantile(memory_val, PART_QUANTILE), rel=1e-5)
    np.testing.assert_allclose(
        val_scores, ((restoration_val / scales["restoration"]) ** power + memory_val / scales["window_memory"]) / 2,
        rtol=1e-5,
    )  # fmt: skip
    # the judged rows: against every normal window (train and validation), the same scales
    assert task.hparams.memory_windows == len(task.memory.keys) == (60 - N + 1) + (40 - N + 1)
    scores = task.score(judged)
    window = nearest_distance(judged.to_numpy(), [train.to_numpy(), val.to_numpy()], task.stride)
    np.testing.assert_allclose(scores.parts["window_memory"], window, rtol=1e-5)
    restoration = scores.parts["restoration"]
    expected = ((restoration / scales["restoration"]) ** power + window / scales["window_memory"]) / 2
    np.testing.assert_allclose(scores.score, expected, rtol=1e-5)
    np.testing.assert_allclose(scores.contributions.sum(1), scores.score, rtol=1e-6)
    assert scores.top_channels(1)[31] == ["target_1"]  # the faulty channel leads
    assert scores.score[28:36].min() > scores.score[:20].max()  # and the fault stands out


def test_a_rows_score_reads_no_row_after_its_windows_and_the_scales_no_judged_row():
    task = detector()
    train, val, judged = tables()
    task.prepare_scoring(train, val)
    scales = dict(task.hparams.part_scales)
    changed = judged.copy()
    changed.iloc[30:] = changed.iloc[30:] * 3 + 5  # every row from 30 on
    before, after = task.score(judged), task.score(changed)
    assert task.hparams.part_scales == scales  # scoring never moves the scales
    # windows of 8 every 4 rows: a row before 23 lies only in windows that end before row 30
    np.testing.assert_array_equal(before.score[:23], after.score[:23])
    assert not np.allclose(before.score[30:], after.score[30:])


def test_the_window_memory_is_a_coreset_of_memory_size_and_reloads_from_its_state():
    task = detector(memory_size=20)
    train, val, judged = tables()
    task.prepare_scoring(train, val)
    assert len(task.memory.keys) == task.hparams.memory_windows == 20
    assert task.memory.keys.shape[1] == N * 3 and task.memory.keys.dtype == torch.float32  # raw values
    again = MaskedAnomalyDetector(**task.hparams).eval()  # a folder's hparams and weights
    again.load_state_dict(task.state_dict())
    np.testing.assert_allclose(again.score(judged).score, task.score(judged).score, rtol=1e-6)


def test_the_window_memory_leaves_known_inputs_out_and_a_table_of_states_scores_by_it_alone():
    task = detector(known_channels=["target_2"])
    train, val, judged = tables()
    task.prepare_scoring(train, val)
    shifted = judged.assign(target_2=judged["target_2"] + 100.0)  # a known input's change is no fault
    np.testing.assert_allclose(
        task.score(shifted).parts["window_memory"], task.score(judged).parts["window_memory"], rtol=1e-6
    )
    states = detector(state_channels=["target_0", "target_1", "target_2"])
    assert states.parts == ("window_memory",)
    with pytest.raises(ValueError, match="threshold_rows='normal' with score=restoration"):
        detector(threshold_rows="normal")
    with pytest.raises(ValueError, match="restoration_power=0: above 0"):
        detector(restoration_power=0)
