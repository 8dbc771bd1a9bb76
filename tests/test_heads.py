"""Output heads (nn/heads.py) and the probabilistic scores (tasks/probabilistic.py): losses minimised
by the true parameters, monotone quantiles, sampling that matches the quantiles, CRPS estimators
against the Gaussian's closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch.distributions import Normal

from tsformer.nn.heads import GaussianHead, PointHead, QuantileHead, StudentTHead, build_head
from tsformer.tasks.probabilistic import (
    CRPS_GRID,
    SampleForecast,
    crps_from_quantiles,
    crps_from_samples,
    head_forecast,
    scores,
)

N_DRAWS = 40_000
LEVELS = [0.02, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.98]


def normal_crps(loc, scale, y):
    """Closed form (Gneiting and Raftery 2007)."""
    z = (y - loc) / scale
    std = Normal(0.0, 1.0)
    return scale * (z * (2 * std.cdf(z) - 1) + 2 * std.log_prob(z).exp() - 1 / math.sqrt(math.pi))


def true_params(head) -> torch.Tensor:
    """Parameters `(1, 2, P)` of two channels, and data drawn from them `(N_DRAWS, 2)`."""
    if isinstance(head, GaussianHead):
        return torch.tensor([[[1.5, 0.7], [-2.0, 2.0]]])
    if isinstance(head, StudentTHead):
        return torch.tensor([[[1.5, 0.7, 4.0], [-2.0, 2.0, 8.0]]])
    # the quantile head: the true quantiles of two Normals at its levels
    taus = torch.tensor(head.taus)
    return torch.stack([1.5 + 0.7 * Normal(0, 1).icdf(taus), -2.0 + 2.0 * Normal(0, 1).icdf(taus)])[None]


def draws(head, n=N_DRAWS, seed=0) -> torch.Tensor:
    """Data from the true distributions of `true_params`, `(n, 2)`."""
    rng = np.random.default_rng(seed)
    if isinstance(head, StudentTHead):
        cols = [1.5 + 0.7 * rng.standard_t(4.0, n), -2.0 + 2.0 * rng.standard_t(8.0, n)]
    else:
        cols = [rng.normal(1.5, 0.7, n), rng.normal(-2.0, 2.0, n)]
    return torch.tensor(np.stack(cols, axis=1), dtype=torch.float32)


DIST_HEADS = [GaussianHead(), StudentTHead(), QuantileHead()]


@pytest.mark.parametrize("head", DIST_HEADS, ids=lambda h: h.kind)
def test_loss_is_lowest_at_the_true_parameters(head):
    """Every parameter moved up or down (for the quantile head: every quantile) raises the loss."""
    y = draws(head)  # (n, 2)
    truth = true_params(head)  # (1, 2, P)
    best = head.loss(truth.expand(len(y), -1, -1), y)
    for c in range(2):
        for p in range(truth.shape[-1]):
            for sign in (-1, 1):
                moved = truth.clone()
                if p == 0 or isinstance(head, QuantileHead):  # a location: shifted
                    moved[0, c, p] += 0.3 * sign
                else:  # a scale or df: scaled
                    moved[0, c, p] *= 1.25**sign
                assert head.loss(moved.expand(len(y), -1, -1), y) > best, (c, p, sign)


@pytest.mark.slow
@pytest.mark.parametrize("head", DIST_HEADS, ids=lambda h: h.kind)
def test_fitting_the_raw_outputs_recovers_the_true_parameters(head):
    """Minimising the loss over the raw outputs (through the head's constraints) finds the truth."""
    torch.manual_seed(0)
    y = draws(head, n=10_000)
    raw = torch.zeros(1, 2 * head.n_params, requires_grad=True)
    # 500 steps at 0.1 reach the fitted values of 1,500 at 0.05 (benchmarks/RESULTS_test_suite.md)
    opt = torch.optim.Adam([raw], lr=0.1)
    decay = torch.optim.lr_scheduler.MultiStepLR(
        opt, [400], gamma=0.2
    )  # the pinball loss's gradient never shrinks
    for _ in range(500):
        opt.zero_grad()
        head.loss(head.params(raw).expand(len(y), -1, -1), y).backward()
        opt.step()
        decay.step()
    fitted, truth = head.params(raw.detach())[0], true_params(head)[0]
    if isinstance(head, StudentTHead):  # df is hard to pin down from 10k draws; loc and scale are not
        assert torch.allclose(fitted[:, :2], truth[:, :2], rtol=0.05, atol=0.05), (fitted, truth)
        assert (fitted[:, 2] - truth[:, 2]).abs().max() < 0.5 * truth[:, 2].max(), (fitted, truth)
    else:
        assert torch.allclose(fitted, truth, rtol=0.05, atol=0.06), (fitted, truth)


@pytest.mark.parametrize("head", [PointHead(), *DIST_HEADS], ids=lambda h: h.kind)
def test_quantiles_are_monotone_for_any_raw_output(head):
    torch.manual_seed(0)
    raw = torch.randn(64, 5, 3 * head.n_params) * 5  # (B, T, C * P), wild values
    q = head.quantiles(head.params(raw), LEVELS)  # (B, T, C, K)
    assert q.shape == (64, 5, 3, len(LEVELS))
    assert torch.isfinite(q).all()
    assert (q.diff(dim=-1) >= 0).all()
    if head.probabilistic:
        assert (q.diff(dim=-1) > 0).any()


@pytest.mark.parametrize("head", DIST_HEADS, ids=lambda h: h.kind)
def test_sampled_quantiles_match_the_head_quantiles(head):
    """Draws from `sample` have the quantiles `quantiles` says (for the quantile head: the inverse-CDF
    draw through its interpolated quantile function, tails included: 0.02 and 0.98 lie outside its
    levels)."""
    torch.manual_seed(0)
    params = true_params(head).expand(N_DRAWS, -1, -1)  # (n, 2, P)
    x = head.sample(params)  # (n, 2)
    expected = head.quantiles(true_params(head), LEVELS)[0]  # (2, K)
    empirical = torch.quantile(x, torch.tensor(LEVELS), dim=0).T  # (2, K)
    spread = expected[:, -1:] - expected[:, :1]
    assert ((empirical - expected).abs() / spread).max() < 0.02, (empirical, expected)
    if isinstance(head, (GaussianHead, StudentTHead)):  # quantiles: the distribution's own
        loc, scale = true_params(head)[0, :, 0:1], true_params(head)[0, :, 1:2]
        if isinstance(head, GaussianHead):
            ref = stats.norm.ppf(LEVELS, loc, scale)
        else:
            ref = stats.t.ppf(LEVELS, true_params(head)[0, :, 2:3], loc, scale)
        assert np.allclose(expected.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_quantile_head_tails_extend_beyond_its_levels():
    """Beyond its outermost levels the exponential tails go on, close to a Normal's when the knots
    are a Normal's quantiles (a tail clamped at the outer knots would miss by 0.4 sd at 0.02)."""
    head = QuantileHead()  # levels 0.05 ... 0.95
    params = true_params(head)  # (1, 2, K): N(1.5, 0.7) and N(-2, 2)
    outside = [0.005, 0.02, 0.98, 0.995]
    q = head.quantiles(params, outside)[0]  # (2, 4)
    ref = torch.tensor(stats.norm.ppf(outside, [[1.5], [-2.0]], [[0.7], [2.0]]), dtype=q.dtype)
    sd = torch.tensor([[0.7], [2.0]])
    assert ((q - ref).abs() / sd).max() < 0.25, (q, ref)
    assert (q[:, 0] < params[0, :, 0]).all() and (q[:, -1] > params[0, :, -1]).all()


def test_quantile_head_passes_through_its_knots_and_its_mean_is_the_sample_mean():
    torch.manual_seed(0)
    head = QuantileHead(quantile_levels=[0.1, 0.3, 0.5, 0.9], point="mean")
    params = head.params(torch.randn(3, 4 * 2))  # (3 windows, 2 channels, 4 levels)
    assert torch.allclose(head.quantiles(params, head.taus), params, atol=1e-6)
    x = head.sample(params[None].expand(N_DRAWS, -1, -1, -1))  # (n, 3, 2)
    width = params[..., -1] - params[..., 0]
    assert ((x.mean(0) - head.point(params)).abs() / width).max() < 0.02
    # the median point: the quantile at 0.5, the third knot
    assert torch.allclose(QuantileHead(quantile_levels=[0.1, 0.3, 0.5, 0.9]).point(params), params[..., 2])


@pytest.mark.parametrize("head", [PointHead(), *DIST_HEADS], ids=lambda h: h.kind)
def test_affine_maps_the_quantiles(head):
    """What RevIN and the scalers rely on: quantiles of loc + scale X = loc + scale * quantiles of X."""
    torch.manual_seed(0)
    params = head.params(torch.randn(4, 6, 2 * head.n_params))  # (B, T, 2, P)
    loc, scale = torch.randn(4, 1, 2), torch.rand(4, 1, 2) + 0.5
    moved = head.quantiles(head.affine(params, loc, scale), LEVELS)
    assert torch.allclose(
        moved, loc.unsqueeze(-1) + scale.unsqueeze(-1) * head.quantiles(params, LEVELS), atol=1e-5
    )
    assert torch.allclose(
        head.point(head.affine(params, loc, scale)), loc + scale * head.point(params), atol=1e-5
    )


def test_crps_estimators_agree_with_the_closed_form():
    torch.manual_seed(0)
    loc, scale = torch.tensor([0.0, 1.0, -2.0]), torch.tensor([1.0, 0.5, 3.0])
    y = torch.tensor([0.3, 2.5, -2.0])
    exact = normal_crps(loc, scale, y)
    samples = loc + scale * torch.randn(1, 200_000, 1, 3)  # (B, S, T, D)
    from_samples = crps_from_samples(samples, y.view(1, 1, 3))[0, 0]
    assert torch.allclose(from_samples, exact, rtol=0.01), (from_samples, exact)
    grid = loc[:, None] + scale[:, None] * Normal(0, 1).icdf(torch.tensor(CRPS_GRID))  # (3, n)
    from_quantiles = crps_from_quantiles(grid, y)
    assert torch.allclose(from_quantiles, exact, rtol=0.01), (from_quantiles, exact)
    # with few samples the fair estimator is unbiased where the plain one is not
    few = loc + scale * torch.randn(4000, 5, 1, 3)
    fair = crps_from_samples(few, y.view(1, 1, 3).expand(4000, 1, 3)).mean(0)[0]
    assert torch.allclose(fair, exact, rtol=0.03), (fair, exact)


def test_scores_of_a_calibrated_forecast():
    """A forecast that IS the data's distribution covers 80% and has the distribution's width."""
    torch.manual_seed(0)
    head = GaussianHead()
    params = torch.tensor([0.5, 2.0]).expand(20_000, 1, 1, 2)  # (B, T, D, P)
    y = 0.5 + 2.0 * torch.randn(20_000, 1, 1)
    s = scores(head_forecast(head, params), y, [0.1, 0.5, 0.9])
    assert abs(s["coverage_80"].mean() - 0.8) < 0.01
    assert torch.allclose(s["width_80"], torch.tensor(2 * 2.0 * 1.2815515), atol=1e-4)
    paths = SampleForecast(0.5 + 2.0 * torch.randn(200, 1000, 1, 1))  # (B, S, T, D)
    assert abs(paths.quantiles([0.9])[..., 0].mean() - (0.5 + 2.0 * 1.2815515)) < 0.02


def test_build_head_names_the_setting_at_fault():
    with pytest.raises(ValueError, match="model.head.kind"):
        build_head({"kind": "laplace"})
    with pytest.raises(ValueError, match="model.head.levels"):
        build_head({"kind": "gaussian", "levels": [0.9, 0.1]})
    with pytest.raises(ValueError, match="model.head.levels"):
        build_head({"kind": "gaussian", "levels": [0.0, 0.5]})
    with pytest.raises(ValueError, match="model.head.point"):
        build_head({"kind": "student_t", "point": "mode"})
    with pytest.raises(ValueError, match=r"model.head \(gaussian\)"):
        build_head({"kind": "gaussian", "min_df": 3})
    with pytest.raises(ValueError, match="loss"):
        build_head(None, loss="l3")
    assert isinstance(build_head(None), PointHead)


def test_empirical_quantiles_of_paths_are_torch_quantile():
    torch.manual_seed(0)
    samples = torch.randn(3, 37, 4, 2)  # (B, S, T, D)
    levels = [0.0, 0.1, 0.333, 0.5, 0.9, 1.0]
    expected = torch.quantile(samples, torch.tensor(levels), dim=1).movedim(0, -1)  # (B, T, D, K)
    assert torch.allclose(SampleForecast(samples).quantiles(levels), expected, atol=1e-6)
    assert torch.allclose(SampleForecast(samples, "median").point(), samples.median(dim=1).values)
