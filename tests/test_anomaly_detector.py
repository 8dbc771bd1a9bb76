"""Anomaly scores, calibrated alarms and events (tsformer.tasks.anomaly, tsformer.jobs.anomaly): the
detectors trained as train.py trains them (`train.fit_task` on the real configs), tiny, `slow`."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import TINY_ANOMALY
from tsformer.data.anomaly import AnomalyData, check_table, series_rows, split_normal_rows, state_channels
from tsformer.data.schema import DataValidationError
from tsformer.data.simulators import simulate_plant
from tsformer.data.window_scores import (
    causal_rows_of_windows,
    covering_window_starts,
    reference_rows_of_windows,
    rows_of_windows,
)
from tsformer.jobs.anomaly.judging import AnomalyContract, AnomalyModel
from tsformer.jobs.anomaly.report import false_event_ids, incidents_table
from tsformer.model_folder import ModelInfo
from tsformer.tasks import anomaly as anomaly_tasks
from tsformer.tasks.alarms import (
    DriftRule,
    EventRule,
    calibrate_threshold,
    drifting_threshold,
    event_spans,
    events_of,
)
from tsformer.tasks.anomaly import ForecastAnomalyDetector, MaskedAnomalyDetector, chosen_part
from tsformer.tasks.base import RECONSTRUCTIONS
from tsformer.train import compose_config, fit_task

CHANNELS = ["ambient_temperature", "supply_voltage", "dynamic_temperature", "dynamic_pressure"]
N_TRAIN = 800  # the first rows of the table are normal: train and validation


def with_valve(table: pd.DataFrame) -> pd.DataFrame:
    """The plant with a state channel: a valve open (1) or shut (0), switching every 150 rows."""
    return table.assign(valve=((np.arange(len(table)) // 150) % 2).astype(float))


@pytest.fixture(scope="module")
def plant():
    return with_valve(simulate_plant(n_series=1, n_steps=1200, seed=3))


def fit(table: pd.DataFrame, folder, *overrides: str, label: str | None = None):
    """A tiny detector trained on `table`'s first N_TRAIN rows by `train.fit_task` (the real configs)."""
    cfg = compose_config(
        [*TINY_ANOMALY, "logger=none", f"data.target_cols=[{','.join([*CHANNELS, 'valve'])}]",
         f"data.train_end={N_TRAIN}", f"data.label_col={label or 'null'}", "data.known_cols=[]", *overrides],
        folder,
    )  # fmt: skip
    return fit_task(cfg, source=table).task


@pytest.fixture(scope="module")
def hybrid(plant, tmp_path_factory):
    # a memory's scores of the train rows say nothing (their windows are in it): the validation rows' threshold
    return fit(
        plant, tmp_path_factory.mktemp("hybrid"), "model.score=hybrid", "model.threshold_rows=validation"
    )


# -- window scores back to rows ----------------------------------------------------------------------


def test_a_rows_score_is_the_mean_over_the_windows_that_cover_it():
    starts = covering_window_starts(10, 4, 3)
    assert starts.tolist() == [0, 3, 6]  # the last window ends at the last row
    scores = np.array([1.0, 2.0, 6.0])
    np.testing.assert_allclose(rows_of_windows(scores, starts, 4, 10), [1, 1, 1, 1.5, 2, 2, 4, 6, 6, 6])
    # the causal form: the windows that end at or before a row, in the 4 rows up to it
    np.testing.assert_allclose(
        causal_rows_of_windows(scores, starts, 4, 10), [0, 0, 0, 1, 1, 1, 1.5, 2, 2, 4]
    )


