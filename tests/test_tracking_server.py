"""A real tracking server: `mlflow server` (sqlite backend store, artifacts proxied to a local folder)
started as a subprocess; a run logs to it over HTTP and is read back through the client. A server
that does not answer stops a run, and `predict.py` fetching a model, at once, with a message naming
the URI and the setting; `predict.py` with a run id and no tracking database creates none."""

from __future__ import annotations

import filecmp
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from mlflow import MlflowClient

from conftest import REPO, TINY
from contract import stop_process_group
from tsformer import predict
from tsformer.data import simulate_plant
from tsformer.tracking import TrackingServerUnreachable
from tsformer.train import compose_config, run

SERVER_START_S = 180  # the server's start, on a shared 2-core machine: a hang guard, not a benchmark


def free_port() -> int:
    """A port nothing listens on (the OS picks it; it is released at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_healthy(uri: str, server: subprocess.Popen, log_path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow server exited with {server.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(
        f"mlflow server did not answer {uri}/health within {SERVER_START_S} s:\n{log_path.read_text()[-3000:]}"
    )


@pytest.fixture
def tracking_server(tmp_path):
    """`mlflow server` on 127.0.0.1:<free port>; yields (URI, its artifacts folder); stopped at the end."""
    folder = tmp_path / "server"
    folder.mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
        "--default-artifact-root", "mlflow-artifacts:/",  # artifacts go through the server...
        "--artifacts-destination", str(folder / "artifacts"),  # ...which stores them here
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    # without the server's job runner (GenAI jobs: seven more processes, nothing this project uses)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    log_path = folder / "server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_until_healthy(uri, server, log_path)
        yield uri, folder / "artifacts"
    finally:
        stop_process_group(server)  # the CLI and the uvicorn worker it started


@pytest.mark.slow
def test_run_logs_to_a_tracking_server(tracking_server, in_tmp):
    uri, artifacts = tracking_server
    result = run(compose_config([*TINY, f"logger.mlflow.tracking_uri={uri}", "figures=true"], in_tmp / "out"))

    client = MlflowClient(uri)
    run_ = client.get_run(result.run_id)
    assert run_.info.status == "FINISHED"
    assert run_.info.artifact_uri.startswith("mlflow-artifacts:/")  # stored by the server, not by us
    for name, value in result.metrics.items():
        assert run_.data.metrics[name] == pytest.approx(value), name
    assert "val/mse" in run_.data.metrics and len(client.get_metric_history(result.run_id, "train/loss")) >= 1
    assert run_.data.params["model/net/d_model"] == "16"

    folders = ("", "forecasts", "checkpoints", "plots")
    listed = {a.path for folder in folders for a in client.list_artifacts(result.run_id, folder)}
    for path in ["forecasts/forecasts.csv", "checkpoints/best.ckpt", "plots/test_windows.png"]:
        assert path in listed, (path, listed)
    (model_output,) = run_.outputs.model_outputs  # the run's logged pyfunc model, its files on the server
    assert "MLmodel" in {a.path for a in client.list_logged_model_artifacts(model_output.model_id)}
    downloaded = client.download_artifacts(result.run_id, "forecasts/forecasts.csv", str(in_tmp / "download"))
    assert filecmp.cmp(downloaded, result.csv_path, shallow=False)  # the CSV, byte for byte, via the server
    stored = list(artifacts.rglob("forecasts.csv"))
    assert len(stored) == 1 and result.run_id in str(stored[0])  # in the server's artifact folder
    assert not (in_tmp / "mlflow.db").exists() and not (in_tmp / "mlruns").exists()  # nothing logged locally


def test_unreachable_server_stops_the_run_at_once(in_tmp, monkeypatch):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg = compose_config([*TINY, f"logger.mlflow.tracking_uri={uri}"], in_tmp / "out")

    def built_first(*args, **kwargs):
        raise AssertionError("data or model built before the tracking server was checked")

    monkeypatch.setattr("tsformer.train.instantiate", built_first)
    start = time.perf_counter()
    with pytest.raises(TrackingServerUnreachable) as err:
        run(cfg)
    assert time.perf_counter() - start < 60  # a hang guard: MLflow's default retries take minutes
    message = str(err.value)
    assert uri in message and "logger.mlflow.tracking_uri" in message and "MLFLOW_TRACKING_URI" in message


@pytest.mark.slow
def test_unreachable_server_stops_a_sweep_before_its_first_trial(in_tmp):
    """From the command line, the URI given by $MLFLOW_TRACKING_URI, in a sweep: Hydra turns a
    callback's exception into a warning and goes on, and the sweep must stop all the same."""
    uri = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(REPO / "src")}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "-m", "model=enc_only,dec_only", *TINY, f"hydra.sweep.dir={in_tmp / 'sweep'}"],
        cwd=in_tmp, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert time.perf_counter() - start < 120  # a hang guard (includes the imports of a fresh process)
    assert proc.returncode == 1
    output = proc.stdout + proc.stderr
    assert (
        f"cannot use the MLflow tracking server at {uri}" in output and "logger.mlflow.tracking_uri" in output
    )
    assert "Launching" not in output  # no trial started
    assert not list((in_tmp / "sweep").glob("*/train.log"))


PREDICT_FAILS_WITHIN_S = 15  # the bound; MLflow's default retries took minutes


@pytest.fixture
def new_table(in_tmp) -> str:
    simulate_plant(n_series=1, n_steps=20, freq="1min", seed=0).to_csv(in_tmp / "new.csv", index=False)
    return "new.csv"


@pytest.mark.parametrize("given_by", ["--tracking-uri", "$MLFLOW_TRACKING_URI"])
def test_predict_stops_at_once_for_an_unreachable_server(given_by, new_table, in_tmp, monkeypatch, capsys):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    args = ["0123456789abcdef0123456789abcdef", new_table, "--output", "out.csv"]
    if given_by == "--tracking-uri":
        args += ["--tracking-uri", uri]
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    start = time.perf_counter()
    assert predict.main(args) == 2
    assert time.perf_counter() - start < PREDICT_FAILS_WITHIN_S
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot use the MLflow tracking server at {uri}") and err.count("\n") == 1
    assert f"The URI comes from {given_by}" in err and "give the model folder instead" in err
    assert sorted(p.name for p in in_tmp.iterdir()) == [new_table]  # no mlflow.db, no forecasts


def test_predict_gives_up_on_a_server_that_never_answers(new_table, in_tmp, monkeypatch, capsys):
    """A port that takes the connection and never answers: the check's own timeout, not MLflow's
    (120 s a request, retried)."""
    monkeypatch.setattr("tsformer.tracking.REACHABLE_TIMEOUT_S", 1)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel accepts connections; nothing reads or answers them
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.perf_counter()
        args = ["0123456789abcdef0123456789abcdef", new_table, "--output", "out.csv", "--tracking-uri", uri]
        code = predict.main(args)
        elapsed = time.perf_counter() - start
    assert code == 2 and elapsed < PREDICT_FAILS_WITHIN_S
    err = capsys.readouterr().err
    assert f"cannot use the MLflow tracking server at {uri}" in err and "timed out" in err


def test_predict_with_a_run_id_and_no_database_creates_none(new_table, in_tmp, capsys):
    assert predict.main(["0123456789abcdef0123456789abcdef", new_table, "--output", "out.csv"]) == 2
    err = capsys.readouterr().err
    database = in_tmp / "mlflow.db"
    assert err.startswith("error: no MLflow tracking database here") and err.count("\n") == 1
    assert f"sqlite:///{database}" in err and "--tracking-uri" in err
    assert not database.exists()
