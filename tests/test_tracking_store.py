"""Runs started at once in one folder share one new `mlflow.db`: MLflow creates its tables at the first
opening, and processes opening it together race through the schema migrations (with the lock of
`tracking.prepare_sqlite_store` taken out, this test fails: "table alembic_version already exists";
four bare MLflow clients opening one new database at once all failed here)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import pytest
from mlflow import MlflowClient
from omegaconf import DictConfig

from conftest import REPO, TINY
from tsformer import tracking
from tsformer.train import compose_config, run

N_PROCESSES = 4

# Each process imports first (seconds), then waits for the others, so that all open the database together.
OPEN_AND_LOG = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from mlflow import MlflowClient
    from tsformer.tracking import prepare_sqlite_store

    uri, folder, me, n = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    (folder / f"ready-{me}").touch()
    while len(list(folder.glob("ready-*"))) < n:
        time.sleep(0.01)
    prepare_sqlite_store(uri, "together")
    client = MlflowClient(uri)
    run = client.create_run(client.get_experiment_by_name("together").experiment_id, run_name=f"run-{me}")
    client.log_metric(run.info.run_id, "x", float(me))
    """
)


@pytest.mark.slow  # 4 fresh Python processes importing MLflow
def test_processes_creating_one_new_database_at_once_all_log(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # absolute: sqlite:////tmp/...
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AND_LOG, uri, str(barrier), str(i), str(N_PROCESSES)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i in range(N_PROCESSES)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    client = MlflowClient(uri)
    experiments = [e for e in client.search_experiments() if e.name == "together"]
    assert len(experiments) == 1
    runs = client.search_runs([experiments[0].experiment_id])
    assert sorted(r.data.metrics["x"] for r in runs) == [float(i) for i in range(N_PROCESSES)]


@pytest.mark.slow
def test_a_runs_config_visits_tracking_twice(in_tmp, monkeypatch):
    """tracking.py is handed the run's config twice (the server check, the logger's store); the run
    records it from plain values. Every function of the module is wrapped and its calls counted."""
    cfg = compose_config([*TINY, "model=enc_dec"], in_tmp / "out")
    visits, depth = [], [0]

    def counted(name, function):
        def wrapper(*args, **kwargs):
            whole = any(isinstance(a, DictConfig) and "model" in a for a in [*args, *kwargs.values()])
            if whole and depth[0] == 0:  # a call from outside the module (not one tracking makes itself)
                visits.append(name)
            depth[0] += 1
            try:
                return function(*args, **kwargs)
            finally:
                depth[0] -= 1

        return wrapper

    for name, function in inspect.getmembers(tracking, inspect.isfunction):
        if function.__module__ == tracking.__name__:
            monkeypatch.setattr(tracking, name, counted(name, function))
    run(cfg)
    assert visits == ["require_reachable_servers", "mlflow_logger_entry"]


def test_a_new_experiment_keeps_its_files_beside_its_database_whatever_the_folder(tmp_path, monkeypatch):
    """MLflow's default artifact root is `./mlruns` of the current folder: a database given by its path
    would get its runs' files and models wherever a run started (the checkout, for the tests)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    (tmp_path / "store").mkdir()
    tracking.prepare_sqlite_store(uri, "beside")
    experiment = MlflowClient(uri).get_experiment_by_name("beside")
    assert experiment.artifact_location == str(tmp_path / "store" / "mlruns" / experiment.experiment_id)


def test_a_mapping_keyed_by_column_names_mlflow_refuses_is_logged_as_one_param(tmp_path):
    """`data.units={LV ActivePower \\(kW\\): kW}` flattened would be the param `data/units/LV ActivePower
    (kW)`, a name MLflow refuses (the run failed as it opened)."""
    config = {"data": {"units": {"LV ActivePower (kW)": "kW"}, "csv": {"sep": ";"}}, "seed": 0}
    safe = tracking.param_safe(config)
    assert safe == {"data": {"units": '{"LV ActivePower (kW)": "kW"}', "csv": {"sep": ";"}}, "seed": 0}
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.create_run(client.create_experiment("params"))
    client.log_param(run.info.run_id, "data/units", safe["data"]["units"])  # accepted
    with pytest.raises(Exception, match="Invalid value"):
        client.log_param(run.info.run_id, "data/units/LV ActivePower (kW)", "kW")
