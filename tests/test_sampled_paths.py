"""Sampled trajectories of the autoregressive families: through the KV cache (the history's K/V
shared by the paths) they equal the uncached reference for the same random draws; the tasks' forecast
distributions never read the future truth, with every model option."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import random_windows
from tsformer.models import DecoderOnly, DecoderOnlyConfig, EncoderDecoder, EncoderDecoderConfig
from tsformer.nn.attention import scaled_dot_product_attention, shared_prefix_attention
from tsformer.nn.heads import GaussianHead, PointHead, QuantileHead, StudentTHead
from tsformer.nn.masks import lengths_to_valid, padding_mask
from tsformer.tasks import (
    DecoderOnlyForecaster,
    EncoderDecoderForecaster,
    EncoderForecaster,
    ReconstructionTask,
)
from tsformer.tasks.probabilistic import SampleForecast

TINY = {"d_model": 32, "n_heads": 4, "n_layers": 2, "max_len": 64}
B, N, M, S = 3, 10, 7, 5


def test_shared_prefix_attention_equals_attention_over_copied_keys():
    torch.manual_seed(0)
    H, Dh, T0, T1 = 4, 8, 9, 3
    q = torch.randn(B * S, H, 1, Dh)
    k_shared, v_shared = torch.randn(B, H, T0, Dh), torch.randn(B, H, T0, Dh)
    k_own, v_own = torch.randn(B * S, H, T1, Dh), torch.randn(B * S, H, T1, Dh)
    k = torch.cat([k_shared.repeat_interleave(S, 0), k_own], dim=2)  # (B * S, H, T0 + T1, Dh)
    v = torch.cat([v_shared.repeat_interleave(S, 0), v_own], dim=2)
    expected, expected_w = scaled_dot_product_attention(q, k, v, fused=False, return_weights=True)
    out, w = shared_prefix_attention(q, k_shared, v_shared, S, k_own, v_own, return_weights=True)
    assert torch.allclose(out, expected, atol=1e-5) and torch.allclose(w, expected_w, atol=1e-6)
    # shared keys only, padded (cross-attention to a padded memory); a window with no key gets zeros
    valid = lengths_to_valid(torch.tensor([T0, 4, 0]), T0)  # (B, T0)
    mask = padding_mask(valid)  # (B, 1, 1, T0)
    expected, _ = scaled_dot_product_attention(
        q,
        k_shared.repeat_interleave(S, 0),
        v_shared.repeat_interleave(S, 0),
        mask=mask.repeat_interleave(S, 0),
        fused=False,
    )
    out, _ = shared_prefix_attention(q, k_shared, v_shared, S, shared_mask=mask)
    assert torch.allclose(out, expected, atol=1e-5)
    assert (out[2 * S :] == 0).all()


def dec_only(head, positional="sinusoidal"):
    torch.manual_seed(0)
    return DecoderOnly(
        DecoderOnlyConfig(d_target=2, d_known=3, positional=positional, n_params=head.n_params, **TINY)
    ).eval()


def enc_dec(head, positional="sinusoidal", start_token="last"):
    torch.manual_seed(0)
    cfg = EncoderDecoderConfig(
        d_enc_in=5,
        d_target=2,
        d_known=3,
        positional=positional,
        start_token=start_token,
        n_params=head.n_params,
        **TINY,
    )
    return EncoderDecoder(cfg).eval()


def inputs():
    g = torch.Generator().manual_seed(1)
    return (
        torch.randn(B, N, 2, generator=g),
        torch.randn(B, N, 3, generator=g),
        torch.randn(B, M, 3, generator=g),
    )


def generate(model, use_cache, **kw):
    hist_y, hist_k, fut_k = inputs()
    if isinstance(model, DecoderOnly):
        return model.generate(hist_y, hist_k, fut_k, use_cache=use_cache, **kw)
    hist = torch.cat([hist_y, hist_k], dim=-1)
    return model.generate(hist, hist_y[:, -1], fut_k, use_cache=use_cache, **kw)


MODELS = {
    "dec_only": lambda h: dec_only(h),
    "dec_only-rope": lambda h: dec_only(h, "rope"),
    "enc_dec": lambda h: enc_dec(h),
    "enc_dec-rope-go": lambda h: enc_dec(h, "rope", "go"),
}


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
@pytest.mark.parametrize("head", [GaussianHead(), StudentTHead(), QuantileHead()], ids=lambda h: h.kind)
def test_cached_sampling_equals_uncached_for_the_same_draws(make, head):
    model = make(head)
    torch.manual_seed(
        123
    )  # the draws come from the global generator, one (B * S, 1, Dy) draw per step in both
    cached = generate(model, True, draw=head.sample_of_raw, num_samples=S)
    torch.manual_seed(123)
    uncached = generate(model, False, draw=head.sample_of_raw, num_samples=S)
    assert cached.shape == (B * S, M, 2)
    assert torch.allclose(cached, uncached, atol=1e-4), (cached - uncached).abs().max()
    paths = cached.view(B, S, M, 2)
    assert (paths.std(dim=1) > 0).all()  # the paths of a window differ at every step
    torch.manual_seed(7)
    assert not torch.allclose(generate(model, True, draw=head.sample_of_raw, num_samples=S), cached)


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_a_point_head_rollout_is_the_plain_generation(make):
    """With the point head nothing changes: the same numbers as generate without a head."""
    head = PointHead()
    model = make(head)
    assert torch.equal(generate(model, True, draw=head.point_of_raw), generate(model, True))


def test_sampled_paths_spread_like_the_step_distribution():
    """The first step of every path is a draw from the same predicted distribution (the history is
    shared): with many paths their spread matches the head's scale."""
    head = GaussianHead()
    model = dec_only(head)
    hist_y, hist_k, fut_k = inputs()
    torch.manual_seed(0)
    paths = model.generate(hist_y, hist_k, fut_k, draw=head.sample_of_raw, num_samples=4000).view(
        B, 4000, M, 2
    )
    with torch.no_grad():
        params = head.params(model(hist_y, torch.cat([hist_k, fut_k], 1)[:, 1 : N + 1])[:, -1])  # (B, 2, 2)
    assert torch.allclose(paths[:, :, 0].mean(1), params[..., 0], atol=0.1)
    assert torch.allclose(paths[:, :, 0].std(1), params[..., 1], rtol=0.05)