def test_rows_of_windows_equals_its_written_out_reference_to_the_bit():
    rng = np.random.default_rng(0)
    for n_rows, length, stride in [(1000, 32, 4), (999, 32, 16), (50, 8, 3), (8, 8, 1)]:
        starts = covering_window_starts(n_rows, length, stride)
        scores = rng.gamma(0.5, size=(len(starts), 5)) * 10.0 ** rng.integers(-8, 8, size=(len(starts), 1))
        for s in (scores, scores[:, 0]):  # (W, C) and (W,)
            np.testing.assert_array_equal(
                rows_of_windows(s, starts, length, n_rows),
                reference_rows_of_windows(s, starts, length, n_rows),
            )
        ends = starts + length - 1  # the causal form: windows running past the last row
        np.testing.assert_array_equal(
            causal_rows_of_windows(scores, starts, length, n_rows),
            reference_rows_of_windows(scores, ends, length, n_rows),
        )
    twice = np.array([0, 2, 2, 5])  # a start given twice: the reference's sum
    np.testing.assert_array_equal(
        rows_of_windows(np.arange(4.0), twice, 3, 8), reference_rows_of_windows(np.arange(4.0), twice, 3, 8)
    )


def test_scaled_errors_equal_their_one_expression_reference_to_the_bit():
    task = MaskedAnomalyDetector(net={"d_model": 8, "n_heads": 2, "n_layers": 1}, d_target=6, d_known=0,
                                 d_observed=0, context_len=8, horizon=0, state_channels=["target_2"])  # fmt: skip
    rng = np.random.default_rng(1)
    task.error_scale.copy_(torch.from_numpy(rng.uniform(0.01, 3.0, size=(2, 6))))
    raw = rng.gamma(0.5, size=(2, 40, 8, 6)).astype(np.float32)
    scaled = task.scaled_errors(raw)
    np.testing.assert_array_equal(scaled, task.reference_scaled_errors(raw))
    assert scaled.dtype == np.float64 and (scaled[..., 2] == 0).all() and (scaled[..., 0] > 0).all()


def test_the_state_channel_rule_and_the_data_leave_states_as_they_are():
    values = np.array([[0.0, 1.0, 0.0, 5.0], [1.0, 0.0, 0.0, 5.0], [1.0, 1.0, 0.5, 5.0]])
    # 0/1 values twice; a third level; a constant (its own kind: tests/test_anomaly_constant_channels.py)
    assert state_channels(values).tolist() == [True, True, False, False]
    table = pd.DataFrame(np.tile(values, (20, 1)), columns=list("abcd"))
    data = AnomalyData(table, target_cols=list("abcd"), context_len=4, train_end=40)
    data.setup()
    assert data.state_names == ["a", "b"]
    assert data.loc[:2].tolist() == [0.0, 0.0] and data.scale[:2].tolist() == [1.0, 1.0]  # not z-scored
    assert data.scale[2] != 1.0


def test_validation_blocks_spread_over_the_normal_rows_and_no_window_crosses_a_piece():
    table = pd.DataFrame({"series_id": np.repeat(["a", "b"], 100), "x": np.arange(200.0)})
    train, val = split_normal_rows(table, 0.2, blocks=4)
    # each series: 4 blocks of 25 rows, the last 5 of each held out
    assert val["x"].tolist() == [
        v + 25 * k + 100 * s for s in (0, 1) for k in range(4) for v in range(20, 25)
    ]
    assert len(series_rows(train)) == len(series_rows(val)) == 8
    data = AnomalyData(table, target_cols=["x"], context_len=5, train_end=1.0 - 1e-9, val_blocks=4)
    data.set_tables(train, val, val)
    windows = [data.datasets["train"][i]["hist_target"][:, 0] for i in range(len(data.datasets["train"]))]
    assert len(windows) == 8 * (20 - 5 + 1)  # never across the 5 held-out rows between two pieces
    assert all(np.allclose(np.diff(w.numpy()) * data.scale[0], 1.0) for w in windows)


def test_the_judged_rows_windows_of_the_test_loss_lie_side_by_side_the_normal_rows_every_one():
    table = pd.DataFrame({"series_id": np.repeat(["a", "b"], 100), "x": np.arange(200.0)})
    data = AnomalyData(table, target_cols=["x"], context_len=5, train_end=60, val_fraction=0.25)
    data.setup()
    assert data.n_windows("train") == 2 * (45 - 5 + 1) and data.n_windows("val") == 2 * (15 - 5 + 1)
    assert data.n_windows("test") == 2 * 8  # 40 judged rows a series: 8 windows of 5, none shared
    # every normal row, each series whole and in its order (what `model.threshold_rows=normal` reads)
    assert data.normal_rows["x"].tolist() == [*range(60), *range(100, 160)]


