"""Probabilistic runs end to end: `python train.py model=dec_only head=student_t` in an empty folder,
the quantile columns of the CSV and of `Forecaster.predict`, the probabilistic metrics of the model and
of the error-quantile baseline, the fan chart; the baseline's quantiles are its validation errors'."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hydra.utils import instantiate
from mlflow import MlflowClient

from conftest import TINY
from tsformer.jobs.forecasting.forecaster import Forecaster, example_table
from tsformer.tasks.baselines import ErrorQuantiles, Persistence
from tsformer.train import compose_config, run

PROB_METRICS = ["crps", "crps_orig", "pinball", "coverage_80", "width_80", "width_80_orig"]


def check_quantile_columns(frame: pd.DataFrame, levels=("q0.1", "q0.5", "q0.9")) -> None:
    assert [c for c in frame.columns if c.startswith("q")] == list(levels)
    assert not frame[list(levels)].isna().any().any()
    q = frame[list(levels)].to_numpy()
    assert (np.diff(q, axis=1) >= 0).all()  # monotone, in original units too
    assert (q[:, -1] > q[:, 0]).mean() > 0.99  # a spread, not a point


@pytest.mark.slow
def test_train_py_dec_only_student_t(in_tmp, capsys):
    overrides = ["model=dec_only", "head=student_t", "model.head.num_samples=20", *TINY, "figures=true"]
    # train.py's run in this process (tests/test_readme.py runs train.py lines as processes)
    run(compose_config([*overrides, "paths_file=paths.parquet"], in_tmp / "out"))
    assert "coverage_80" in capsys.readouterr().out  # the summary prints the probabilistic metrics

    client = MlflowClient(f"sqlite:///{in_tmp}/mlflow.db")
    (run_,) = client.search_runs([client.get_experiment_by_name("tsformer").experiment_id])
    assert run_.info.status == "FINISHED"
    for name in PROB_METRICS:
        for key in (f"test/{name}", f"test/baseline_{name}"):
            assert np.isfinite(run_.data.metrics[key]), key
    assert 0.0 <= run_.data.metrics["test/coverage_80"] <= 1.0
    assert run_.data.params["model/head/kind"] == "student_t"
    assert "plots/fan_chart.png" in {a.path for a in client.list_artifacts(run_.info.run_id, "plots")}
    assert "forecasts/paths.parquet" in {a.path for a in client.list_artifacts(run_.info.run_id, "forecasts")}

    csv = pd.read_csv(in_tmp / "out" / "forecasts.csv", parse_dates=["origin_time", "target_time"])
    cfg = compose_config(overrides, in_tmp / "check")
    dm = instantiate(cfg.data)
    dm.setup()
    assert len(csv) == dm.n_windows("test") * dm.horizon * dm.d_target  # every test window
    check_quantile_columns(csv)
    assert not csv.isna().any().any()
    # y_pred is the paths' mean (point: mean), the median column differs from it but stays close
    assert not np.allclose(csv.y_pred, csv["q0.5"])

    # the sampled paths: 20 per window, step and variable; their quantiles are the CSV's columns
    paths = pd.read_parquet(in_tmp / "out" / "paths.parquet")
    keys = ["series_id", "origin_time", "step", "variable"]
    assert len(paths) == len(csv) * 20 and not paths.isna().any().any()
    assert (paths.groupby(keys)["path"].nunique() == 20).all()
    from_paths = (
        paths.groupby(keys)["value"].quantile([0.1, 0.5, 0.9]).unstack()
    )  # linear, as the paths' quantiles
    merged = csv.merge(from_paths.reset_index(), on=keys)
    assert len(merged) == len(csv)
    for level in (0.1, 0.5, 0.9):
        assert np.allclose(merged[f"q{level}"], merged[level], rtol=1e-4, atol=1e-4)

    # the model folder rebuilds the same head: predict writes the same columns
    forecaster = Forecaster.load(in_tmp / "out" / "model")
    assert forecaster.task.head.kind == "student_t" and forecaster.task.head.num_samples == 20
    forecasts = forecaster.predict(example_table(dm, reconstructs=False))
    assert list(forecasts.columns[:7]) == list(csv.columns[:7])
    check_quantile_columns(forecasts)


RUNS = {
    "enc_dec-quantile": ["model=enc_dec", "head=quantile", "model.head.levels=[0.05,0.5,0.95]"],
    "enc_only_forecast-gaussian-revin-ci": [
        "model=enc_only_forecast",
        "head=gaussian",
        "model.revin=true",
        "model.channel_independent=true",
    ],
    "enc_only-gaussian": ["model=enc_only", "head=gaussian"],
    # patch tokens: paths sampled a patch of 10 steps at a time (60 and 30 steps: whole patches)
    "dec_only-gaussian-patches-revin-ci": [
        "model=dec_only",
        "head=gaussian",
        "model.patch_len=10",
        "model.revin=true",
        "model.channel_independent=true",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("overrides", RUNS.values(), ids=RUNS.keys())
def test_probabilistic_runs_of_the_other_families(overrides, in_tmp):
    result = run(
        compose_config([*overrides, "model.head.num_samples=10", *TINY, "logger=none"], in_tmp / "out")
    )
    for name in PROB_METRICS:
        assert np.isfinite(result.metrics[f"test/{name}"]) and np.isfinite(
            result.metrics[f"test/baseline_{name}"]
        )
    levels = ("q0.05", "q0.5", "q0.95") if "quantile" in overrides[1] else ("q0.1", "q0.5", "q0.9")
    check_quantile_columns(result.forecasts, levels)
    check_quantile_columns(pd.read_csv(result.csv_path), levels)


def test_error_quantile_baseline_is_persistence_plus_its_validation_errors():
    cfg = compose_config(["model=dec_only", *TINY], "/tmp/unused")
    dm = instantiate(cfg.data)
    dm.setup()
    baseline = ErrorQuantiles(Persistence())
    baseline.fit_errors(dm.val_dataloader(), reconstruction=False)
    val = dm.datasets["val"]
    errors = np.stack(
        [val[i]["fut_target"] - val[i]["hist_target"][-1:] for i in range(len(val))]
    )  # (W, M, Dy)
    assert baseline.errors.shape == errors.shape
    levels = [0.1, 0.5, 0.9]
    expected = np.moveaxis(np.quantile(errors, levels, axis=0), 0, -1)  # (M, Dy, K)
    assert np.allclose(baseline.error_quantiles(levels).numpy(), expected, atol=1e-5)
    batch = next(iter(dm.test_dataloader()))
    q = baseline.forecast(batch).quantiles(levels)  # (B, M, Dy, K)
    last = batch["hist_target"][:, -1:, :, None]  # (B, 1, Dy, 1)
    assert torch.allclose(q, last + torch.as_tensor(expected, dtype=q.dtype), atol=1e-5)
    assert (
        q[:, -1, :, 2] - q[:, -1, :, 0] > q[:, 0, :, 2] - q[:, 0, :, 0]
    ).all()  # the spread grows with the step


def test_paths_file_needs_a_family_that_samples_paths(in_tmp):
    cfg = compose_config(
        ["model=enc_only_forecast", "head=gaussian", "paths_file=paths.parquet", *TINY], in_tmp / "out"
    )
    with pytest.raises(
        ValueError, match=r"paths_file=paths.parquet: only dec_only and enc_dec .* enc_only_forecast"
    ):
        run(cfg)
    assert not (in_tmp / "mlflow.db").exists()  # refused before a run was opened
