"""End to end: the run `python train.py model=<family>` makes, in an empty folder, tiny settings.

Checks what a user gets: a FINISHED MLflow run in ./mlflow.db with params, metrics beside the
baseline, plots, checkpoint, scalers and the forecasts CSV, whose rows are exactly windows x steps x
variables, in original units, with target times consistent with origin and step.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from hydra.utils import get_class, instantiate
from mlflow import MlflowClient

from conftest import TINY
from tsformer.jobs.forecasting.job import WINDOW_MSE
from tsformer.tasks.base import RECONSTRUCTIONS
from tsformer.train import compose_config

# every test here trains through train.py (or reads a module fixture that does)
pytestmark = pytest.mark.slow

# a reconstruction and a forecast, in this process: tests/test_readme.py runs these train.py lines (and
# dec_only) as processes, and every family trains in the contract tests (tests/contract.py)
FAMILIES = ["enc_only", "enc_dec"]
JOB_OF = {"enc_only": "reconstruction", "enc_dec": "forecasting"}
METRICS = [
    "train/loss",
    "val/loss",
    "val/mse",
    "test/mse",
    "test/mae",
    "test/mae_orig",
    "test/rmse_orig",
    "test/baseline_mse",
    "test/baseline_mae",
    "test/baseline_mae_orig",
    "test/baseline_rmse_orig",
]


@pytest.mark.parametrize("family", FAMILIES)
def test_train_py_end_to_end(family, in_tmp, capsys):
    from tsformer.train import run

    overrides = [f"model={family}", *TINY, "figures=true"]
    run(compose_config(overrides, in_tmp / "out"))
    printed = capsys.readouterr().out

    client = MlflowClient(f"sqlite:///{in_tmp}/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "tsformer"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    job = JOB_OF[family]  # enc_only reconstructs
    assert re.fullmatch(rf"{job}-{family}-plant-\d{{6}}-[0-9a-f]{{6}}", run.info.run_name), run.info.run_name
    assert (run.data.tags["family"], run.data.tags["dataset"], run.data.tags["job"]) == (family, "plant", job)
    assert run.data.tags["git_commit"]
    assert run.data.params["model/net/d_model"] == "16"
    for name in METRICS:
        assert name in run.data.metrics, name
        assert np.isfinite(run.data.metrics[name])
    assert "test/mae_orig/dynamic_temperature" in run.data.metrics
    if job == "forecasting":  # the linear forecaster beside persistence in every forecasting run
        assert {"test/linear_mse", "test/linear_mae_orig"} <= set(run.data.metrics)
    artifacts = {
        a.path
        for folder in ("", "plots", "forecasts", "scalers", "checkpoints", "config")
        for a in client.list_artifacts(run.info.run_id, folder)
    }
    for path in [
        "plots/test_windows.png",
        "plots/error_by_step.png",
        "plots/attention.png",
        "forecasts/forecasts.csv",
        "scalers/features.json",
        "checkpoints/best.ckpt",
        "config/resolved.yaml",
    ]:
        assert path in artifacts, (path, artifacts)

    # the summary names the run and the CSV
    assert run.info.run_id in printed and "forecasts CSV:" in printed

    csv = pd.read_csv(in_tmp / "out" / "forecasts.csv", parse_dates=["origin_time", "target_time"])
    assert list(csv.columns) == [
        "series_id",
        "origin_time",
        "target_time",
        "step",
        "variable",
        "y_true",
        "y_pred",
    ]
    cfg = compose_config(overrides, in_tmp / "check")
    dm = instantiate(cfg.data)
    dm.setup()
    reconstructs = get_class(cfg.model._target_).produces == RECONSTRUCTIONS  # enc_only: each window's rows
    n_steps = dm.context_len if reconstructs else dm.horizon
    assert len(csv) == dm.n_windows("test") * n_steps * dm.d_target
    assert not csv.isna().any().any()
    assert set(csv.variable) == {"dynamic_temperature", "dynamic_pressure"}
    first = 0 if reconstructs else 1
    assert csv.step.min() == first and csv.step.max() == first + n_steps - 1
    assert (csv.target_time == csv.origin_time + csv.step * pd.Timedelta(dm.freq)).all()
    # original units: the truth in the CSV is the simulated data itself
    raw = dm.frame.set_index(["series_id", "time"])
    row = csv.iloc[len(csv) // 2]
    assert row.y_true == pytest.approx(raw.loc[(row.series_id, row.target_time), row.variable], rel=1e-5)


def test_runs_from_two_folders_in_one_process_log_to_their_own_database(in_tmp, monkeypatch):
    """Lightning's logger sets $MLFLOW_TRACKING_URI process-wide; run() puts it back, so the second
    run's default ./mlflow.db is its own folder's, not the first run's."""
    from tsformer.train import run

    for name in ("first", "second"):
        folder = in_tmp / name
        folder.mkdir()
        monkeypatch.chdir(folder)
        run(compose_config(["model=enc_dec", *TINY], folder / "out"))
    for name in ("first", "second"):
        client = MlflowClient(f"sqlite:///{in_tmp / name}/mlflow.db")
        (experiment,) = [e for e in client.search_experiments() if e.name == "tsformer"]
        (run_,) = client.search_runs([experiment.experiment_id])
        # TINY's figures=false: none drawn, none logged
        assert not client.list_artifacts(run_.info.run_id, "plots"), name
        assert not (in_tmp / name / "out" / "plots").exists(), name