# -- the trained detector ---------------------------------------------------------------------------


@pytest.mark.slow
def test_states_are_read_from_the_train_rows_never_hidden_and_not_restored(hybrid, plant):
    assert hybrid.state_names == ["valve"] and hybrid.hparams.score == "hybrid"
    mask = hybrid.hidden_mask((64, 16, 5))
    assert not mask[..., 4].any() and mask[..., :4].any()
    parts = hybrid.row_parts(plant.iloc[800:1000])
    assert (parts["restoration"][:, 4] == 0).all()  # a state is not restored ...
    assert (parts["memory"][:, 4] >= 0).all()  # ... but a window with it is compared whole


@pytest.mark.slow
def test_a_spike_moves_only_the_scores_of_rows_whose_covering_windows_hold_it(hybrid, plant):
    table = plant.iloc[N_TRAIN:1100].reset_index(drop=True)
    spiked = table.copy()
    spiked.loc[200, "dynamic_pressure"] += 30 * table["dynamic_pressure"].std()
    before, after = hybrid.score(table), hybrid.score(spiked)
    # windows of 16 rows every 4: those holding row 200 start at 188..200, so they cover rows 188..215
    held = np.zeros(len(table), dtype=bool)
    held[188:216] = True
    np.testing.assert_array_equal(before.score[~held], after.score[~held])
    assert (after.score[196:205] > before.score[196:205]).all()
    assert after.top_channels(1)[200] == ["dynamic_pressure"]


@pytest.mark.slow
def test_the_causal_form_never_reads_a_later_row(hybrid, plant):
    table = plant.iloc[N_TRAIN:1000].reset_index(drop=True)
    changed = table.copy()
    changed.loc[120:, CHANNELS] = changed.loc[120:, CHANNELS] * 3 + 50  # every later row changes
    before, after = hybrid.score(table, causal=True), hybrid.score(changed, causal=True)
    np.testing.assert_array_equal(before.contributions[:120], after.contributions[:120])
    assert not np.allclose(before.score[120:], after.score[120:])  # and the later scores do see it
    assert (before.score[:15] == 0).all()  # no complete window before row 15


@pytest.mark.slow
def test_the_memorys_top_channel_is_the_faulty_sensor(hybrid, plant):
    table = plant.iloc[N_TRAIN:1100].reset_index(drop=True)
    faulty = table.copy()
    sensor = "dynamic_temperature"
    faulty.loc[100:160, sensor] = table[sensor].iloc[100] + 4 * table[sensor].std()  # stuck, off by 4 sd
    names = np.asarray(hybrid.channels)
    normal, fault = hybrid.row_parts(table)["memory"], hybrid.row_parts(faulty)["memory"]  # (T, C)
    assert names[normal[110:150].sum(axis=0).argmax()] != sensor  # without the fault another channel leads
    assert names[fault[110:150].sum(axis=0).argmax()] == sensor
    assert fault[110:150].sum() > 1.5 * normal[110:150].sum()


@pytest.mark.slow
def test_a_model_folder_with_the_memory_reloads_and_scores_the_same(hybrid, plant, tmp_path):
    assert hybrid.hparams.memory_windows == len(hybrid.memory.keys) > 0
    info = ModelInfo(family="enc_only", dataset="plant", run_id=None, git_commit=None)
    folder = AnomalyModel.of_task(hybrid, AnomalyContract(), info).save(tmp_path / "model")
    again = AnomalyModel.load(folder).detector
    table = plant.iloc[N_TRAIN:1100].reset_index(drop=True)
    first, second = hybrid.score(table), again.score(table)
    np.testing.assert_allclose(second.score, first.score, rtol=1e-6)
    np.testing.assert_allclose(second.parts["memory"], first.parts["memory"], rtol=1e-6)
    assert again.state_names == ["valve"] and float(again.threshold) == float(hybrid.threshold)


