"""benchmarks/anomaly.py: the detector is called with exactly `fit_detector(train, val, channels, *,
method, seed, **settings)`, trained and validated on train rows only, and scored beside the baselines;
the tables go between their markers in the results file. A stand-in detector and a tiny SKAB-shaped
folder: no real data, no training."""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pandas as pd
import pytest
from anomaly_datasets import SKAB_CHANNELS, SKAB_FOLDERS, SKAB_TRAIN_ROWS

from conftest import REPO
from tsformer.jobs.anomaly.baselines import HotellingT2


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


def test_the_detector_trains_on_train_rows_only_and_is_scored_beside_the_baselines(tmp_path, monkeypatch):
    skab_folder(tmp_path)
    calls = []

    def fit_detector(train, val, channels, *, method, seed, **settings):
        calls.append(
            {"train": train.index, "val": val.index, "channels": channels, "method": method, "seed": seed}
            | settings
        )
        model = HotellingT2().fit(train[channels].to_numpy())
        return types.SimpleNamespace(score=lambda table: model.score(table[channels].to_numpy()))

    detector = types.ModuleType("tsformer.jobs.anomaly.detector")
    detector.fit_detector = fit_detector
    monkeypatch.setitem(sys.modules, "tsformer.jobs.anomaly.detector", detector)
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    anomaly = importlib.import_module("anomaly")
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "notes before\n<!-- table skab-forecast -->\nold\n<!-- /table skab-forecast -->\nnotes after\n"
    )
    argv = ["anomaly.py", "--data", str(tmp_path), "--datasets", "skab", "--files", "1", "--seeds", "7"]
    monkeypatch.setattr(
        sys, "argv", [*argv, "--method", "forecast", "--setting", "window=16", "--results", str(results)]
    )
    anomaly.main()

    assert [(c["method"], c["seed"], c["window"]) for c in calls] == [("forecast", 7, 16)]
    for call in calls:  # the first 80 % of the train rows fit, the last 20 % validate; no scored row
        assert list(call["train"]) == list(range(320)) and list(call["val"]) == list(
            range(320, SKAB_TRAIN_ROWS)
        )
        assert call["channels"] == SKAB_CHANNELS
    text = results.read_text()
    assert text.startswith("notes before\n<!-- table skab-forecast -->\n### skab, method forecast")
    assert text.endswith("<!-- /table skab-forecast -->\nnotes after\n") and "\nold\n" not in text
    for method in ("ours (forecast)", "hotelling_t2", "pca_residual", "isolation_forest", "random"):
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
