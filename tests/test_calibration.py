"""Spread calibration (`model.head.calibrate`): the conformal factor per step, what it does to a
forecast that is too sharp or too wide, the rolling factor that only reads truths known at the
origin, and that a trained model carries its factors into its model folder."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from conftest import TINY
from tsformer.jobs.forecasting.forecaster import Forecaster
from tsformer.tasks.probabilistic import (
    QuantileFunctionForecast,
    SampleForecast,
    SpreadCalibration,
    conformal_by_step,
    lag1_autocorrelation_of_changes,
    scores,
    spread_needed,
)
from tsformer.train import compose_config, run


def gaussian_forecast(loc: torch.Tensor, sd: torch.Tensor) -> QuantileFunctionForecast:
    """Normal(loc, sd) marginals, `(B, T, D)` each."""
    normal = torch.distributions.Normal(0.0, 1.0)

    def quantiles(levels):
        return loc.unsqueeze(-1) + sd.unsqueeze(-1) * normal.icdf(torch.tensor(levels))  # (B, T, D, K)

    return QuantileFunctionForecast(quantiles, lambda: loc)


def test_conformal_factor_is_the_split_conformal_order_statistic():
    needed = torch.arange(1.0, 11.0)[torch.randperm(10)].view(10, 1, 1)  # 1..10 in any order, one step
    assert conformal_by_step(needed.numpy(), 0.8).item() == 9.0  # ceil(11 * 0.8) = 9th smallest
    with_gaps = torch.cat([needed, torch.full((5, 1, 1), float("nan"))])  # steps not scored are left out
    assert conformal_by_step(with_gaps.numpy(), 0.8).item() == 9.0
    few = torch.tensor([3.0, 1.0]).view(2, 1, 1)  # ceil(3 * 0.8) = 3 > n: the largest
    assert conformal_by_step(few.numpy(), 0.8).item() == 3.0
    assert conformal_by_step(np.full((4, 1, 1), np.nan), 0.8).item() == 1.0  # nothing scored


@pytest.mark.parametrize("true_sd_per_forecast_sd", [2.5, 0.3])  # a forecast too sharp, then too wide
def test_calibration_on_validation_gives_80_percent_coverage_on_new_windows(true_sd_per_forecast_sd):
    gen = torch.Generator().manual_seed(0)
    T, D = 6, 2
    sd = (
        torch.linspace(0.5, 1.5, T).view(1, T, 1).expand(1, T, D)
    )  # the forecast's spread grows with the step
    growth = torch.linspace(1.0, 2.0, T).view(1, T, 1)  # and the truth's even faster (too sharp far ahead)

    def windows(n):
        loc = torch.randn(n, T, D, generator=gen)
        truth = loc + true_sd_per_forecast_sd * growth * sd * torch.randn(n, T, D, generator=gen)
        return gaussian_forecast(loc, sd.expand(n, T, D)), truth

    val_forecast, val_truth = windows(2000)
    scale = torch.as_tensor(
        conformal_by_step(spread_needed(val_forecast, val_truth).numpy(), 0.8), dtype=torch.float32
    )  # (T, D)
    test_forecast, test_truth = windows(4000)
    raw = scores(test_forecast, test_truth, [0.5])["coverage_80"].mean(dim=0)  # (T, D)
    calibrated_forecast = test_forecast.with_spread_scale(scale)
    calibrated = scores(calibrated_forecast, test_truth, [0.5])["coverage_80"].mean(dim=0)
    # as trained: the coverage is far from 0.8 at every step; calibrated: within sampling error
    assert ((raw - 0.8).abs() > 0.1).all()
    assert ((calibrated - 0.8).abs() < 0.03).all(), calibrated
    # the CRPS is better too: the spread is what it should be
    raw_crps = test_forecast.crps(test_truth).mean()
    assert calibrated_forecast.crps(test_truth).mean() < raw_crps
    # the median and the point value are left where they were (symmetric marginals)
    assert torch.allclose(calibrated_forecast.quantiles([0.5]), test_forecast.quantiles([0.5]), atol=1e-6)
    assert torch.allclose(calibrated_forecast.point(), test_forecast.point(), atol=1e-6)


def test_sampled_paths_take_the_rescaled_values_at_every_step():
    gen = torch.Generator().manual_seed(1)
    samples = torch.randn(3, 51, 4, 2, generator=gen).cumsum(dim=2)  # (B, S, T, D) random walks
    scale = torch.tensor([[0.5, 2.0], [1.0, 3.0], [1.5, 1.0], [2.0, 0.7]])  # (T, D)
    dist = SampleForecast(samples)
    torch.manual_seed(0)
    rescaled = dist.with_spread_scale(scale)
    levels = [0.1, 0.25, 0.5, 0.9]
    median = dist.quantiles([0.5])  # (B, T, D, 1)
    expected = median + scale.unsqueeze(-1) * (dist.quantiles(levels) - median)
    # each step holds exactly the values median + c (x - median): read again from the paths, not the cache
    assert torch.allclose(SampleForecast(rescaled.samples).quantiles(levels), expected, atol=1e-5)
    whole = median[..., 0].unsqueeze(1) + scale * (samples - median[..., 0].unsqueeze(1))  # (B, S, T, D)
    assert torch.allclose(rescaled.samples.sort(dim=1).values, whole.sort(dim=1).values, atol=1e-5)
    assert torch.allclose(rescaled.point(), whole.mean(dim=1), atol=1e-5)
    torch.manual_seed(0)
    per_window = scale.expand(3, 4, 2)  # (B, T, D): the same factor given per window
    assert torch.allclose(dist.with_spread_scale(per_window).samples, rescaled.samples)


def test_paths_narrowed_are_rescaled_whole_about_the_median():
    samples = torch.randn(3, 51, 4, 2, generator=torch.Generator().manual_seed(2)).cumsum(dim=2)
    scale = torch.tensor([[0.5, 1.0], [0.8, 0.9], [1.0, 0.7], [0.6, 0.3]])  # (T, D), none above 1
    dist = SampleForecast(samples)
    median = dist.quantiles([0.5])[..., 0].unsqueeze(1)  # (B, 1, T, D)
    assert torch.allclose(
        dist.with_spread_scale(scale).samples, median + scale * (samples - median), atol=1e-6
    )


def lag1_of_changes(paths: torch.Tensor) -> float:
    """`lag1_autocorrelation_of_changes` of paths `(B, S, T, 1)`, every window's paths pooled."""
    return lag1_autocorrelation_of_changes(paths[..., 0].reshape(-1, paths.shape[2]).numpy())