def test_forecasts_file_null_writes_no_csv_and_still_counts_every_window(in_tmp, monkeypatch):
    """For benchmarks whose CSV would be gigabytes: no CSV file or artifact, the figures still drawn
    (from the test arrays), every test window still evaluated."""
    from tsformer.train import run

    monkeypatch.chdir(in_tmp)
    overrides = ["model=enc_dec", *TINY, "forecasts_file=null", "figures=true"]
    result = run(compose_config(overrides, in_tmp / "out"))
    assert result.csv_path is None and result.forecasts is None
    assert not list((in_tmp / "out").glob("*.csv"))
    dm = instantiate(compose_config(overrides, in_tmp / "check").data)
    dm.setup()
    client = MlflowClient(f"sqlite:///{in_tmp}/mlflow.db")
    logged = client.get_run(result.run_id).data
    assert logged.metrics["test/n_windows"] == dm.n_windows("test") > 0
    # each test window's own MSE (benchmarks/ett.py's drop_last figure): whole windows, they average to test/mse
    window_mse = pd.read_csv(client.download_artifacts(result.run_id, WINDOW_MSE, str(in_tmp)))
    assert list(window_mse.window) == list(range(dm.n_windows("test")))
    np.testing.assert_allclose(window_mse.mse.mean(), result.metrics["test/mse"], rtol=1e-4)
    # what benchmarks read besides the metrics: the fit's duration and steps, the network's size
    assert logged.metrics["fit/seconds"] > 0 and logged.metrics["fit/steps"] > 0
    assert int(logged.params["n_params"]) > 0
    assert not client.list_artifacts(result.run_id, "forecasts")
    plots = {a.path for a in client.list_artifacts(result.run_id, "plots")}
    assert {"plots/test_windows.png", "plots/error_by_step.png"} <= plots
    assert np.isfinite(result.metrics["test/mse"])


def test_mae_by_step_equals_the_csv_frame_grouped_by_variable_and_step(in_tmp):
    """The error-by-step figure is drawn from the arrays; it must show what the CSV would give."""
    from tsformer.jobs.forecasting.export import SplitView, forecasts_frame, mae_by_step

    dm = instantiate(compose_config(["model=enc_dec", *TINY], in_tmp / "out").data)
    dm.setup()
    W, T, Dy = dm.n_windows("test"), dm.horizon, dm.d_target
    rng = np.random.default_rng(0)
    pred, true = rng.normal(size=(W, T, Dy)), rng.normal(size=(W, T, Dy))
    valid = rng.random((W, T)) > 0.2  # some steps filled in: not scored
    view = SplitView.of(dm, "test")
    frame = forecasts_frame(view, pred, true, valid)
    expected = (frame.y_pred - frame.y_true).abs().groupby([frame.variable, frame.step]).mean()
    got = mae_by_step(view, pred, true, valid).set_index(["variable", "step"]).mae
    pd.testing.assert_series_equal(got.sort_index(), expected.sort_index(), check_names=False, rtol=1e-9)
    # a frame of a few windows is the full frame's rows of those windows
    some = forecasts_frame(view, pred, true, valid, windows=np.array([0, W - 1]))
    origins = dm.window_info("test").origin_time.iloc[[0, W - 1]]
    assert len(some) == 2 * T * Dy and set(some.origin_time) == set(origins)