NET = {"d_model": 16, "n_heads": 2, "n_layers": 1}
DY, DK, DO = 2, 3, 1
OPTIONS = {
    "plain": {},
    "revin": {"revin": True, "revin_affine": True},
    "ci": {"channel_independent": True},
    "revin-ci": {"revin": True, "channel_independent": True},
}


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("task_cls", [EncoderDecoderForecaster, DecoderOnlyForecaster, EncoderForecaster])
@pytest.mark.parametrize("kind", ["student_t", "quantile"])
def test_forecast_distribution_reads_no_future_truth(task_cls, options, kind):
    torch.manual_seed(0)
    head = {"kind": kind, "num_samples": 8}
    task = task_cls(
        net=NET, d_target=DY, d_known=DK, d_observed=DO, context_len=N, horizon=M, head=head, **options
    ).eval()
    if options.get("revin_affine"):
        with torch.no_grad():
            task.options.revin.weight.uniform_(0.5, 2.0)
            task.options.revin.bias.uniform_(-1.0, 1.0)
    b = random_windows(N, M, DY, DK, DO)
    blind = dict(
        b,
        fut_target=torch.full_like(b["fut_target"], float("nan")),
        fut_observed=torch.full_like(b["fut_observed"], float("nan")),
    )
    with torch.no_grad():
        torch.manual_seed(5)
        dist = task.forecast_distribution(b)
        torch.manual_seed(5)
        dist_blind = task.forecast_distribution(blind)
        q, q_blind = dist.quantiles([0.1, 0.5, 0.9]), dist_blind.quantiles([0.1, 0.5, 0.9])
        assert q.shape == (4, M, DY, 3)
        assert torch.isfinite(q_blind).all() and torch.allclose(q, q_blind)
        assert (q.diff(dim=-1) >= 0).all()
        assert isinstance(dist, SampleForecast) == task.autoregressive
        if task.autoregressive:
            assert dist.samples.shape == (4, 8, M, DY)
        # validation's deterministic rollout is finite and blind to the truth too
        assert torch.allclose(task.forecast(b), task.forecast(blind))
        informed = dict(b, fut_known=b["fut_known"] + 1.0)
        torch.manual_seed(5)
        assert (task.forecast_distribution(informed).quantiles([0.5]) - q[..., 1:2]).abs().max() > 1e-4


def gaussian_forecaster(task_cls, **options):
    """An untrained forecaster of `task_cls` with a Gaussian head (8 paths) and no past-only
    covariates, and a batch of random windows for it."""
    task = task_cls(
        net=NET,
        d_target=DY,
        d_known=DK,
        d_observed=0,
        context_len=N,
        horizon=M,
        head={"kind": "gaussian", "num_samples": 8},
        **options,
    ).eval()
    b = random_windows(N, M, DY, DK, DO)
    return task, dict(b, hist_observed=b["hist_observed"][..., :0], fut_observed=b["fut_observed"][..., :0])


