"""What `mlflow ui` shows of a run, read through MLflow's client API (the pages themselves are looked at
with `tools/look_at_runs.py`).

One tiny run, registered under a name: its pyfunc model is the run's MLflow 3 "logged model" (the
run page's "Logged models", the experiment's Models tab), `runs:/<id>/model` and the registered
version still load it, `predict.py <run id>` still finds it, and the experiment is marked as one of
model training (`mlflow.experimentKind`), not a GenAI app.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from conftest import TINY
from tsformer import predict
from tsformer.jobs.forecasting.forecaster import Forecaster
from tsformer.serving.references import resolve_model
from tsformer.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG
from tsformer.train import compose_config, run

# every test here trains through train.py (or reads a module fixture that does)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """(run result, client, folder) of one tiny run logged to ./mlflow.db in an empty folder; its
    summary is `summary.txt` there."""
    folder = tmp_path_factory.mktemp("logged")
    old, uri_before = os.getcwd(), os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        os.chdir(folder)
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            result = run(
                compose_config([*TINY, "model_registry.name=tiny-logged", "figures=true"], folder / "out")
            )
        (folder / "summary.txt").write_text(printed.getvalue())
    finally:
        os.chdir(old)
        if uri_before is not None:
            os.environ["MLFLOW_TRACKING_URI"] = uri_before
    return result, MlflowClient(f"sqlite:///{folder}/mlflow.db"), folder


def test_the_pyfunc_model_is_the_runs_logged_model(logged):
    result, client, _ = logged
    run_ = client.get_run(result.run_id)
    outputs = run_.outputs.model_outputs if run_.outputs else []
    assert len(outputs) == 1, "the run has no logged model (the run page says 'Logged models: -')"
    model = client.get_logged_model(outputs[0].model_id)
    assert model.name == "model" and model.source_run_id == result.run_id
    assert model.experiment_id == run_.info.experiment_id
    found = client.search_logged_models([run_.info.experiment_id])  # the experiment's Models tab
    assert [m.model_id for m in found] == [model.model_id]
    (version,) = client.search_model_versions("name='tiny-logged'")
    assert version.source == f"models:/{model.model_id}" and version.run_id == result.run_id


def test_runs_uri_registry_uri_and_predict_py_find_the_logged_model(logged, tmp_path, monkeypatch):
    result, client, _ = logged
    # set_tracking_uri also sets $MLFLOW_TRACKING_URI: monkeypatch takes it back after the test
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    mlflow.set_tracking_uri(client.tracking_uri)
    for uri in [f"runs:/{result.run_id}/model", "models:/tiny-logged/1"]:
        pyfunc = mlflow.pyfunc.load_model(uri)
        # the layout of a table (the input example) and the forecaster's options (params), shown in the UI
        assert pyfunc.metadata.saved_input_example_info is not None, uri
        assert [p.name for p in pyfunc.metadata.get_params_schema().params] == ["origin", "time_format"], uri
    # what `predict.py <run id>` fetches: the run's model folder
    model_folder = resolve_model(result.run_id, client.tracking_uri, tmp_path)
    names = sorted(p.name for p in model_folder.iterdir())
    assert names == sorted(p.name for p in result.model_folder.iterdir())


def test_the_experiment_opens_as_model_training(logged):
    result, client, _ = logged
    experiment = client.get_experiment(client.get_run(result.run_id).info.experiment_id)
    assert experiment.tags.get(EXPERIMENT_KIND_TAG) == EXPERIMENT_KIND == "custom_model_development"


@pytest.fixture(scope="module")
def new_table(logged, tmp_path_factory):
    """(path, predict.py's forecasts) of new data as the run's summary says to make it (`a new table for
    it: .../tsformer-data simulate plant ... --future-steps <its horizon>`, run as printed from another
    folder with a bare PATH), forecast by `predict.py <run id>`."""
    result, client, folder = logged
    (line,) = [
        x for x in (folder / "summary.txt").read_text().splitlines() if x.startswith("a new table for it: ")
    ]
    command = shlex.split(line.split(": ", 1)[1])
    horizon = Forecaster.load(result.model_folder).contract.horizon
    assert command[command.index("--future-steps") + 1] == str(horizon)
    elsewhere = tmp_path_factory.mktemp("new")
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(elsewhere)}
    proc = subprocess.run(
        command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = elsewhere / "new.csv"
    out = path.with_name("forecasts.csv")
    args = [result.run_id, str(path), "--output", str(out), "--tracking-uri", client.tracking_uri]
    assert predict.main(args) == 0
    return path, pd.read_csv(out)


def test_the_pyfunc_model_takes_a_table_as_read_csv_gives_it(logged, new_table, monkeypatch):
    """No parse_dates: the times are text, read in the training data's format as predict.py reads them."""
    result, client, _ = logged
    path, expected = new_table
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    mlflow.set_tracking_uri(client.tracking_uri)
    forecasts = mlflow.pyfunc.load_model(f"runs:/{result.run_id}/model").predict(pd.read_csv(path))
    pd.testing.assert_frame_equal(
        forecasts.astype({"origin_time": str, "target_time": str}).reset_index(drop=True),
        expected.astype({"origin_time": str, "target_time": str}),
        check_dtype=False,
        atol=1e-5,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_tsformer_serve_answers_a_real_request_with_valid_json_and_a_bad_one_with_one_line(logged, new_table):
    """`tsformer-serve <run id>` in the training folder, with no virtual environment on PATH: the
    forecasts of predict.py as strict JSON (missing values null), a refused table in one line."""
    result, _, folder = logged
    path, expected = new_table
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": os.environ.get("HOME", "/tmp")}
    # the console script runs `tsformer.serving.server:main` with the environment's interpreter
    command = [sys.executable, "-m", "tsformer.serving.server", result.run_id, "--port", str(port)]
    server = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:  # until the model is loaded and the server answers (or it died, or the time is up)
            assert server.poll() is None, server.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the server did not answer within 120 s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/invocations"
        table = pd.read_csv(path, dtype={"time": str})
        split = json.loads(table.to_json(orient="split", index=False))
        status, text = post(url, json.dumps({"dataframe_split": split}).encode())
        assert status == 200, text
        strict = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
        served = pd.DataFrame(strict["predictions"])
        assert served.y_true.isna().all() and None in [row["y_true"] for row in strict["predictions"]]
        assert np.allclose(served.y_pred, expected.y_pred, atol=1e-5)
        assert (pd.to_datetime(served.target_time) == pd.to_datetime(expected.target_time)).all()

        bad = table.drop(columns="supply_voltage")
        split = json.loads(bad.to_json(orient="split", index=False))
        status, text = post(url, json.dumps({"dataframe_split": split}).encode())
        error = json.loads(text)
        assert status == 400 and error["error_code"] == "BAD_REQUEST", text
        assert (
            "supply_voltage" in error["message"] and "\n" not in error["message"] and "Traceback" not in text
        )
        assert post(url, b"not json")[0] == 400
    finally:
        server.kill()
        server.wait(timeout=30)


def test_the_figures_lie_beside_the_forecasts_csv_as_in_mlflow(logged):
    result, client, _ = logged
    logged_plots = {a.path for a in client.list_artifacts(result.run_id, "plots")}
    assert {"plots/test_windows.png", "plots/error_by_step.png", "plots/attention.png"} <= logged_plots
    beside = {f"plots/{p.name}" for p in (result.csv_path.parent / "plots").glob("*.png")}
    assert beside == logged_plots
