"""Runs started at once in one folder share one new `mlflow.db`: MLflow creates its tables at the first
opening, and processes opening it together race through the schema migrations (with the lock of
`tracking.prepare_sqlite_store` taken out, this test fails: "table alembic_version already exists";
four bare MLflow clients opening one new database at once all failed here)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from mlflow import MlflowClient

from conftest import REPO

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
