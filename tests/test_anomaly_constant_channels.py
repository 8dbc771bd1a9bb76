"""Constant channels (issue 49, point 1): a channel at one value in the train rows is its own kind, its
departures score in every score kind, the summary and the model folder name it, and a table of states
and constants is scored, never refused. The detectors are trained as train.py trains them, tiny."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import TINY_ANOMALY
from tsformer.data.anomaly import AnomalyData, constant_channels, state_channels
from tsformer.data.simulators import simulate_plant
from tsformer.jobs.anomaly.judging import AnomalyContract, AnomalyModel
from tsformer.jobs.anomaly.report import report_lines
from tsformer.model_folder import ModelInfo
from tsformer.tasks.anomaly import MaskedAnomalyDetector
from tsformer.train import compose_config, fit_task

N_TRAIN = 800
DIP = slice(N_TRAIN + 150, N_TRAIN + 156)  # rows where the constant channel leaves its value


def with_flag_and_valve(table: pd.DataFrame) -> pd.DataFrame:
    """The plant with a valve (0/1, switching every 150 rows) and a flag held at 1.0 in the normal
    rows that dips to -1 for 6 judged rows (as on the telemetry series that were refused)."""
    flag = np.ones(len(table))
    flag[DIP] = -1.0
    return table.assign(valve=((np.arange(len(table)) // 150) % 2).astype(float), flag=flag)


@pytest.fixture(scope="module")
def plant():
    return with_flag_and_valve(simulate_plant(n_series=1, n_steps=1100, seed=5))


def fit(table: pd.DataFrame, folder, channels: list[str], *overrides: str):
    cfg = compose_config(
        [*TINY_ANOMALY, "logger=none", f"data.target_cols=[{','.join(channels)}]", f"data.train_end={N_TRAIN}",
         "data.label_col=null", "data.known_cols=[]", "trainer.limit_train_batches=5", *overrides],
        folder,
    )  # fmt: skip
    return fit_task(cfg, source=table).task


def test_a_constant_channel_is_its_own_kind_not_a_state_and_enters_at_its_value():
    values = np.array([[0.0, 1.0, 0.0, 5.0], [1.0, 1.0, 0.0, 5.0], [1.0, 1.0, 0.0, 5.0]])
    # 0/1 values; constant 1; constant 0; constant 5
    assert state_channels(values).tolist() == [True, False, False, False]
    assert constant_channels(values).tolist() == [False, True, True, True]
    table = pd.DataFrame(np.tile(values, (20, 1)), columns=list("abcd"))
    table.loc[50, "d"] = 7.0  # a departure in the judged rows
    data = AnomalyData(table, target_cols=list("abcd"), context_len=4, train_end=40)
    data.setup()
    assert data.state_names == ["a"] and data.constant_names == ["b", "c", "d"]
    judged = data.datasets["test"].values.numpy()
    assert (
        judged[:, 1:] == 0
    ).all()  # the network sees a constant at its train value; departures score apart


def test_a_departure_of_one_unit_scores_as_the_validation_rows_99th_percentile_not_100_times_an_error():
    sizes = {"net": {"d_model": 8, "n_heads": 2, "n_layers": 1}, "d_target": 3, "d_known": 0, "d_observed": 0}
    task = MaskedAnomalyDetector(**sizes, context_len=8, horizon=0, channel_groups=2, window_norm=False,
                                 interpolate_hidden=True, constant_channels=["target_2"])  # fmt: skip
    task.set_standardisation(np.array([0.0, 0.0, 3.0]), np.ones(3))  # the constant at 3.0
    rng = np.random.default_rng(0)
    val = pd.DataFrame(rng.normal(size=(64, 3)), columns=task.channels).assign(target_2=3.0)
    val_scores = task.calibrate(val)
    unit = np.quantile(val_scores, 0.99)
    assert task.hparams.departure_scores == {"score": pytest.approx(unit)}
    judged = val.copy()
    judged.loc[20, "target_2"] = 3.0 - 2 * 3.0  # a departure of twice the constant's size
    scores = task.score(judged)
    added = scores.score - task.score(val).score
    np.testing.assert_allclose(added, np.where(np.arange(64) == 20, 2 * unit, 0.0), rtol=1e-6, atol=1e-9)
    # two units on top of the row's own score: at most three times the worst validation row (the first
    # rule gave 200, a hundred per unit); the bound is reached when row 20 is itself the worst row
    assert scores.contributions[20, 2] == pytest.approx(2 * unit)
    assert scores.score[20] <= 3 * val_scores.max() * (1 + 1e-9)
    task.hparams.departure_unit, task.hparams.departure_scores = 0.01, None  # a folder written before
    assert task.score(judged).score[20] - task.score(val).score[20] == pytest.approx(200.0)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["enc_only_anomaly", "dec_only_anomaly"])
def test_a_departure_of_a_constant_channel_scores_in_every_score_kind(plant, tmp_path, model):
    channels = ["ambient_temperature", "dynamic_temperature", "dynamic_pressure", "valve", "flag"]
    score = "model.score=hybrid" if model == "enc_only_anomaly" else "model.context_len=15"
    detector = fit(plant, tmp_path, channels, f"model={model}", score, "model.threshold_rows=validation")
    assert detector.constant_names == ["flag"] and detector.state_names == ["valve"]
    scores = detector.score(plant.iloc[N_TRAIN:].reset_index(drop=True))
    dip = np.arange(len(plant))[DIP] - N_TRAIN
    elsewhere = np.setdiff1d(np.arange(len(scores.score)), dip)
    assert (scores.score[dip] > float(detector.threshold)).all()
    assert scores.score[dip].min() > scores.score[elsewhere].max()
    assert all(top[0] == "flag" for top in np.asarray(scores.top_channels(1))[dip])
    for part, values in scores.parts.items():  # the hybrid's memory and restoration each see it
        assert values[dip].min() > values[elsewhere].max(), part


@pytest.mark.slow
def test_a_table_of_states_and_constants_is_scored_and_its_folder_names_the_constants(plant, tmp_path):
    # scored by the memory, which holds the train rows' windows: the validation rows' threshold
    detector = fit(
        plant,
        tmp_path / "run",
        ["valve", "flag"],
        "model.score=restoration",
        "model.threshold_rows=validation",
    )
    assert isinstance(detector, MaskedAnomalyDetector) and detector.parts == ("memory",)  # nothing to restore
    judged = plant.iloc[N_TRAIN:].reset_index(drop=True)
    scores = detector.score(judged)
    dip = np.arange(len(plant))[DIP] - N_TRAIN
    assert np.isfinite(scores.score).all() and (scores.score[dip] > float(detector.threshold)).all()
    info = ModelInfo(family="enc_only", dataset="plant", run_id=None, git_commit=None)
    model = AnomalyModel.of_task(detector, AnomalyContract(), info)
    folder = model.save(tmp_path / "model")
    written = json.loads((folder / "tsformer.json").read_text())
    assert written["hparams"]["constant_channels"] == ["flag"]
    again = AnomalyModel.load(folder)
    np.testing.assert_allclose(again.detector.score(judged).score, scores.score, rtol=1e-6)
    rows, events, _ = again.judge(judged)
    lines = report_lines(rows, events, again.false_alarm_rate, again.detector.state_names,
                         again.detector.constant_names)  # fmt: skip
    assert any(line.startswith("constant channels") and line.endswith(": flag") for line in lines)
