"""Wind power on real SCADA data (T1.csv): the loader and its gaps, the forecast-error setting of the
future wind, the power-curve baseline, and one run of train.py on a small slice.

The tests on the real file are skipped when it is absent (it lives outside the repository, in
../shared/data); the forecast noise and the power curve are also checked on a synthetic turbine,
always.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra.utils import instantiate
from mlflow import MlflowClient

from conftest import TINY
from tsformer.data import ForecastNoise, TimeSeriesDataModule, find_segments, load_wind_scada, wind_scada
from tsformer.data.simulators import power_curve
from tsformer.data.wind_scada import URL
from tsformer.tasks.baselines import PowerCurve, fit_baselines
from tsformer.train import compose_config, run

T1 = Path(__file__).resolve().parents[2] / "shared" / "data" / "wind_turbine_scada" / "T1.csv"
needs_t1 = pytest.mark.needs_data(T1)  # skipped where the file is absent (conftest.py)

KNOWN = ["wind_speed", "wind_direction_sin", "wind_direction_cos"]
STEP = pd.Timedelta("10min")
N, M = 20, 18  # short history for the synthetic checks; the experiment's horizon


def synthetic_turbine(n_steps: int = 3000, mean_speed: float = 9.0, seed: int = 0) -> pd.DataFrame:
    """T1's layout without the file: a daily wind cycle, a wandering direction, a cubic power curve."""
    rng = np.random.default_rng(seed)
    t = np.arange(n_steps)
    speed = np.clip(mean_speed + 3.0 * np.sin(2 * np.pi * t / 144) + rng.normal(0, 0.5, n_steps), 0, None)
    direction = np.mod(180 + np.cumsum(rng.normal(0, 3, n_steps)), 360)
    curve = power_curve(speed, cut_out=99.0)
    return pd.DataFrame(
        {
            "time": pd.date_range("2018-01-01", periods=n_steps, freq=STEP),
            "series_id": "T1",
            "power": curve + rng.normal(0, 50, n_steps),
            "wind_speed": speed,
            "wind_direction_sin": np.sin(np.deg2rad(direction)),
            "wind_direction_cos": np.cos(np.deg2rad(direction)),
            "theoretical_power": curve,
        }
    )


def datamodule(frame: pd.DataFrame, noise: ForecastNoise | None = None) -> TimeSeriesDataModule:
    dm = TimeSeriesDataModule(
        frame,
        target_cols=["power"],
        known_cols=KNOWN,
        series_col="series_id",
        freq="10min",
        context_len=N,
        horizon=M,
        val_fraction=0.2,
        test_fraction=0.2,
        extra_cols=["theoretical_power"],
        future_known_noise=noise,
    )
    dm.setup()
    return dm


def to_original(dm, known: torch.Tensor) -> np.ndarray:
    """Scaled known channels (..., 3) -> wind speed, sin, cos in original units (..., 3)."""
    return dm.features.covariate_scaler.inverse(known.numpy().astype(np.float64))


def windows(dm, split: str, n: int | None = None) -> dict[str, torch.Tensor]:
    """The first n windows of a split as one batch, (W, T, D) each."""
    ds = dm.datasets[split]
    items = [ds[i] for i in range(len(ds) if n is None else n)]
    return {k: torch.stack([item[k] for item in items]) for k in items[0]}


# -- forecast noise (no file needed) -------------------------------------------------------------------


@pytest.fixture(scope="module")
def noisy_and_clean():
    frame = synthetic_turbine()
    return datamodule(frame, ForecastNoise()), datamodule(frame)


def test_noise_sd_grows_with_lead_time_as_configured(noisy_and_clean):
    noisy, clean = noisy_and_clean
    fut_noisy = to_original(noisy, windows(noisy, "train")["fut_known"])  # (W, M, 3)
    fut_clean = to_original(clean, windows(clean, "train")["fut_known"])
    speed_sd = (fut_noisy[..., 0] - fut_clean[..., 0]).std(axis=0)  # (M,)
    noisy_angle, clean_angle = (np.arctan2(fut[..., 1], fut[..., 2]) for fut in (fut_noisy, fut_clean))
    angle = noisy_angle - clean_angle  # (W, M) radians
    angle_sd = np.rad2deg(np.angle(np.exp(1j * angle))).std(axis=0)  # wrapped to (-180, 180]
    noise = ForecastNoise()
    np.testing.assert_allclose(noise.speed_sd_by_step(M)[[0, -1]], [0.5, 1.5])
    np.testing.assert_allclose(noise.direction_sd_by_step(M)[[0, -1]], [5.0, 15.0])
    np.testing.assert_allclose(speed_sd, noise.speed_sd_by_step(M), rtol=0.15)
    np.testing.assert_allclose(angle_sd, noise.direction_sd_by_step(M), rtol=0.15)
    assert np.all(np.diff(noise.speed_sd_by_step(M)) > 0)