def test_paths_widened_keep_their_step_to_step_coherence():
    """Paths = each window's smooth median path + fresh noise at every step, widened 3-fold. Rescaled
    whole, the noise's jitter would dominate their changes; carried as one offset per path, the
    widening leaves the changes' lag-1 autocorrelation where the model's paths had it."""
    gen = torch.Generator().manual_seed(3)
    B, S, T = 4, 200, 12
    median_path = torch.randn(B, 1, T, 1, generator=gen).cumsum(dim=2)  # (B, 1, T, 1) random walks
    samples = median_path + 0.3 * torch.randn(B, S, T, 1, generator=gen)  # (B, S, T, 1)
    torch.manual_seed(0)
    widened = SampleForecast(samples).with_spread_scale(torch.full((T, 1), 3.0)).samples
    median = samples.quantile(0.5, dim=1, keepdim=True)
    whole = median + 3.0 * (samples - median)
    assert abs(lag1_of_changes(widened) - lag1_of_changes(samples)) < 0.05
    assert lag1_of_changes(whole) < lag1_of_changes(samples) - 0.2  # what rescaling whole would do


def test_rolling_factor_reads_only_truths_known_at_the_origin_within_the_window():
    day = np.timedelta64(1, "D")
    t0 = np.datetime64("2024-01-01T00:00", "ns")
    rng = np.random.default_rng(0)
    T, D = 2, 1
    # validation: 40 windows, one a day, truths known at t0 + i days (step 0) and a day later (step 1)
    val_needed = rng.uniform(0, 1, (40, T, D))
    val_known = t0 + np.arange(40)[:, None] * day + np.arange(T)[None, :] * day  # (40, T)
    calibration = SpreadCalibration("30D", coverage=0.8)
    static = calibration.fit_validation(val_needed, val_known)
    assert np.allclose(static, conformal_by_step(val_needed, 0.8))

    origin = t0 + 43 * day

    def expected(o):  # by hand: per step, the truths known in (o - 30 days, o]
        pool_needed = np.concatenate([val_needed, later_needed])
        pool_known = np.concatenate([val_known, later_known])
        out = np.empty((T, D))
        for t in range(T):
            keep = (pool_known[:, t] <= o) & (pool_known[:, t] > o - 30 * day)
            v = np.sort(pool_needed[keep, t, 0])
            out[t, 0] = v[min(len(v), int(np.ceil((len(v) + 1) * 0.8))) - 1]
        return out

    # test windows: factors of 5, their truths known from day 41 on
    later_needed = np.full((10, T, D), 5.0)
    later_known = t0 + (41 + np.arange(10))[:, None] * day + np.arange(T)[None, :] * day
    calibration.add(later_needed, later_known)
    at = calibration.at(np.array([origin, origin + 6 * day]))
    assert np.allclose(at[0], expected(origin)) and np.allclose(at[1], expected(origin + 6 * day))
    assert (at[0] < 1).all() and (at[1] == 5).all()  # six days later, more of the large factors are known
    # a truth measured after the origin changes nothing at the origin (no future in the past)
    later_needed = np.concatenate([later_needed, np.full((1, T, D), 1e6)])
    later_known = np.concatenate([later_known, np.full((1, T), origin + np.timedelta64(1, "ns"))])
    calibration.add(later_needed[-1:], later_known[-1:])
    assert np.array_equal(calibration.at(np.array([origin]))[0], at[0])
    assert np.allclose(calibration.latest(), expected(later_known.max()))
    # long after everything: nothing known in the window, the validation factor
    assert np.array_equal(calibration.at(np.array([origin + 100 * day]))[0], static)
    # no window: the validation factor at every origin
    fixed = SpreadCalibration(None)
    fixed.fit_validation(val_needed, val_known)
    fixed.add(later_needed, later_known)
    assert np.array_equal(fixed.at(np.array([origin]))[0], static) and np.array_equal(fixed.latest(), static)


