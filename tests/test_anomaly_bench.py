"""benchmarks/anomaly.py: the detector is trained by `train.fit_task` on the composed configs, on train
rows only and without labels, and scored beside the peers; the tables go between their markers in the
results file. A stand-in for the training and a tiny SKAB-shaped folder: no real data, no training."""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pandas as pd
import pytest
from anomaly_datasets import SKAB_CHANNELS, SKAB_FOLDERS, SKAB_TRAIN_ROWS

from conftest import REPO
from tsformer.jobs.anomaly.baselines import HotellingT2, baselines


def skab_folder(root, rows: int = 520) -> None:
    """One SKAB-shaped run per folder: 8 periodic sensors, a shift in the last 60 rows, labelled."""
    rng = np.random.default_rng(0)
    t = np.arange(rows)
    for folder in SKAB_FOLDERS:
        (root / "SKAB" / folder).mkdir(parents=True)
        values = np.sin(2 * np.pi * t / 10)[:, None] + 0.1 * rng.normal(size=(rows, len(SKAB_CHANNELS)))
        values[-60:, 3] += 3.0
        frame = pd.DataFrame(values, columns=SKAB_CHANNELS)
        frame.insert(0, "datetime", pd.date_range("2020-03-09", periods=rows, freq="s").astype(str))
        frame["anomaly"] = (t >= rows - 60).astype(float)
        frame["changepoint"] = 0.0
        frame.to_csv(root / "SKAB" / folder / "0.csv", sep=";", index=False)


def benchmark_with_hotelling_detector(monkeypatch, before_fit):
    """benchmarks/anomaly.py, its detector's training (`train.fit_task`) replaced by Hotelling's T2 fitted
    on the train rows; `before_fit(cfg, source)` is called first (it may raise: a refused series)."""

    def fit_task(cfg, source=None):
        before_fit(cfg, source)
        channels = list(cfg.data.target_cols)
        model = HotellingT2().fit(source[channels].to_numpy()[: cfg.data.train_end])
        return types.SimpleNamespace(
            task=types.SimpleNamespace(score=lambda t: model.score(t[channels].to_numpy()))
        )

    import tsformer.train

    monkeypatch.setattr(tsformer.train, "fit_task", fit_task)
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    return importlib.import_module("anomaly")


def test_the_detector_trains_as_train_py_does_on_train_rows_without_labels(tmp_path, monkeypatch):
    """The benchmark trains the job's task with `train.fit_task` on the composed configs
    (experiment=anomaly_benchmark, the method's model, the seed, --set overrides), the run's table
    without its labels and its train rows as the normal rows; it is scored beside the peers."""
    skab_folder(tmp_path)
    calls = []
    anomaly = benchmark_with_hotelling_detector(
        monkeypatch, lambda cfg, source: calls.append({"cfg": cfg, "source": source})
    )
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "notes before\n<!-- table skab-forecast -->\nold\n<!-- /table skab-forecast -->\nnotes after\n"
    )
    argv = ["anomaly.py", "--data", str(tmp_path), "--datasets", "skab", "--files", "1", "--seeds", "7"]
    monkeypatch.setattr(
        sys,
        "argv",
        [*argv, "--method", "forecast", "--set", "model.score_window=8", "--results", str(results)],
    )
    anomaly.main()

    (call,) = calls
    cfg = call["cfg"]
    assert (
        cfg.seed == 7
        and cfg.model._target_.endswith("ForecastAnomalyDetector")
        and cfg.model.score_window == 8
    )
    assert (
        cfg.data.train_end == SKAB_TRAIN_ROWS and cfg.data.val_fraction == 0.2 and cfg.data.label_col is None
    )
    assert list(cfg.data.target_cols) == SKAB_CHANNELS == list(call["source"].columns)  # no label column
    assert cfg.trainer.max_steps > 0 and "mlflow" not in str(cfg.get("logger"))  # no MLflow run
    text = results.read_text()
    assert text.startswith("notes before\n<!-- table skab-forecast -->\n### skab, method forecast")
    assert text.endswith("<!-- /table skab-forecast -->\nnotes after\n") and "\nold\n" not in text
    for method in ("ours (forecast)", *(b.name for b in baselines()), "kmeans_ad"):
        assert f"| {method} | " in text


def test_rows_of_two_runs_merge_into_one_table_of_both_seeds(tmp_path, monkeypatch):
    skab_folder(tmp_path)
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    anomaly = importlib.import_module("anomaly")
    results, rows = tmp_path / "RESULTS.md", tmp_path / "rows"
    argv = ["anomaly.py", "--data", str(tmp_path), "--datasets", "skab", "--files", "1", "--method", "none"]
    for seeds in (["--seeds", "7", "--rows", str(rows)], ["--seeds", "8", "--merge", str(rows)]):
        monkeypatch.setattr(sys, "argv", [*argv, *seeds, "--results", str(results)])
        anomaly.main()
    text = results.read_text()
    assert "seeds 7 8," in text and "| random | " in text
    random_row = next(line for line in text.splitlines() if line.startswith("| random | "))
    assert " ± " in random_row  # the sd over the two runs' seeds
    monkeypatch.setattr(
        sys,
        "argv",
        [*argv, "--seeds", "--merge", str(rows), "--false-alarm-rate", "0.05", "--results", str(results)],
    )
    with pytest.raises(SystemExit, match="false_alarm_rate=0.01"):  # another configuration is refused
        anomaly.main()


def test_a_series_a_method_refuses_is_counted_as_refused_and_the_next_is_scored(tmp_path, monkeypatch):
    skab_folder(tmp_path)
    calls = []

    def refuse_the_first_file(cfg, source):
        calls.append(cfg)
        if len(calls) == 1:
            raise ValueError("score=restoration: every channel is a state channel")

    anomaly = benchmark_with_hotelling_detector(monkeypatch, refuse_the_first_file)
    results, rows = tmp_path / "RESULTS.md", tmp_path / "rows"
    argv = ["anomaly.py", "--data", str(tmp_path), "--datasets", "skab", "--files", "2", "--seeds", "0"]
    monkeypatch.setattr(
        sys, "argv", [*argv, "--method", "masked", "--rows", str(rows), "--results", str(results)]
    )
    anomaly.main()
    assert len(calls) == 2  # the second file was scored after the first was refused
    measured = pd.read_csv(tmp_path / "rows-skab.csv")
    ours = measured[measured["method"] == "ours (masked)"].set_index("file")
    assert ours["refused"].fillna("").str.startswith("score=restoration").tolist() == [True, False]
    assert np.isnan(ours["vus_pr"].iloc[0]) and np.isfinite(ours["vus_pr"].iloc[1])
    text = results.read_text()
    head = next(line for line in text.splitlines() if line.startswith("| method |"))
    ours_row = next(line for line in text.splitlines() if line.startswith("| ours (masked) | "))
    cells = [c.strip() for c in ours_row.strip("|").split("|")]
    header = [c.strip() for c in head.strip("|").split("|")]
    assert cells[header.index("refused")] == "1"
    assert any(line.startswith("| ") and "| refused |" in line for line in text.splitlines())
