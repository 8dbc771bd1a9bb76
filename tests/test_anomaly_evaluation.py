"""Anomaly evaluation: TSB-AD's metrics as TSB-AD computes them, the alarm metrics, the data loaders."""

from __future__ import annotations

from pathlib import Path

import anomaly_datasets as datasets
import numpy as np
import pandas as pd
import pytest

from tsformer.data.schema import DataValidationError
from tsformer.jobs.anomaly.baselines import HotellingT2
from tsformer.jobs.anomaly.evaluation import alarm_metrics, anomaly_segments, evaluate, sliding_window

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "anomaly"
MSL_FILE = DATA / "MSL" / "016_MSL_id_15_Sensor_tr_500_1st_780.csv"  # the shortest of the 14
SKAB_FILE = DATA / "SKAB" / "valve1" / "0.csv"


@pytest.mark.needs_data(MSL_FILE)
def test_metrics_equal_tsb_ads_own_get_metrics_on_an_msl_file():
    from sklearn.preprocessing import MinMaxScaler
    from TSB_AD.evaluation.metrics import get_metrics
    from TSB_AD.utils.slidingWindows import find_length_rank

    run = datasets.tsb_ad_file(MSL_FILE)
    assert (
        run.train_end == 500 and run.score_start == 0 and run.label[780] == 1 and run.label[:780].sum() == 0
    )
    x = run.table.to_numpy()
    score = HotellingT2().fit(x[: run.train_end]).score(x).score  # real scores on every row
    ours = evaluate(score, run.label, x[:, 0])

    # as TSB-AD's benchmark script for multivariate series does
    window = find_length_rank(x[:, 0].reshape(-1, 1), rank=1)
    scaled = MinMaxScaler(feature_range=(0, 1)).fit_transform(score.reshape(-1, 1)).ravel()
    theirs = get_metrics(scaled, run.label, slidingWindow=window)
    assert ours["sliding_window"] == window
    for key, their_key in [
        ("vus_pr", "VUS-PR"),
        ("vus_roc", "VUS-ROC"),
        ("auc_pr", "AUC-PR"),
        ("auc_roc", "AUC-ROC"),
    ]:
        assert ours[key] == pytest.approx(theirs[their_key], abs=1e-6), key


def test_sliding_window_is_the_first_channels_period():
    t = np.arange(2000)
    assert sliding_window(np.sin(2 * np.pi * t / 50)) == 50
    assert sliding_window(np.sin(2 * np.pi * t / 80) + 0.01 * np.cos(t)) == 80


def test_a_score_that_ranks_anomalies_first_beats_noise_and_its_reverse():
    rng = np.random.default_rng(0)
    x = np.sin(2 * np.pi * np.arange(1000) / 40)
    label = np.zeros(1000, dtype=int)
    label[300:320] = label[700:730] = 1
    perfect = label + 0.01 * rng.uniform(size=1000)
    good, noise, reverse = (
        evaluate(perfect, label, x),
        evaluate(rng.uniform(size=1000), label, x),
        evaluate(-perfect, label, x),
    )
    assert good["auc_roc"] == 1.0 and good["auc_pr"] == pytest.approx(1.0)
    assert reverse["auc_roc"] == 0.0
    assert good["vus_pr"] > 0.8 and 0.2 > noise["vus_pr"] > reverse["vus_pr"]
    assert good["vus_roc"] > 0.9 and "f1" not in good  # no threshold, no alarm metrics


def test_alarm_metrics_count_rows_events_and_false_alarms():
    label = np.array([0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0])
    alarm = np.array([0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1], dtype=bool)
    assert anomaly_segments(label) == [(2, 4), (7, 10)]
    m = alarm_metrics(alarm, label)
    assert m["precision"] == pytest.approx(1 / 3) and m["recall"] == pytest.approx(1 / 5)
    assert m["f1"] == pytest.approx(2 * (1 / 3) * (1 / 5) / (1 / 3 + 1 / 5))
    assert m["event_recall"] == 0.5  # the first segment has an alarm, the second none
    assert m["false_alarms_per_1000"] == pytest.approx(1000 * 2 / 7)