@pytest.mark.slow
def test_the_judged_rows_carry_the_threshold_that_follows_drift_when_asked(hybrid, plant):
    table = plant.iloc[N_TRAIN:].reset_index(drop=True)
    model = AnomalyModel.of_task(hybrid, AnomalyContract())
    fixed = model.judge(table)[0]
    assert (fixed["threshold"] == float(hybrid.threshold)).all()
    hybrid.hparams.threshold_drift = {"span": 50, "delay": 100, "max_factor": 4.0}
    try:
        drifting = model.judge(table)[0]
    finally:
        hybrid.hparams.threshold_drift = None
    expected = drifting_threshold(fixed["score"].to_numpy(), float(hybrid.threshold), hybrid.hparams.val_score_median,
                                  DriftRule(span=50, delay=100))  # fmt: skip
    np.testing.assert_allclose(drifting["threshold"], expected)
    assert (drifting["alarm"] == (drifting["score"] > drifting["threshold"])).all()
    # level tail: over the validation rows' 95th percentile, kept by `calibrate`
    assert hybrid.hparams.val_score_tail > hybrid.hparams.val_score_median
    hybrid.hparams.threshold_drift = {"span": 50, "delay": 100, "max_factor": 4.0, "level": "tail"}
    try:
        tail = model.judge(table)[0]
    finally:
        hybrid.hparams.threshold_drift = None
    expected = drifting_threshold(fixed["score"].to_numpy(), float(hybrid.threshold), hybrid.hparams.val_score_tail,
                                  DriftRule(span=50, delay=100, level="tail"))  # fmt: skip
    np.testing.assert_allclose(tail["threshold"], expected)


@pytest.mark.slow
def test_labels_are_never_read_while_fitting(plant, tmp_path):
    labelled = plant.assign(label=0)
    labelled.loc[N_TRAIN + 50 : N_TRAIN + 80, "label"] = 1
    shuffled = labelled.assign(label=np.random.default_rng(0).permutation(labelled["label"].to_numpy()))
    quick = ["model.score=memory", "model.threshold_rows=validation", "trainer.limit_train_batches=2"]
    a = fit(labelled, tmp_path / "a", *quick, label="label")
    b = fit(shuffled, tmp_path / "b", *quick, label="label")
    table = plant.iloc[N_TRAIN:].reset_index(drop=True)
    np.testing.assert_array_equal(a.score(table).score, b.score(table).score)
    assert float(a.threshold) == float(b.threshold)


@pytest.mark.slow
def test_the_forecast_score_in_its_causal_form_never_reads_a_later_row(plant, tmp_path):
    detector = fit(plant, tmp_path, "model=dec_only_anomaly", "model.context_len=15")
    assert isinstance(detector, ForecastAnomalyDetector) and detector.state_names == ["valve"]
    table = plant.iloc[N_TRAIN:1000].reset_index(drop=True)
    changed = table.copy()
    changed.loc[120:, CHANNELS] = changed.loc[120:, CHANNELS] * 3 + 50
    before, after = detector.score(table, causal=True), detector.score(changed, causal=True)
    np.testing.assert_array_equal(before.contributions[:120], after.contributions[:120])
    assert not np.allclose(before.score[120:], after.score[120:])
    assert (before.contributions[:, 4] == 0).all()  # the state channel is not forecast


