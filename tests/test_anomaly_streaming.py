"""An anomaly model's streams (jobs/anomaly/streaming.py): a table sent in random-sized chunks, its series
interleaved, is answered row for row as judging the whole table causally answers it (scores, alarms, top
channels, events), each row once, from a state that stays bounded."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from test_anomaly_detector import CHANNELS, N_TRAIN, fit, with_valve
from tsformer.data.simulators import simulate_plant
from tsformer.data.split_rows import SplitRows
from tsformer.jobs.anomaly.judging import AnomalyContract, AnomalyModel
from tsformer.jobs.anomaly.streaming import history_rows
from tsformer.serving.predictor import Predictor
from tsformer.tasks.alarms import EventRule

FIXTURES = REPO / "tests" / "fixtures"
ROW_COLUMNS = ["series_id", "time", "score", "alarm", "top_channel_1", "top_channel_2", "top_channel_3"]
EVENT_COLUMNS = ["series_id", "start", "end", "n_rows", "page_time", "page_delay_rows", "page_delay", "peak_score",
                 "peak_time", "top_channels"]  # fmt: skip


def two_series(table: pd.DataFrame) -> pd.DataFrame:
    """`table` (one series) and a second series of its values reversed in time, rows interleaved."""
    other = table.iloc[::-1].assign(series_id=1, time=table.time.to_numpy()).reset_index(drop=True)
    both = pd.concat([table.assign(series_id=0), other], ignore_index=True)
    return both.iloc[np.argsort(np.tile(np.arange(len(table)), 2), kind="stable")].reset_index(drop=True)


def with_alarms(model: AnomalyModel, table: pd.DataFrame, release: float = 1.0) -> AnomalyModel:
    """`model` with a threshold its causal scores of `table` pass 15 % of the time and a rule with every
    part at work (k of n, merged gaps, a shortest event; hysteresis where `release` < 1), so that the
    table holds events."""
    scores = model.detector.score(table, causal=True).score
    return replace(model, threshold=float(np.quantile(scores, 0.85)), rule=EventRule(2, 3, 3, 2, release))


def split_rows(table: pd.DataFrame) -> SplitRows:
    """`table`'s rows as tsformer-serve reads a stream's `dataframe_split` request of them (JSON)."""
    split = json.loads(json.dumps(table.to_dict(orient="split", index=False)))
    return SplitRows.of(split["columns"], split["data"])


def streamed(predictor: Predictor, table: pd.DataFrame, seed: int, sent=lambda rows: rows, most: int = 60):
    """(rows, events, the last state) of `table` sent in chunks of 1 to `most` rows (each as `sent` makes it)."""
    rng, state, rows, events, at = np.random.default_rng(seed), None, [], [], 0
    while at < len(table):
        n = int(rng.integers(1, most + 1))
        answer, state = predictor.predict_stream(state, sent(table.iloc[at : at + n]), {})
        rows.append(answer.drop(columns="event_id"))
        events.append(answer.attrs["beside"]["events"])
        at += n
        for kept in state.series.values():
            assert len(kept.values) <= max(history_rows(predictor.model), predictor.model.detector.window)
    for frame in rows:
        frame.attrs = {}
    return pd.concat(rows, ignore_index=True), pd.concat(events, ignore_index=True), state


def assert_streamed_as_whole(
    predictor: Predictor, table: pd.DataFrame, seed: int = 0, sent=lambda rows: rows, most: int = 60
):
    timed = table.assign(time=pd.to_datetime(table.time))
    whole, whole_events, _ = predictor.model.judge(timed, causal=True)
    rows, events, state = streamed(predictor, table, seed, sent, most)
    by_row = ["series_id", "time"]
    rows = rows.sort_values(by_row, kind="stable").reset_index(drop=True)
    whole = whole.sort_values(by_row, kind="stable").reset_index(drop=True)
    assert len(rows) == len(table)  # every row answered once
    pd.testing.assert_frame_equal(rows[ROW_COLUMNS], whole[ROW_COLUMNS], check_dtype=False, rtol=1e-6)
    closed = events[events.status == "closed"]
    still_open = sum(s.event is not None and s.event.event_id is not None for s in state.series.values())
    assert len(closed) + still_open == len(whole_events) and len(closed) >= 2
    order = ["series_id", "start"]
    got = closed[EVENT_COLUMNS].sort_values(order).reset_index(drop=True)
    expected = whole_events[EVENT_COLUMNS].sort_values(order).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected.iloc[: len(got)], check_dtype=False, rtol=1e-6)
    assert set(events.status) == {"open", "closed"}
    assert (got.page_delay_rows > 0).any()  # events paged after their first alarm, started at it in both


@pytest.mark.parametrize("row_score", ["value", "own", "window"])
def test_a_table_sent_in_chunks_is_answered_as_the_whole_table_scored_causally(row_score):
    predictor = Predictor.of_folder(FIXTURES / "anomaly_1")
    predictor.model.detector.hparams.row_score = row_score  # the three ways a row gets its score
    table = two_series(pd.read_csv(FIXTURES / "anomaly_1_input.csv").iloc[:200])
    predictor.model = with_alarms(predictor.model, table.assign(time=pd.to_datetime(table.time)))
    assert_streamed_as_whole(predictor, table, seed=len(row_score))


def test_a_stream_fed_row_by_row_gives_the_whole_tables_events_start_end_and_page():
    """Each row its own request: an event's start is set back to its first alarm, which came in a request
    before the page's, as the whole table starts it (`tasks.alarms.event_spans`)."""
    predictor = Predictor.of_folder(FIXTURES / "anomaly_1")
    table = pd.read_csv(FIXTURES / "anomaly_1_input.csv").iloc[:200].assign(series_id=0)
    predictor.model = with_alarms(predictor.model, table.assign(time=pd.to_datetime(table.time)))
    assert_streamed_as_whole(predictor, table, most=1)