def test_evaluate_alarms_strictly_above_the_threshold():
    x = np.sin(np.arange(300) / 5.0)
    label = np.zeros(300, dtype=int)
    label[100:110] = 1
    score = label.astype(float) * 2.0
    score[200] = 1.0  # a normal row exactly at the threshold: no alarm
    m = evaluate(score, label, x, threshold=1.0)
    assert m["threshold"] == 1.0 and m["f1"] == 1.0 and m["event_recall"] == 1.0
    assert m["false_alarms_per_1000"] == 0.0
    assert evaluate(score, label, x, threshold=0.5)["false_alarms_per_1000"] == pytest.approx(1000 / 290)


@pytest.mark.parametrize(
    "score, label, match",
    [
        (np.r_[np.zeros(9), np.nan], np.r_[np.zeros(9), 1], "not finite at row 9"),
        (np.zeros(10), np.r_[np.zeros(8), 1, 2], "row 9 is 2"),
        (np.zeros(10), np.zeros(10), "every label is 0"),
        (np.zeros(10), np.r_[np.zeros(10), 1], "one length"),
    ],
)
def test_bad_input_is_one_line_naming_the_row(score, label, match):
    with pytest.raises(ValueError, match=match):
        evaluate(score, label, np.zeros(len(score)))


def test_a_tsb_ad_file_trains_on_the_prefix_its_name_gives(tmp_path):
    path = tmp_path / "001_X_id_1_Sensor_tr_30_1st_40.csv"
    frame = pd.DataFrame({"0": np.arange(50.0), "1": 1.0, "Label": (np.arange(50) >= 40).astype(int)})
    frame.to_csv(path, index=False)
    run = datasets.tsb_ad_file(path)
    assert run.channels == ["0", "1"] and run.train_end == 30 and run.score_start == 0
    assert len(run.train) == 30 and len(run.scored) == 50 and run.scored_label.sum() == 10

    frame.loc[45, "Label"] = 2
    frame.to_csv(path, index=False)
    with pytest.raises(
        DataValidationError, match=r"column 'Label', row 45 \(line 47\): label 2 is not 0 or 1"
    ):
        datasets.tsb_ad_file(path)
    frame.loc[45, "Label"] = 1
    frame.loc[7, "1"] = np.nan
    frame.to_csv(path, index=False)
    with pytest.raises(DataValidationError, match=r"column '1', row 7 \(line 9\)"):
        datasets.tsb_ad_file(path)
    frame.drop(columns="Label").to_csv(path, index=False)
    with pytest.raises(DataValidationError, match="no column 'Label'"):
        datasets.tsb_ad_file(path)


@pytest.mark.needs_data(SKAB_FILE)
def test_a_skab_run_trains_on_its_first_400_rows_and_scores_the_rest():
    run = datasets.skab_file(SKAB_FILE)
    assert run.channels == datasets.SKAB_CHANNELS
    assert run.train_end == run.score_start == 400 and len(run.scored) == len(run.table) - 400
    assert set(np.unique(run.label)) == {0, 1} and run.label[:400].sum() == 0


@pytest.mark.needs_data(DATA / "pool" / "SOURCE.md")
def test_the_tuning_pool_reads_its_8_labelled_series_each_with_its_train_prefix():
    runs = datasets.pool(DATA)
    assert len(runs) == 8 and "pool" in datasets.TUNING
    for run in runs:
        first = int(datasets.TSB_NAME.search(run.name).group(2))
        assert run.score_start == 0 and run.train_end >= 500 and run.label[first] == 1
        assert run.label[:first].sum() == 0 and len(run.channels) in (9, 18, 55)
