"""The anomaly job end to end on tiny settings: `train.py experiment=plant_anomaly` writes the per-row and
events tables, the model folder and the MLflow run (figures, pyfunc model); `predict.py` scores a new
table with the model folder and names what is wrong with a bad one."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from tsformer.anomaly.job import AnomalyModel, split_at
from tsformer.anomaly.plant import CHANNELS, simulate_plant_anomaly
from tsformer.tracking import tracking_uri_for
from tsformer.train import compose_config, run

pytestmark = pytest.mark.slow

TINY_ANOMALY = [
    "experiment=plant_anomaly",
    "data.source.n_steps=1400",
    "data.source.test_fraction=0.5",
    "data.train_end=0.5",
    "anomaly.settings.context_len=16",
    "anomaly.settings.d_model=16",
    "anomaly.settings.n_heads=2",
    "anomaly.settings.n_layers=1",
    "anomaly.settings.steps=20",
    "anomaly.settings.batch_size=16",
    "anomaly.false_alarm_rate=0.01",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("anomaly")
    old = os.getcwd()
    try:
        os.chdir(folder)  # mlflow.db and its artifacts land here
        return run(compose_config(TINY_ANOMALY, folder / "out")), folder
    finally:
        os.chdir(old)


def test_run_writes_rows_events_model_and_mlflow_run(trained):
    result, folder = trained
    rows = pd.read_csv(folder / "out" / "anomalies.csv")
    assert list(rows.columns[:6]) == ["series_id", "time", "score", "threshold", "alarm", "event_id"]
    assert {"top_channel_1", "label"} <= set(rows.columns)
    assert len(rows) == 4 * 700  # every judged row: the last half of each of the 4 series
    assert set(rows["top_channel_1"]) <= set(CHANNELS)
    events = pd.read_csv(folder / "out" / "events.csv")
    assert list(events.columns) == ["event_id", "series_id", "start", "end", "n_rows", "peak_score", "peak_time",
                                    "top_channels"]  # fmt: skip
    assert set(events["event_id"]) == set(rows["event_id"].dropna().astype(int))
    assert {"event_recall", "false_alarms_per_1000", "val_loss"} <= set(result.metrics)
    # the model folder scores the judged rows as the run did
    table = simulate_plant_anomaly(n_steps=1400, test_fraction=0.5)
    _, judged = split_at(table, 0.5, "time")
    again = AnomalyModel.load(result.model_folder).judge(judged)[0]
    np.testing.assert_allclose(again["score"], rows["score"], rtol=1e-6)
    assert (again["event_id"].fillna(-1).to_numpy() == rows["event_id"].fillna(-1).to_numpy()).all()

    import mlflow

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with tracking_uri_for(uri):  # a `runs:/` URI is looked up in the process's tracking URI
        artifacts = {a.path for a in mlflow.MlflowClient(uri).list_artifacts(result.run_id, "plots")}
        model = mlflow.pyfunc.load_model(f"runs:/{result.run_id}/model")
    assert artifacts == {"plots/anomaly_scores.png", "plots/anomaly_contributions.png"}
    table = simulate_plant_anomaly(n_steps=1400, test_fraction=0.5).head(300)
    np.testing.assert_allclose(
        model.predict(table)["score"], AnomalyModel.load(result.model_folder).judge(table)[0]["score"]
    )


def predict(model, data, output, cwd):
    return subprocess.run(
        [sys.executable, str(REPO / "predict.py"), str(model), str(data), "--output", str(output)],
        check=False, capture_output=True, text=True, cwd=cwd, env=os.environ | {"OMP_NUM_THREADS": "1"},
    )  # fmt: skip


def test_predict_py_scores_a_table_and_names_bad_input(trained, tmp_path):
    result, _ = trained
    table = simulate_plant_anomaly(n_steps=1400, test_fraction=0.5)
    table.to_csv(tmp_path / "new.csv", index=False)
    done = predict(result.model_folder, tmp_path / "new.csv", tmp_path / "scored.csv", tmp_path)
    assert done.returncode == 0, done.stderr
    scored = pd.read_csv(tmp_path / "scored.csv")
    expected = AnomalyModel.load(result.model_folder).judge(table)[0]
    np.testing.assert_allclose(scored["score"], expected["score"], rtol=1e-6)
    assert (tmp_path / "scored_events.csv").is_file()

    holed = table.copy()
    holed.loc[11, "dynamic_pressure"] = np.nan
    labels = table.copy()
    labels.loc[3, "label"] = 7
    cases = {
        "missing": (table.drop(columns="supply_voltage"), "column 'supply_voltage' is missing"),
        "short": (table.head(10), "has 10 rows, fewer than one window (anomaly.context_len=16)"),
        "empty": (holed, "column 'dynamic_pressure', row 11 (counted from 0): empty"),
        "labels": (labels, "column 'label' (data.label_col), row 3 (counted from 0): 7; labels must be 0"),
    }
    for name, (bad, message) in cases.items():
        bad.to_csv(tmp_path / f"{name}.csv", index=False)
        done = predict(result.model_folder, tmp_path / f"{name}.csv", tmp_path / f"{name}_out.csv", tmp_path)
        assert done.returncode == 2, (name, done.stderr)
        assert done.stderr.strip().splitlines()[-1] == f"error: {message}" or message in done.stderr, name
        assert not (tmp_path / f"{name}_out.csv").exists()