def test_hysteresis_holds_a_streamed_event_across_chunks_as_in_the_whole_table():
    """An event held open by hysteresis (scores above release x threshold) across a chunk's edge; a
    constant channel's departures scored in the stream as in the whole table."""
    predictor = Predictor.of_folder(FIXTURES / "anomaly_1")
    detector = predictor.model.detector
    detector.is_constant = np.isin(detector.channels, ["supply_voltage"])  # at its train mean but 4 rows
    level = float(detector.channel_loc[detector.channels.index("supply_voltage")])
    table = pd.read_csv(FIXTURES / "anomaly_1_input.csv").iloc[:200]
    table["supply_voltage"] = np.where(np.isin(np.arange(200), [30, 31, 120, 170]), 1.03 * level, level)
    table = two_series(table)
    predictor.model = with_alarms(predictor.model, table.assign(time=pd.to_datetime(table.time)), release=0.7)
    assert_streamed_as_whole(predictor, table, seed=7)


def test_a_requests_rows_read_without_a_table_are_answered_as_the_whole_table():
    """The server's `SplitRows` (a stream's request read straight into arrays), a constant channel's
    departures and hysteresis at work."""
    predictor = Predictor.of_folder(FIXTURES / "anomaly_1")
    detector = predictor.model.detector
    detector.is_constant = np.isin(detector.channels, ["supply_voltage"])
    level = float(detector.channel_loc[detector.channels.index("supply_voltage")])
    table = pd.read_csv(FIXTURES / "anomaly_1_input.csv").iloc[:200]
    table["supply_voltage"] = np.where(np.isin(np.arange(200), [30, 120]), 1.03 * level, level)
    table = two_series(table)
    predictor.model = with_alarms(predictor.model, table.assign(time=pd.to_datetime(table.time)), release=0.7)
    sent = []
    assert_streamed_as_whole(
        predictor, table, seed=3, sent=lambda chunk: sent.append(split_rows(chunk)) or sent[-1]
    )
    assert not any("frame" in rows.__dict__ for rows in sent)  # read without their DataFrame