@pytest.mark.parametrize("task_cls", [EncoderDecoderForecaster, DecoderOnlyForecaster, EncoderForecaster])
@pytest.mark.parametrize("ci", [False, True])
def test_revin_puts_the_distribution_in_data_units(task_cls, ci):
    """A history scaled by 3 and shifted by 10 gives a forecast distribution scaled and shifted alike
    (the network sees the same normalised window; sampled paths draw the same numbers)."""
    torch.manual_seed(0)
    task, b = gaussian_forecaster(task_cls, revin=True, channel_independent=ci)
    moved = dict(b, hist_target=b["hist_target"] * 3.0 + 10.0)
    with torch.no_grad():
        torch.manual_seed(1)
        q = task.forecast_distribution(b).quantiles([0.1, 0.9])
        torch.manual_seed(1)
        q_moved = task.forecast_distribution(moved).quantiles([0.1, 0.9])
    assert torch.allclose(q_moved, q * 3.0 + 10.0, atol=1e-3)


def test_reconstruction_gives_marginal_quantiles_per_step():
    torch.manual_seed(0)
    task = ReconstructionTask(
        net=NET, d_target=DY, d_known=DK, d_observed=DO, context_len=N, horizon=0, head={"kind": "quantile"}
    ).eval()
    with torch.no_grad():
        q = task.forecast_distribution(random_windows(N, M, DY, DK, DO)).quantiles([0.1, 0.5, 0.9])
    assert q.shape == (4, N, DY, 3) and (q.diff(dim=-1) >= 0).all()


@pytest.mark.parametrize("task_cls", [EncoderDecoderForecaster, DecoderOnlyForecaster, EncoderForecaster])
def test_channel_independent_distributions_stay_with_their_channel(task_cls):
    """With channel independence, changing target channel 1's history leaves channel 0's forecast
    distribution as it was (and changes channel 1's): the parameters and paths are put back in the
    right (window, step, channel) places. (Gaussian: its draws take one number each from the
    generator, whatever the parameters; Student-t draws go through rejection sampling.)"""
    torch.manual_seed(0)
    task, b = gaussian_forecaster(task_cls, channel_independent=True)
    changed = dict(b, hist_target=b["hist_target"] + torch.tensor([0.0, 2.0]))
    with torch.no_grad():
        torch.manual_seed(1)
        q = task.forecast_distribution(b).quantiles([0.1, 0.5, 0.9])  # (B, M, Dy, K)
        torch.manual_seed(1)
        q_changed = task.forecast_distribution(changed).quantiles([0.1, 0.5, 0.9])
    assert torch.allclose(q[:, :, 0], q_changed[:, :, 0], atol=1e-5)
    assert (q[:, :, 1] - q_changed[:, :, 1]).abs().mean() > 1e-3


@pytest.mark.slow
def test_sampled_paths_of_a_learned_ar1_spread_like_the_process():
    """Trained on an AR(1) process y_t = 0.9 y_{t-1} + 0.3 e_t, the decoder-only model with a
    Gaussian head samples paths whose spread k steps ahead is the process's,
    0.3 sqrt((1 - 0.9^2k) / (1 - 0.9^2)): one-step distributions fed back compose into the right
    multi-step ones (0.3 at step 1, 0.65 at step 10; paths that ignored their own draws would stay
    near 0.3)."""
    phi, sigma = 0.9, 0.3
    g = torch.Generator().manual_seed(0)

    def series(n, length):
        y = torch.zeros(n, length)
        y[:, 0] = torch.randn(n, generator=g) * sigma / math.sqrt(1 - phi**2)
        for t in range(1, length):
            y[:, t] = phi * y[:, t - 1] + sigma * torch.randn(n, generator=g)
        return y.unsqueeze(-1)  # (n, L, 1)

    torch.manual_seed(0)
    head = GaussianHead()
    model = DecoderOnly(
        DecoderOnlyConfig(d_target=1, d_known=0, d_model=16, n_heads=2, n_layers=1, n_params=2)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(400):
        y = series(64, 40)
        loss = head.loss(head.params(model(y[:, :-1])), y[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    paths = model.generate(series(100, 30), horizon=10, draw=head.sample_of_raw, num_samples=400).view(
        100, 400, 10
    )
    for k in (1, 2, 5, 10):
        expected = sigma * math.sqrt((1 - phi ** (2 * k)) / (1 - phi**2))
        assert abs(paths[:, :, k - 1].std(dim=1).mean() / expected - 1) < 0.1, (k, expected)
