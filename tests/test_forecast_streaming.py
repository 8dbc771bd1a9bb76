"""A forecaster's streams (jobs/forecasting/streaming.py): a client sends only its new rows (new
observations, the known inputs of new future steps) and gets, after each request, the forecasts that the
whole table so far gives, from a state that stays bounded."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from tsformer.data.simulators import simulate_plant
from tsformer.data.split_rows import SplitRows
from tsformer.serving.predictor import Predictor
from tsformer.serving.streams import StreamStates

FIXTURES = REPO / "tests" / "fixtures"
TARGETS = ["dynamic_temperature", "dynamic_pressure"]
CONTEXT, HORIZON = 12, 4  # the fixture's window


def so_far(plant: pd.DataFrame, observed: dict, series) -> pd.DataFrame:
    """The table a client holds: per series of `series`, its rows observed so far (`observed[sid]` rows),
    then HORIZON future rows with their targets empty; times as text."""
    parts = []
    for sid in series:
        rows = plant[plant.series_id == sid].iloc[: observed[sid] + HORIZON].copy()
        rows.loc[rows.index[observed[sid] :], TARGETS] = np.nan
        parts.append(rows)
    return pd.concat(parts).astype({"time": str}).reset_index(drop=True)


def test_forecasts_from_streamed_new_rows_equal_the_whole_tables_and_the_kept_rows_stay_bounded():
    predictor = Predictor.of_folder(FIXTURES / "forecaster_v2")
    plant = simulate_plant(n_series=2, n_steps=60, freq="1min", seed=3)
    rng, state = np.random.default_rng(0), None
    observed = {0: 0, 1: 0}
    for request in range(8):
        series = [0, 1] if request in (0, 5) else [int(rng.integers(2))]  # sometimes one series only
        before = dict(observed)
        for sid in series:
            observed[sid] = max(observed[sid], CONTEXT) + int(rng.integers(1, 5))
        whole = so_far(plant, observed, series)
        # the new rows only: the observations since the last request (each replaces the future row kept
        # for its time) and the future steps not sent yet; a future row already sent is not sent again
        position = whole.groupby("series_id").cumcount().to_numpy()
        start = whole.series_id.map(before).to_numpy()
        still_future = (position >= whole.series_id.map(observed).to_numpy()) & (position < start + HORIZON)
        new = whole[(position >= start) & ~(still_future & (start > 0))]
        new = new.sort_values("time", kind="stable")  # the series' rows interleaved
        answer, state = predictor.predict_stream(state, new, {})
        pd.testing.assert_frame_equal(answer, predictor.predict(whole))
        assert state.rows.groupby("series_id").size().max() <= CONTEXT + HORIZON
    # a bad cell: one line naming it, the state left as it was
    bad = so_far(plant, {0: observed[0] + 1}, [0]).tail(1).assign(ambient_pressure="broken")
    with pytest.raises(
        ValueError, match=r"^the table: non-numeric value 'broken' at column 'ambient_pressure', row 0"
    ):
        predictor.predict_stream(state, bad, {})
    again, _ = predictor.predict_stream(state, so_far(plant, {0: observed[0] + 1}, [0]).tail(HORIZON + 1), {})
    assert again.origin_time.iloc[0] == pd.Timestamp(plant.time[plant.series_id == 0].iloc[observed[0]])


def test_a_dropped_forecast_stream_says_so_when_its_new_rows_alone_are_too_short():
    predictor = Predictor.of_folder(FIXTURES / "forecaster_v2")
    plant = simulate_plant(n_series=1, n_steps=40, freq="1min", seed=4)
    streams = StreamStates(max_keys=1)
    first = so_far(plant, {0: CONTEXT}, [0])
    for key in ("a", "b"):  # b drops a
        streams.answer(key, lambda state: predictor.predict_stream(state, first, {}))
    new = so_far(plant, {0: CONTEXT + 1}, [0]).tail(HORIZON + 1)  # one observation, one future step
    with pytest.raises(
        ValueError, match=r"^stream 'a' was dropped \(more than 1 streams kept\): .*too little hist"
    ):
        streams.answer("a", lambda state: predictor.predict_stream(state, new, {}))


def test_a_requests_rows_as_the_server_reads_them_are_answered_as_their_table():
    """tsformer-serve gives a stream's `dataframe_split` rows as `SplitRows`: a forecaster reads their
    DataFrame."""
    predictor = Predictor.of_folder(FIXTURES / "forecaster_v2")
    plant = simulate_plant(n_series=2, n_steps=60, freq="1min", seed=3)
    split = json.loads(
        so_far(plant, {0: CONTEXT + 2, 1: CONTEXT + 3}, [0, 1]).to_json(orient="split", index=False)
    )
    rows = SplitRows.of(split["columns"], split["data"])
    answer, _ = predictor.predict_stream(None, rows, {})
    pd.testing.assert_frame_equal(answer, predictor.predict_stream(None, rows.frame, {})[0])
    assert len(answer) == 2 * len(TARGETS) * HORIZON  # two series forecast
