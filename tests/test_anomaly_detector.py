"""Anomaly scores, calibrated alarms and events (tsformer.jobs.anomaly); tiny models, `slow` where they train."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tsformer.data.schema import DataValidationError
from tsformer.data.simulators import simulate_plant
from tsformer.jobs.anomaly.detector import check_table, fit_detector
from tsformer.tasks.alarms import EventRule, calibrate_threshold, events_of
from tsformer.tasks.anomaly import ForecastAnomalyDetector, MaskedAnomalyDetector

CHANNELS = ["ambient_temperature", "supply_voltage", "dynamic_temperature", "dynamic_pressure"]
TINY = {
    "context_len": 16,
    "d_model": 16,
    "n_heads": 2,
    "n_layers": 1,
    "steps": 40,
    "batch_size": 16,
    "stride": 4,
}


@pytest.fixture(scope="module")
def plant():
    return simulate_plant(n_series=1, n_steps=1200, seed=3)


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
    assert ev[3] == -1 and ev[5] == ev[7] == 0 and ev[8] == -1 and ev[20] == -1
    assert ev[30] == -1 and ev[31] == ev[33] == 1 and ev[34] == -1


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


@pytest.mark.slow
def test_forecast_score_of_a_step_never_changes_when_later_rows_change(plant):
    detector = fit_detector(plant.iloc[:800], None, CHANNELS, method="forecast", seed=0, **TINY)
    table = plant.iloc[800:1000].reset_index(drop=True)
    before = detector.score(table)
    changed = table.copy()
    changed.loc[120:, CHANNELS] = changed.loc[120:, CHANNELS] * 3 + 50  # every later row changes
    after = detector.score(changed)
    np.testing.assert_array_equal(before.contributions[:120], after.contributions[:120])
    assert not np.allclose(before.score[120:], after.score[120:])  # and the later scores do see it


@pytest.mark.slow
def test_masked_score_mid_series_unchanged_by_a_spike_far_outside_its_windows(plant):
    detector = fit_detector(plant.iloc[:800], None, CHANNELS, method="masked", seed=0, **TINY)
    table = plant.iloc[800:1100].reset_index(drop=True)
    spiked = table.copy()
    spiked.loc[250, "dynamic_pressure"] += 50 * table["dynamic_pressure"].std()
    before, after = detector.score(table), detector.score(spiked)
    middle = slice(100, 200)  # windows of 16 steps: none reaches row 250 from here
    np.testing.assert_array_equal(before.score[middle], after.score[middle])
    assert after.score[250] > 10 * before.score[250]  # the spike itself stands out
    assert after.top_channels(1)[250] == ["dynamic_pressure"]


@pytest.mark.slow
def test_calibrated_threshold_gives_the_target_rate_on_fresh_normal_rows():
    table = simulate_plant(n_series=1, n_steps=9000, seed=5)
    train, val, fresh = table.iloc[:3000], table.iloc[3000:5000], table.iloc[5000:]
    detector = fit_detector(train, val, CHANNELS, method="forecast", seed=0, **(TINY | {"steps": 150}))
    rate = 0.01
    threshold = calibrate_threshold(detector.val_scores, rate)
    alarms = int((detector.score(fresh).score > threshold).sum())
    n = len(fresh)
    spread = 4 * np.sqrt(n * rate * (1 - rate))  # binomial sd, widened: neighbouring scores share windows
    assert abs(alarms - n * rate) <= spread, (alarms, n * rate, spread)


@pytest.mark.slow
def test_threshold_confidence_sets_the_upper_bound_of_the_threshold_over_blocks_of_a_window(plant):
    """`model.threshold_confidence`: the detector's threshold is alarms.py's upper bound of the estimate,
    with blocks of one window, above the estimate itself."""
    train, val = plant.iloc[:800], plant.iloc[800:]
    detector = fit_detector(train, val, CHANNELS, method="masked", seed=0, **TINY)
    estimate = float(detector.threshold)
    detector.hparams.threshold_confidence = 0.9
    detector.calibrate(val)
    bound = calibrate_threshold(detector.val_scores, 0.001, confidence=0.9, block=detector.window)
    assert float(detector.threshold) == pytest.approx(bound) and bound > estimate


def test_labels_and_settings_refused():
    with pytest.raises(ValueError, match="anomaly.method='nope'"):
        fit_detector(pd.DataFrame({"a": [1.0] * 40}), None, ["a"], method="nope")
    with pytest.raises(ValueError, match="unknown setting"):
        fit_detector(pd.DataFrame({"a": [1.0] * 40}), None, ["a"], colour="red")


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"false_alarm_rate": 2}, "false_alarm_rate=2: a share of normal rows"),
        ({"events": {"k": 3}}, "events: k=3 of n=1 needs 1 <= k <= n"),
        ({"events": {"colour": 1}}, "events: "),
        ({"monitor": "val/mse"}, "monitor='val/mse'"),
        ({"threshold_confidence": 1.5}, "threshold_confidence=1.5: a probability in (0, 1)"),
        ({"head": {"kind": "quantile"}}, "head=quantile: the forecast detector's head is Gaussian"),
    ],
)
def test_a_detector_refuses_bad_alarm_settings_when_built(setting, message):
    sizes = {"net": {"d_model": 8, "n_heads": 2, "n_layers": 1}, "d_target": 2, "d_known": 0, "d_observed": 0}
    task = ForecastAnomalyDetector if "head" in setting else MaskedAnomalyDetector
    window = {"context_len": 8, "horizon": 1 if task is ForecastAnomalyDetector else 0}
    with pytest.raises(ValueError) as err:
        task(**sizes, **window, **setting)
    assert str(err.value).startswith(message), str(err.value)