def test_noise_only_on_the_future_and_fixed_per_window(noisy_and_clean):
    noisy, clean = noisy_and_clean
    for split in ("train", "val", "test"):
        a, b = windows(noisy, split, 50), windows(clean, split, 50)
        torch.testing.assert_close(a["hist_known"], b["hist_known"], rtol=0, atol=0)  # the past is measured
        assert not torch.allclose(a["fut_known"], b["fut_known"])
        torch.testing.assert_close(windows(noisy, split, 50)["fut_known"], a["fut_known"], rtol=0, atol=0)
    # a fresh data module with the same noise seed gives the same forecasts; another seed others
    again = datamodule(synthetic_turbine(), ForecastNoise())
    torch.testing.assert_close(windows(again, "test")["fut_known"], windows(noisy, "test")["fut_known"])
    other = datamodule(synthetic_turbine(), ForecastNoise(seed=1))
    assert not torch.allclose(windows(other, "test", 5)["fut_known"], windows(noisy, "test", 5)["fut_known"])
    # the shared array behind the windows is untouched
    torch.testing.assert_close(noisy.datasets["train"].known, clean.datasets["train"].known, rtol=0, atol=0)


def test_noise_differs_across_windows(noisy_and_clean):
    noisy, clean = noisy_and_clean
    error = windows(noisy, "test", 3)["fut_known"] - windows(clean, "test", 3)["fut_known"]  # (3, M, 3)
    # windows 0 and 1 share 17 future steps: the same steps get different errors in each forecast
    assert not torch.allclose(error[0, 1:], error[1, :-1])
    assert not torch.allclose(error[1], error[2])


def test_noisy_wind_stays_physical():
    calm = datamodule(synthetic_turbine(mean_speed=0.5), ForecastNoise())  # the error often exceeds the speed
    fut = to_original(calm, windows(calm, "train")["fut_known"])  # (W, M, 3)
    assert fut[..., 0].min() >= -1e-5
    assert (fut[..., 0] < 1e-5).any()  # clipping happened
    np.testing.assert_allclose(fut[..., 1] ** 2 + fut[..., 2] ** 2, 1.0, atol=1e-4)


# -- power-curve baseline and the model's inputs (no file needed) ------------------------------------


def test_power_curve_baseline_on_a_synthetic_turbine(noisy_and_clean):
    noisy, _ = noisy_and_clean
    assert "theoretical_power" not in noisy.known_names + noisy.observed_names
    assert noisy.d_known == 3 and "theoretical_power" in noisy.frame.columns

    baseline = PowerCurve()
    fit_baselines([baseline], noisy.datasets["train"], noisy.features, noisy.frame)
    rows = np.unique(noisy.datasets["train"].target_rows())
    speed = noisy.frame["wind_speed"].to_numpy()[rows]
    error = np.abs(baseline.curve(speed) - noisy.frame["theoretical_power"].to_numpy()[rows])
    assert error.mean() < 5.0  # kW, of 3600 rated

    # predictions: the curve at the (noisy) future wind of the batch, in scaled target units
    batch = windows(noisy, "test", 64)
    pred = noisy.features.inverse_target(baseline.predict(batch))  # (B, M, 1) kW
    future_speed = to_original(noisy, batch["fut_known"])[..., 0]
    np.testing.assert_allclose(pred[..., 0].numpy(), baseline.curve(future_speed), atol=0.1)
    assert pred.shape == batch["fut_target"].shape


def test_missing_file_names_every_path_tried(tmp_path, monkeypatch):
    monkeypatch.setattr(wind_scada, "shared_data_folders", lambda name: [tmp_path / "copy" / name])
    with pytest.raises(FileNotFoundError) as err:
        load_wind_scada([tmp_path / "nowhere" / "T1.csv", "also/not/here.csv"])
    message = str(err.value)
    assert "nowhere" in message and "also/not/here.csv" in message
    assert str(tmp_path / "copy" / "wind_turbine_scada" / "T1.csv") in message  # the fallback too
    # where users get the file and where to put it, not a note only developers have
    assert URL in message and "data/wind_turbine_scada/T1.csv" in message and "SOURCE.md" not in message


# -- the real file --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def t1():
    return load_wind_scada(["does/not/exist.csv", str(T1)])  # the first existing candidate is used


