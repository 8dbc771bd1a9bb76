"""The judged rows scored with each series' earlier rows as context (`jobs.anomaly.judging.scored_in_context`,
`data.judge_context`, predict.py's `--context-rows`): only the first rows' scores move, as scoring the
series whole would give them; no later row is read; the rows judged are the same rows. Untrained tiny
detectors (seconds)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tsformer.data.schema import DataValidationError
from tsformer.jobs.anomaly.job import answer, context_split, judge_context
from tsformer.jobs.anomaly.judging import AnomalyContract, AnomalyModel, context_reach
from tsformer.tasks.anomaly import ForecastAnomalyDetector, MaskedAnomalyDetector

SIZES = {"net": {"d_model": 8, "n_heads": 2, "n_layers": 1}, "d_target": 3, "d_known": 0, "d_observed": 0}
CHANNELS = [f"target_{i}" for i in range(3)]
N_BEFORE, N_JUDGED = 120, 80  # per series: the earlier (context) rows, then the rows judged


def series_table(seed: int = 0) -> pd.DataFrame:
    """Two series of N_BEFORE + N_JUDGED rows each, interleaved in blocks (their rows not contiguous)."""
    rng = np.random.default_rng(seed)
    parts = []
    for sid in ("a", "b"):
        n = N_BEFORE + N_JUDGED
        values = np.cumsum(rng.normal(size=(n, 3)), axis=0) * 0.1 + rng.normal(size=(n, 3))
        parts.append(pd.DataFrame(values, columns=CHANNELS).assign(series_id=sid, time=np.arange(n)))
    return pd.concat(parts, ignore_index=True)


def split(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    before = table["time"] < N_BEFORE
    return table[before].reset_index(drop=True), table[~before].reset_index(drop=True)


def model_of(kind: str, **settings) -> AnomalyModel:
    torch.manual_seed(0)
    if kind == "masked":
        task = MaskedAnomalyDetector(**SIZES, context_len=8, horizon=0, window_norm=False, interpolate_hidden=True,
                                     stride=4, **settings).eval()  # fmt: skip
    else:
        task = ForecastAnomalyDetector(**SIZES, context_len=8, horizon=1, score_window=6, **settings).eval()
    normal, _ = split(series_table(seed=1))
    train, val = normal[normal["time"] < 90], normal[normal["time"] >= 90]
    task.prepare_scoring(train.reset_index(drop=True), val.reset_index(drop=True))
    return AnomalyModel.of_task(task, AnomalyContract())


def first_rows(judged: pd.DataFrame, n: int) -> np.ndarray:
    return (judged["time"] < N_BEFORE + n).to_numpy()


@pytest.mark.parametrize(
    "kind, settings",
    [("masked", {}), ("masked", {"causal": True}), ("masked", {"row_score": "own"}), ("forecast", {})],
)
def test_context_moves_only_the_first_rows_scores_as_the_whole_series_scores_them(kind, settings):
    model = model_of(kind, **settings)
    table = series_table()
    context, judged = split(table)
    alone, _, _ = model.judge(judged)
    with_context, events, _ = model.judge(judged, context=context)
    assert len(with_context) == len(judged)  # the rows judged, no context row among them
    assert with_context["time"].tolist() == judged["time"].tolist()
    reach = context_reach(model.detector)
    first = first_rows(judged, reach)
    np.testing.assert_array_equal(with_context["score"][~first], alone["score"][~first])  # to the bit
    assert not np.allclose(with_context["score"][first], alone["score"][first])  # the edge rows do move
    # each series' rows as the series scored whole (its earlier rows before them) gives them
    whole = model.detector.score(table)
    judged_in_table = (table["time"] >= N_BEFORE).to_numpy()
    np.testing.assert_allclose(with_context["score"], whole.score[judged_in_table], rtol=1e-6, atol=1e-9)
    assert set(events["event_id"]) == set(with_context["event_id"].dropna().astype(int))


def test_causal_scores_with_context_never_read_a_later_row():
    model = model_of("masked", causal=True)
    context, judged = split(series_table())
    before = model.judge(judged, context=context)[0]["score"].to_numpy()
    changed = judged.copy()
    later = (changed["series_id"] == "a") & (changed["time"] >= N_BEFORE + 5)
    changed.loc[later, CHANNELS] += 50.0  # every row of series a from its 6th judged row on
    after = model.judge(changed, context=context)[0]["score"].to_numpy()
    untouched = ~later.to_numpy()
    np.testing.assert_array_equal(after[untouched], before[untouched])
    assert not np.allclose(after[later.to_numpy()], before[later.to_numpy()])


def test_a_series_context_moves_its_own_rows_only_and_a_series_without_one_scores_alone():
    model = model_of("masked")
    context, judged = split(series_table())
    base = model.judge(judged, context=context)[0]["score"].to_numpy()
    louder = context.assign(
        **{c: context[c].where(context["series_id"] != "a", context[c] * 5) for c in CHANNELS}
    )
    moved = model.judge(judged, context=louder)[0]["score"].to_numpy()
    in_a = (judged["series_id"] == "a").to_numpy()
    np.testing.assert_array_equal(moved[~in_a], base[~in_a])
    assert not np.allclose(moved[in_a], base[in_a])
    only_b = context[context["series_id"] == "b"]
    alone = model.judge(judged)[0]["score"].to_numpy()
    partial = model.judge(judged, context=only_b)[0]["score"].to_numpy()
    np.testing.assert_array_equal(partial[in_a], alone[in_a])
    np.testing.assert_array_equal(partial[~in_a], base[~in_a])


def test_context_rows_that_do_not_precede_the_series_are_refused_in_one_line():
    model = model_of("masked")
    context, judged = split(series_table())
    late = context.assign(time=context["time"] + N_BEFORE)  # the same times as the judged rows
    with pytest.raises(
        DataValidationError, match=r"context rows of series 'a' reach .*not before its first row"
    ):
        model.judge(judged, context=late)
    broken = context.copy()
    broken.loc[3, "target_1"] = np.nan
    with pytest.raises(DataValidationError, match=r"context rows: column 'target_1', row 3"):
        model.judge(judged, context=broken)


def test_predicts_context_rows_are_read_not_judged_nor_written():
    model = model_of("masked")
    table = series_table()
    context, judged = split(table)
    params = {"time_format": "", "normal_rows": "", "context_rows": str(N_BEFORE)}
    answered = answer(model, table, params, "new.csv")
    expected = model.judge(judged, context=context)[0]
    assert len(answered) == len(table) - 2 * N_BEFORE
    pd.testing.assert_frame_equal(answered.reset_index(drop=True), expected)
    plain = answer(model, table, {"time_format": "", "normal_rows": "", "context_rows": ""}, "new.csv")
    assert len(plain) == len(table)  # without it every row is judged, as before
    with pytest.raises(ValueError, match=r"new.csv: context_rows='x': give a number of rows"):
        context_split(table, "x", "new.csv")


def test_the_job_reads_the_normal_rows_as_context_only_when_asked():
    class Data:
        normal_rows = split(series_table())[0]
        judge_context = False

    assert judge_context(Data()) is None
    Data.judge_context = True
    assert judge_context(Data()) is Data.normal_rows