@pytest.mark.parametrize(
    "cell", ["broken", None, True, "2.5"], ids=["text", "empty", "bool", "number as text"]
)
def test_request_rows_the_plain_reader_leaves_are_read_and_refused_as_their_table(cell):
    """A cell that is not a plain number: the rows are read from their DataFrame, so the answer (pandas
    reads a bool or a number's text as a number), or the one line refusing them, is the table's."""
    predictor = Predictor.of_folder(FIXTURES / "anomaly_1")
    table = pd.read_csv(FIXTURES / "anomaly_1_input.csv").iloc[:25]
    _, state = predictor.predict_stream(None, table.iloc[:20], {})
    rows = split_rows(table.iloc[20:25])
    rows.data[1][rows.columns.index("supply_voltage")] = cell
    answers = []
    for sent in (rows, rows.frame):
        try:
            answer, _ = predictor.predict_stream(state, sent, {})
            answers.append(answer.drop(columns="event_id").to_dict("list"))
        except ValueError as err:
            answers.append(str(err))
    assert answers[0] == answers[1]
    if cell in ("broken", None):
        assert "column 'supply_voltage', row 1" in answers[0]


def test_a_model_whose_threshold_follows_drift_refuses_a_stream_in_one_line():
    predictor = Predictor.of_folder(FIXTURES / "anomaly_1")
    predictor.model.detector.hparams.threshold_drift = {"span": 100, "delay": 50, "max_factor": 2.0}
    table = pd.read_csv(FIXTURES / "anomaly_1_input.csv").iloc[:20]
    with pytest.raises(ValueError, match=r"^this model's threshold follows slow drift .*params.stream$"):
        predictor.predict_stream(None, table, {})


def test_a_stream_of_a_new_series_waits_for_one_window_and_refuses_bad_rows_leaving_its_state():
    predictor = Predictor.of_folder(FIXTURES / "anomaly_1")
    table = pd.read_csv(FIXTURES / "anomaly_1_input.csv")
    first, state = predictor.predict_stream(None, table.iloc[:10], {})
    assert len(first) == 0 and first.attrs["stream"]["pending_rows"] == {"0": 10}
    second, after = predictor.predict_stream(state, table.iloc[10:20], {})
    assert len(second) == 20 and second.attrs["stream"]["pending_rows"] == {}
    bad = table.iloc[20:25].assign(supply_voltage="broken")
    with pytest.raises(ValueError, match="column 'supply_voltage', row 0 .*not a number"):
        predictor.predict_stream(after, bad, {})
    again, _ = predictor.predict_stream(after, table.iloc[20:25], {})  # the state was left as it was
    assert again.time.tolist() == pd.to_datetime(table.time.iloc[20:25]).tolist()


@pytest.mark.slow
def test_a_forecast_detectors_stream_reads_the_context_before_each_row(tmp_path):
    """The forecast detector's surprise of a row reads the context_len rows before it: kept too."""
    plant = with_valve(simulate_plant(n_series=1, n_steps=1200, seed=3))
    task = fit(
        plant, tmp_path, "model=dec_only_anomaly", "model.context_len=15", "trainer.limit_train_batches=2"
    )
    task.prepare_scoring(plant.iloc[: N_TRAIN // 2], plant.iloc[N_TRAIN // 2 : N_TRAIN])
    model = AnomalyModel.of_task(task, AnomalyContract())
    table = plant.iloc[N_TRAIN:][["series_id", "time", *CHANNELS, "valve"]].reset_index(drop=True)
    table = two_series(table.assign(time=table.time.astype(str)))
    predictor = Predictor(Predictor.of_folder(FIXTURES / "anomaly_1").job, model)
    predictor.model = with_alarms(model, table.assign(time=pd.to_datetime(table.time)))
    assert history_rows(predictor.model) == 15 + task.window_length - 1
    assert_streamed_as_whole(predictor, table)