@needs_t1
def test_t1_outside_the_configs_paths_is_found_in_the_shared_copy(tmp_path):
    """The config names only data/wind_turbine_scada/T1.csv; the shared copy is the loader's fallback."""
    assert len(load_wind_scada([tmp_path / "T1.csv"], end="2018-01-02")) == 144


@needs_t1
def test_loader_parses_t1(t1):
    assert list(t1.columns) == [
        "time",
        "series_id",
        "power",
        "wind_speed",
        "wind_direction",
        "wind_direction_sin",
        "wind_direction_cos",
        "theoretical_power",
    ]
    assert len(t1) == 50530 and (t1["series_id"] == "T1").all()
    assert t1["time"].iloc[0] == pd.Timestamp("2018-01-01 00:00")
    assert t1["time"].iloc[-1] == pd.Timestamp("2018-12-31 23:50")
    assert t1["time"].iloc[1] == pd.Timestamp("2018-01-01 00:10")  # day first: "01 01 2018 00:10"
    steps = t1["time"].diff().iloc[1:]
    assert (steps >= STEP).all() and (steps > STEP).sum() == 32  # SOURCE.md: 32 gaps
    np.testing.assert_allclose(t1["wind_direction_sin"] ** 2 + t1["wind_direction_cos"] ** 2, 1.0)


@pytest.fixture(scope="module")
def t1_config(tmp_path_factory):
    return compose_config(["experiment=wind_scada_forecast_error"], tmp_path_factory.mktemp("out"))


@needs_t1
def test_no_window_spans_a_gap(t1_config):
    dm = instantiate(t1_config.data)
    dm.setup()
    segments = find_segments(dm.frame, dm.schema, STEP, "T1")
    assert len(segments) == 33  # 32 gaps
    length = dm.context_len + dm.horizon
    for split in ("train", "val", "test"):
        starts = dm.datasets[split].starts
        segment = np.searchsorted(segments["start"].to_numpy(), starts, side="right") - 1
        assert (starts + length <= segments["stop"].to_numpy()[segment]).all(), split
        times = dm.frame["time"].to_numpy()
        assert (times[starts + length - 1] - times[starts] == (length - 1) * STEP.to_timedelta64()).all()


@needs_t1
def test_theoretical_power_is_never_a_model_input(t1_config):
    data = t1_config.data
    assert "theoretical_power" not in [*data.known_cols, *data.observed_cols, *data.target_cols]
    dm = instantiate(data)
    dm.setup()
    assert dm.known_names == KNOWN and dm.observed_names == []
    batch = next(iter(dm.test_dataloader()))
    assert batch["hist_known"].shape[-1] == batch["fut_known"].shape[-1] == 3


@needs_t1
def test_power_curve_reproduces_t1s_curve_on_train_rows(t1_config):
    dm = instantiate(t1_config.data)
    dm.setup()
    baseline = instantiate(t1_config.baselines.power_curve)
    fit_baselines([baseline], dm.datasets["train"], dm.features, dm.frame)
    rows = np.unique(dm.datasets["train"].target_rows())
    speed = dm.frame["wind_speed"].to_numpy()[rows]
    error = np.abs(baseline.curve(speed) - dm.frame["theoretical_power"].to_numpy()[rows])
    assert error.mean() < 1.0 and np.quantile(error, 0.99) < 10.0  # kW, of 3600 rated


@pytest.mark.slow
@needs_t1
def test_train_end_to_end_on_a_slice_of_t1(in_tmp):
    """experiment=wind_scada_forecast_error on 25 days of January, tiny model: the power-curve baseline
    is measured beside the model and persistence."""
    overrides = [o for o in TINY if not o.startswith("data.source.")]
    overrides += [
        "experiment=wind_scada_forecast_error",
        "data.train_stride=4",
        "data.eval_stride=4",
        "data.source.end=2018-01-26",  # before the 4-day gap at the end of January
        "data.val_start=2018-01-18",
        "data.test_start=2018-01-22",
    ]
    cfg = compose_config(overrides, in_tmp / "out")
    run(cfg)
    client = MlflowClient(f"sqlite:///{in_tmp}/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "tsformer"]
    (mlflow_run,) = client.search_runs([experiment.experiment_id])
    metrics = mlflow_run.data.metrics
    for name in ("test/mae_orig", "test/baseline_mae_orig", "test/baseline_power_curve_mae_orig"):
        assert np.isfinite(metrics[name]), name
    assert (in_tmp / "out" / "forecasts.csv").exists()