def coverage_by_step(task, datamodule, split: str) -> torch.Tensor:
    covered = []
    with torch.no_grad():
        for batch in getattr(datamodule, f"{split}_dataloader")():
            per_element = scores(task.forecast_distribution(batch), batch["fut_target"], [0.5])["coverage_80"]
            covered.append(per_element)
    return torch.cat(covered).mean(dim=0)  # (T, Dy)


@pytest.mark.slow
def test_a_trained_model_is_calibrated_on_validation_and_carries_the_factors(in_tmp):
    overrides = ["model=enc_only_forecast", "head=gaussian", *TINY, "logger=none"]
    result = run(compose_config([*overrides, "model.head.calibration_window=null"], in_tmp / "out"))
    task = Forecaster.load(result.model_folder).task  # the factors come back with the weights
    assert task.spread_scale.shape == (task.hparams.horizon, task.hparams.d_target)
    assert (task.spread_scale != 1).all()
    dm = instantiate(compose_config(overrides, in_tmp / "check").data)
    dm.setup()
    n_val = dm.n_windows("val")
    k = math.ceil((n_val + 1) * 0.8)
    # on the validation windows, every step covers exactly the conformal share (continuous scores)
    val_coverage = coverage_by_step(task, dm, "val")
    assert torch.allclose(val_coverage, torch.full_like(val_coverage, k / n_val), atol=1.5 / n_val), (
        val_coverage
    )
    assert np.isclose(
        result.metrics["test/coverage_80"], coverage_by_step(task, dm, "test").mean().item(), atol=1e-6
    )

    # the same network calibrated rolling (the default), and not at all
    rolling = run(compose_config(overrides, in_tmp / "rolling"))
    uncalibrated = run(compose_config([*overrides, "model.head.calibrate=false"], in_tmp / "raw"))
    assert (Forecaster.load(uncalibrated.model_folder).task.spread_scale == 1).all()
    rolled = Forecaster.load(rolling.model_folder).task.spread_scale  # the latest factors
    assert (rolled != 1).all() and not torch.allclose(rolled, task.spread_scale)
    coverages = {r.metrics["test/coverage_80"] for r in (result, rolling, uncalibrated)}
    assert len(coverages) == 3
    for other in (rolling, uncalibrated):
        assert other.metrics["test/mse"] == pytest.approx(result.metrics["test/mse"])  # the median moves not


@pytest.mark.slow
def test_model_folders_of_another_format_are_refused(in_tmp):
    """Format 2 changed what a distribution head's weights mean (median-anchored quantile knots, the
    spread factors); no release wrote format 1 (`format_version: 1`), so a folder of it is refused,
    whatever its head."""
    result = run(
        compose_config(["model=enc_only_forecast", "head=point", *TINY, "logger=none"], in_tmp / "p")
    )
    config_path = result.model_folder / "tsformer.json"
    config = json.loads(config_path.read_text())
    config.pop("format")
    config["format_version"] = 1
    config_path.write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"format 'forecaster-1' is older than this tsformer reads .* train the"
    ):
        Forecaster.load(result.model_folder)