def test_scoring_restores_each_channel_half_once_in_channel_groups_passes_equal_by_every_path(monkeypatch):
    sizes = {
        "net": {"d_model": 8, "n_heads": 2, "n_layers": 1},
        "d_target": 11,
        "d_known": 0,
        "d_observed": 0,
    }
    task = MaskedAnomalyDetector(**sizes, context_len=8, horizon=0, channel_groups=4, window_norm=False,
                                 interpolate_hidden=True, state_channels=["target_3"]).eval()  # fmt: skip
    runs, halves = task.scoring_masks()
    assert len(runs) == 5 and len(halves) == 2 * 4  # 10 scored channels in 4 groups: 8 passes, not 20
    assert (torch.stack(halves).sum(0) == torch.from_numpy(task.is_scored).expand(8, 11)).all()  # once each
    assert not torch.stack(halves)[..., 3].any()  # the state is never hidden
    x = torch.randn(6, 8, 11)
    empty = x[..., :0]
    with torch.inference_mode():
        for mask in [*runs, *halves]:  # the interpolation computed once per mask gives restore's values
            expected = task.restore(
                {"hist_target": x, "hist_known": empty, "hist_observed": empty}, mask.expand_as(x)
            )
            torch.testing.assert_close(task.restore_under(x, mask), expected, atol=1e-5, rtol=1e-5)
        assert task.fast_path() and task.pass_plan(halves[0])["rows"] == slice(0, 4)  # a half: its rows
        grouped = task.restoration_errors(x)  # 6 windows are few: several masks a network call
        monkeypatch.setattr(anomaly_tasks, "CHUNK", 4)  # now a table's chunks of windows
        fast = task.restoration_errors(x)  # the fast path: only the rows and channels each pass hides
        task.fast_path = lambda: False
        generic = task.restoration_errors(x)  # a call per mask, restore_under whole
        np.testing.assert_allclose(fast, generic, atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(grouped, generic, atol=1e-5, rtol=1e-4)
    old = MaskedAnomalyDetector(
        **sizes, context_len=8, horizon=0
    )  # a folder without the setting: one per channel
    assert len(old.scoring_masks()[1]) == 2 * 11


def test_score_auto_chooses_the_part_whose_normal_rows_are_most_concentrated_and_keeps_it(monkeypatch):
    flat, tailed = np.ones((100, 2)), np.ones((100, 2))
    tailed[:5] = 30.0  # 5 % of the normal rows far out: a heavy tail
    assert chosen_part({"restoration": flat, "memory": tailed}) == "restoration"
    assert chosen_part({"restoration": tailed**2, "memory": flat}) == "memory"
    assert chosen_part({"restoration": flat**2, "memory": flat}) == "restoration"  # a tie: restoration
    sizes = {"net": {"d_model": 8, "n_heads": 2, "n_layers": 1}, "d_target": 3, "d_known": 0, "d_observed": 0}
    task = MaskedAnomalyDetector(**sizes, context_len=8, horizon=0, score="auto", window_norm=False,
                                 interpolate_hidden=True).eval()  # fmt: skip
    assert task.parts == ("memory", "restoration")  # both, until the validation rows choose
    rng = np.random.default_rng(0)
    train, val = (pd.DataFrame(rng.normal(size=(n, 3)), columns=task.channels) for n in (60, 40))
    for chosen in ("memory", "restoration"):  # what the rule chose, and each way the folder keeps it
        monkeypatch.setattr("tsformer.tasks.anomaly.chosen_part", lambda parts, chosen=chosen: chosen)
        task.hparams.chosen_score = None
        task.prepare_scoring(train, val)
        assert task.parts == (chosen,) and task.hparams.chosen_score == chosen
        assert (
            len(task.memory.keys) == task.hparams.memory_windows == (60 + 40 - 2 * 7) * (chosen == "memory")
        )
        assert task.score(val).parts == {}  # one part: the chosen score alone


def test_the_threshold_is_read_from_every_normal_row_when_asked_and_from_the_validation_rows_else():
    sizes = {"net": {"d_model": 8, "n_heads": 2, "n_layers": 1}, "d_target": 3, "d_known": 0, "d_observed": 0}
    rng = np.random.default_rng(0)
    normal = pd.DataFrame(rng.normal(size=(300, 3)), columns=[f"target_{i}" for i in range(3)])
    normal.iloc[40:60] *= 6.0  # a loud stretch among the train rows; the validation rows (the last 100) quiet
    train, val = normal.iloc[:200], normal.iloc[200:]
    thresholds = {}
    for rows in ("validation", "normal"):
        torch.manual_seed(0)  # the same untrained network both times
        task = MaskedAnomalyDetector(**sizes, context_len=8, horizon=0, window_norm=False, interpolate_hidden=True,
                                     threshold_rows=rows).eval()  # fmt: skip
        val_scores = task.prepare_scoring(train, val, normal)
        read_from = task.score(normal).score if rows == "normal" else val_scores
        assert float(task.threshold) == pytest.approx(calibrate_threshold(read_from, 0.001))
        assert task.hparams.val_score_median == pytest.approx(np.median(read_from))
        thresholds[rows] = float(task.threshold)
        assert task.val_scores is val_scores  # the validation rows' scores either way
    assert thresholds["normal"] > 2 * thresholds["validation"]  # the loud train rows raise it
    forecast = ForecastAnomalyDetector(**sizes, context_len=8, horizon=1, threshold_rows="normal")
    assert (
        forecast.hparams.threshold_rows == "normal"
    )  # the forecast detector reads it too (it has no memory)


# -- alarms, events, thresholds, settings ------------------------------------------------------------


def test_events_k_of_n_merge_gap_and_min_duration():
    alarm = np.zeros(40, dtype=bool)
    alarm[[3, 5, 6, 20, 30, 31, 32]] = True
    ev = events_of(alarm, EventRule(k=1, n=1, merge_gap=2, min_duration=1))
    assert ev[3] == ev[5] == ev[6] == 0 and ev[4] == 0  # a gap of one row is merged
    assert ev[20] == 1 and ev[30] == ev[32] == 2 and ev[10] == -1
    ev = events_of(alarm, EventRule(k=1, n=1, merge_gap=0, min_duration=2))
    assert sorted(set(ev[ev >= 0])) == [0, 1]  # the single alarms at 3 and 20 are dropped
    assert ev[5] == 0 and ev[30] == 1
    ev = events_of(alarm, EventRule(k=2, n=3, merge_gap=0))  # 2 of the last 3 rows
    assert (
        ev[2] == -1 and ev[3] == ev[5] == ev[7] == 0 and ev[8] == -1 and ev[20] == -1
    )  # from its first alarm
    assert ev[29] == -1 and ev[30] == ev[33] == 1 and ev[34] == -1
    spans = event_spans(alarm, EventRule(k=2, n=3, merge_gap=0))
    assert [(s.start, s.page, s.end) for s in spans] == [(3, 5, 8), (30, 31, 34)]  # paged at the 2nd alarm


def test_an_event_starts_at_its_first_alarm_so_an_incident_it_overlaps_is_found_not_missed():
    # the k-of-n rule pages at the 4th alarm of 8: the alarms begin inside the incident (rows 10-14)
    # and the page comes after it ends; the event must hold those alarms (found late, paged after)
    alarm = np.zeros(40, dtype=bool)
    alarm[[13, 15, 17, 19, 20]] = True
    label = np.zeros(40, dtype=int)
    label[10:15] = 1
    spans = event_spans(alarm, EventRule(k=4, n=8, merge_gap=0))
    assert [(s.start, s.page, s.end) for s in spans] == [(13, 19, 23)]
    times = pd.date_range("2026-01-01", periods=40, freq="5min")
    rows = pd.DataFrame({"series_id": 0, "time": times, "score": alarm * 2.0, "threshold": 1.0,
                         "alarm": alarm.astype(int), "label": label,
                         "event_id": pd.array(np.where(events_of(alarm, EventRule(k=4, n=8, merge_gap=0)) >= 0, 0,
                                                       None), dtype="Int64")})  # fmt: skip
    events = pd.DataFrame(
        {"event_id": [0], "start": [times[13]], "page_delay_rows": [6], "top_channels": ["x"]}
    )
    incident = incidents_table(rows, events).iloc[0]
    assert incident["status"] == "late" and incident["delay_rows"] == 3  # its 4th row: the first alarm
    assert incident["page_delay_rows"] == 9 and incident["page_delay"] == "45 min"  # paged at row 19
    assert false_event_ids(rows, events) == set()  # the event overlaps the incident: not false


def test_hysteresis_holds_an_event_while_the_score_stays_above_the_release_level():
    over = np.array([0.5, 1.2, 0.9, 1.1, 0.9, 0.95, 0.3, 1.2, 0.9])  # score / threshold
    alarm = over > 1.0
    without = events_of(alarm, EventRule(merge_gap=0), over)
    assert without.tolist() == [-1, 0, -1, 1, -1, -1, -1, 2, -1]  # a wavering score: three pages
    held = events_of(alarm, EventRule(merge_gap=0, release=0.8), over)
    assert held.tolist() == [-1, 0, 0, 0, 0, 0, -1, 1, 1]  # one event until it falls below 0.8
    with pytest.raises(ValueError, match="release=0 must lie in"):
        EventRule(release=0)


def test_a_drifting_threshold_follows_slow_drift_but_not_a_drift_fault_nor_the_rows_of_its_delay():
    rng = np.random.default_rng(0)
    T, rule = 4000, DriftRule(span=300, delay=500, max_factor=4.0)
    drifting = np.linspace(1.0, 2.5, T) * rng.exponential(1.0, T)  # normal rows' scores drifting up 2.5x
    base = float(np.quantile(rng.exponential(1.0, 20_000), 0.999))  # calibrated on undrifted rows
    fixed = (drifting > base).mean()
    followed = drifting_threshold(drifting, base, float(np.log(2.0)), rule)  # the exponential's median
    assert followed[:800].tolist() == [base] * 800  # nothing yet lies delay + span rows back
    assert (drifting > followed).mean() < fixed / 3  # the drift's false alarms cut
    assert followed.max() <= 4.0 * base
    fault = drifting.copy()
    fault[3000:3400] += np.linspace(0, 12 * base, 400)  # a drift fault growing over 400 rows < delay
    with_fault = drifting_threshold(fault, base, float(np.log(2.0)), rule)
    np.testing.assert_array_equal(with_fault[:3500], followed[:3500])  # its own rows never raise it
    assert (fault[3200:3400] > with_fault[3200:3400]).mean() > 0.9  # so the fault stays alarmed
    with pytest.raises(ValueError, match="span=0 >= 1"):
        DriftRule(span=0)


def test_a_drifting_threshold_at_the_tail_level_follows_a_widening_tail_and_keeps_its_guard():
    rng = np.random.default_rng(0)
    T, median, tail = 4000, float(np.log(2.0)), float(-np.log(0.05))  # the exponential's, and its 95 %
    x = rng.exponential(1.0, T)
    drifting = np.where(x > median, median + (x - median) * np.linspace(1.0, 2.5, T), x)  # its tail widens
    base = -np.log(0.001)  # calibrated on undrifted rows
    fixed = (drifting > base).mean()
    by_median = drifting_threshold(drifting, base, median, DriftRule(span=100, delay=500, level="median"))
    rule = DriftRule(span=100, delay=500, level="tail")
    followed = drifting_threshold(drifting, base, tail, rule)
    assert followed[:600].tolist() == [base] * 600  # nothing yet lies delay + span rows back
    assert followed[1000] == pytest.approx(base * max(1.0, np.quantile(drifting[400:500], 0.95) / tail))
    assert (drifting > followed).mean() < min(fixed / 3, (drifting > by_median).mean() / 2)
    fault = drifting.copy()
    fault[3000:3400] += np.linspace(0, 12 * base, 400)  # a drift fault growing over 400 rows < delay
    with_fault = drifting_threshold(fault, base, tail, rule)
    np.testing.assert_array_equal(with_fault[:3500], followed[:3500])  # its own rows never raise it
    assert (fault[3200:3400] > with_fault[3200:3400]).mean() > 0.9
    with pytest.raises(ValueError, match="level='top' is one of median, tail"):
        DriftRule(level="top")


def test_threshold_from_the_pareto_tail_matches_a_known_distribution():
    rng = np.random.default_rng(0)
    scores = rng.exponential(size=5000)  # exceeds x with probability exp(-x)
    threshold = calibrate_threshold(scores, 0.001)
    assert threshold == pytest.approx(-np.log(0.001), rel=0.15)  # 6.9; the empirical one has 5 rows above it
    assert calibrate_threshold(scores, 0.1) == pytest.approx(np.quantile(scores, 0.9))
    with pytest.raises(ValueError, match="false_alarm_rate"):
        calibrate_threshold(scores, 0.0)


def test_the_thresholds_upper_bound_covers_the_true_rate_where_the_estimate_falls_short():
    truth = -np.log(0.001)  # exponential scores exceed it with probability 0.001
    covered = {"estimate": 0, "bound": 0}
    for seed in range(6):
        scores = np.random.default_rng(200 + seed).exponential(size=2000)
        estimate = calibrate_threshold(scores, 0.001)
        bound = calibrate_threshold(scores, 0.001, confidence=0.9, n_boot=40, seed=seed)
        assert bound > estimate
        covered["estimate"] += estimate >= truth
        covered["bound"] += bound >= truth
    # the estimate alone lies below the true threshold more often than not (too many alarms); the 90 %
    # bound above it in most samples
    assert covered["bound"] >= 4 and covered["bound"] > covered["estimate"], covered
    with pytest.raises(ValueError, match="confidence=1.5"):
        calibrate_threshold(scores, 0.001, confidence=1.5)
    with pytest.raises(ValueError, match="block=3000 must lie in 1..2000"):
        calibrate_threshold(scores, 0.001, confidence=0.9, block=3000)


def test_bad_tables_are_one_line_naming_the_column_or_row(plant):
    with pytest.raises(DataValidationError, match="column 'dynamic_pressure' is missing"):
        check_table(plant.drop(columns="dynamic_pressure"), CHANNELS, 16)
    holed = plant.copy()
    holed.loc[holed.index[7], "supply_voltage"] = np.nan
    with pytest.raises(DataValidationError, match="column 'supply_voltage', row 7 .counted from 0.: empty"):
        check_table(holed, CHANNELS, 16)
    with pytest.raises(DataValidationError, match="fewer than one window of 16 .model.context_len"):
        check_table(plant.head(10), CHANNELS, 16)


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"false_alarm_rate": 2}, "false_alarm_rate=2: a share of normal rows"),
        ({"events": {"k": 3}}, "events: k=3 of n=1 needs 1 <= k <= n"),
        ({"events": {"colour": 1}}, "events: "),
        ({"monitor": "val/mse"}, "monitor='val/mse'"),
        ({"threshold_confidence": 1.5}, "threshold_confidence=1.5: a probability in (0, 1)"),
        ({"threshold_drift": {"delay": -1}}, "threshold_drift: span=300 >= 1, delay=-1 >= 0"),
        ({"threshold_rows": "train"}, "threshold_rows='train': one of ['validation', 'normal']"),
        (
            {"threshold_rows": "normal", "score": "hybrid"},
            "threshold_rows='normal' with score=hybrid: the train",
        ),
        ({"threshold_rows": "normal", "score": "memory"}, "threshold_rows='normal' with score=memory"),
        (
            {"threshold_rows": "normal", "state_channels": ["target_0", "target_1"]},
            "threshold_rows='normal' with a table of states and constants",
        ),
        ({"head": {"kind": "quantile"}}, "head=quantile: the forecast detector's head is Gaussian"),
        ({"score": "forecast"}, "score='forecast': MaskedAnomalyDetector scores by one of"),
        ({"stride": 9}, "stride=9: at most context_len (8)"),
        ({"state_channels": ["c"]}, "state_channels: ['c'] are not channels"),
        ({"constant_channels": ["c"]}, "constant_channels: ['c'] are not channels"),
        (
            {"state_channels": ["target_0"], "constant_channels": ["target_0"]},
            "constant_channels: ['target_0'] are state_channels too",
        ),
    ],
)
def test_a_detector_refuses_bad_settings_when_built(setting, message):
    sizes = {"net": {"d_model": 8, "n_heads": 2, "n_layers": 1}, "d_target": 2, "d_known": 0, "d_observed": 0}
    task = ForecastAnomalyDetector if "head" in setting else MaskedAnomalyDetector
    window = {"context_len": 8, "horizon": 0 if task.produces == RECONSTRUCTIONS else 1}
    with pytest.raises(ValueError) as err:
        task(**sizes, **window, **setting)
    assert str(err.value).startswith(message), str(err.value)
