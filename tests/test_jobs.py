"""The contract every registered job keeps (`tsformer.jobs.JOBS`), run over the registry: a tiny run
trains, writes its outputs and model folder and names and tags its MLflow run after the job; the
predict.py command its summary prints runs as printed from another folder with a bare PATH and gives
what the run's own model folder gave; the logged model loads; a bad optimisation setting or an unknown
setting is one `model.<key>` line before any MLflow run exists. A job registered without an entry in
`RUNS` fails here."""

from __future__ import annotations

import contextlib
import io
import shlex
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from conftest import TINY, TINY_ANOMALY, plant_csv_overrides
from tsformer.data import simulate_plant
from tsformer.jobs import JOBS, job_of_folder, load_model
from tsformer.jobs.imputation.job import impute
from tsformer.serving.references import resolve_model
from tsformer.settings import SettingError
from tsformer.tracking import tracking_uri_for
from tsformer.train import compose_config, run

pytestmark = pytest.mark.slow  # each job trains once

TINY_REGIME = [o for o in TINY if not o.startswith("data.source")] + [
    "data.source.n_series=8",
    "data.source.n_steps=600",
]


def plant_csv(folder: Path) -> Path:
    path = folder / "plant.csv"
    simulate_plant(n_series=2, n_steps=800, freq="1min", seed=0).to_csv(path, index=False)
    return path


# job -> (the overrides of a tiny run, given the folder it runs in)
RUNS = {
    "forecasting": lambda f: [*plant_csv_overrides(plant_csv(f)), "model=enc_dec"],
    "reconstruction": lambda f: [
        *plant_csv_overrides(plant_csv(f)),
        "model=enc_only",
        "model.context_len=30",
    ],
    "imputation": lambda f: [
        *plant_csv_overrides(plant_csv(f)),
        "model=enc_only_masked",
        "model.context_len=30",
    ],
    "classification": lambda f: ["experiment=plant_regime", *TINY_REGIME],
    "pretraining": lambda f: [
        "experiment=plant_regime",
        "pretrain=masked",
        *TINY_REGIME,
        "trainer.max_steps=3",
    ],
    "anomaly": lambda f: TINY_ANOMALY,
}


@pytest.fixture(scope="module", params=list(JOBS))
def trained(request, tmp_path_factory):
    """(job, run result, printed summary, folder, tracking URI) of one tiny run of each registered job."""
    name = request.param
    folder = tmp_path_factory.mktemp(name)
    uri = f"sqlite:///{folder}/mlflow.db"
    with pytest.MonkeyPatch.context() as mp:  # MLflow's artifacts go to ./mlruns: the run's folder
        mp.chdir(folder)
        cfg = compose_config([*RUNS[name](folder), f"logger.mlflow.tracking_uri={uri}"], folder / "out")
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            result = run(cfg)
        summary = printed.getvalue()
    return JOBS[name], result, summary, folder, uri


def test_the_run_is_named_and_tagged_after_its_job_and_writes_its_model_folder(trained):
    job, result, summary, _, uri = trained
    client = MlflowClient(uri)
    the_run = client.get_run(result.run_id)
    assert the_run.info.status == "FINISHED"
    assert the_run.data.tags["job"] == job.name
    assert the_run.info.run_name.startswith(f"{job.name}-{the_run.data.tags['family']}-")
    assert job_of_folder(result.model_folder) is job
    load_model(result.model_folder)
    experiment = the_run.info.experiment_id
    assert f"{sys.executable} -m mlflow ui --backend-store-uri {uri}" in summary
    assert f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{result.run_id}" in summary
    assert f"model folder: {result.model_folder.resolve()}" in summary


def usage_command(summary: str) -> list[str]:
    """The command of the summary's line after `model folder:` ('<what>: <command>')."""
    lines = summary.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("model folder: "))
    return shlex.split(lines[at + 1].split(": ", 1)[1])


def predict_input(job, result, folder: Path) -> pd.DataFrame:
    """A table for predict.py: the run's example table; for masked fill-in, rows of the training
    table with every third target cell emptied (the example has none left to fill from)."""
    if job.predict_flag is None:
        return result.outputs.example
    table = pd.read_csv(folder / "plant.csv").iloc[-90:].reset_index(drop=True)
    table.loc[table.index % 3 == 0, "dynamic_temperature"] = np.nan
    return table


def test_the_printed_command_runs_from_another_folder_with_a_bare_path(trained, tmp_path):
    job, result, summary, folder, _ = trained
    command = usage_command(summary)
    assert Path(command[0]).is_absolute() and Path(command[1]).is_absolute(), command
    if Path(command[1]).name != "predict.py":  # a training command (fine-tuning from it): not run here
        assert f"init_from={result.model_folder.resolve()}" in command
        return
    table = tmp_path / "table.csv"
    predict_input(job, result, folder).to_csv(table, index=False)
    out = tmp_path / "out.csv"
    command[command.index("<table.csv>")] = str(table)
    command[command.index("--output") + 1] = str(out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    proc = subprocess.run(
        command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = pd.read_csv(out)
    if job.predict_flag is None:  # what the run's model folder predicted of the same table
        expected = result.outputs.example_forecasts
    else:
        expected = impute(load_model(result.model_folder), pd.read_csv(table)).table
        assert got.filter(like="_imputed").to_numpy().any()
    assert list(got.columns) == list(expected.columns)
    numbers = [c for c in expected.columns if pd.api.types.is_numeric_dtype(expected[c]) and c != "series_id"]
    np.testing.assert_allclose(got[numbers].astype(float), expected[numbers].astype(float), atol=1e-5)
    assert not list(elsewhere.iterdir())  # nothing written where it ran


def test_the_logged_model_loads(trained, tmp_path):
    job, result, _, _, uri = trained
    if result.outputs.example is None:  # the folder as the run's artifacts `model`
        assert job_of_folder(resolve_model(result.run_id, uri, tmp_path)) is job
        return
    with tracking_uri_for(uri):
        model = mlflow.pyfunc.load_model(f"runs:/{result.run_id}/model")
    got = model.predict(result.outputs.example)
    expected = result.outputs.example_forecasts
    numbers = expected.select_dtypes("number").columns  # a nullable column (event ids) as float, NaN for none
    np.testing.assert_allclose(got[numbers].astype(float), expected[numbers].astype(float), atol=1e-5)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("model.lr_schedule=cosine", "model.lr_schedule: 'cosine' is not one of warmup_cosine, epoch_decay"),
        ("model.lr=0", "model.lr: 0 must be a number above 0"),
        ("+model.colour=red", "model.colour: not a setting of "),
    ],
)
@pytest.mark.parametrize("name", list(JOBS))
def test_a_bad_setting_is_one_line_before_any_mlflow_run(name, setting, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    overrides = [*RUNS[name](tmp_path), setting, f"logger.mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"]
    with pytest.raises(SettingError) as err:
        run(compose_config(overrides, tmp_path / "out"))
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "mlruns").exists()
