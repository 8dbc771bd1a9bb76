"""Attention maps of a trained model (`WindowTask.attention_maps`) and the figure every run logs.

For each family, the maps of one test window have the shapes its token sequences give, rows that
sum to 1 (a causal map: zero above the diagonal), and they are what the forecast computed: the
rows of a cached autoregressive rollout stacked equal one causal pass over the same tokens, and
recording switches fused layers to the reference path without changing the forecast.
"""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate
from torch.utils.data import default_collate

from conftest import TINY
from tsformer.jobs.forecasting.export import SplitView
from tsformer.jobs.forecasting.plots import attention_figure
from tsformer.nn.attention import MultiHeadAttention, collect_attention
from tsformer.train import build_task, compose_config

H = 2  # heads (TINY)


def build(tmp_path, *overrides):
    """The data module and the (untrained) task `python train.py <overrides>` would build."""
    cfg = compose_config([*TINY, "model.net.n_layers=2", *overrides], tmp_path)
    dm = instantiate(cfg.data)
    dm.setup()
    torch.manual_seed(0)
    return dm, build_task(cfg.model, dm).eval()


def one_test_window(dm, index=0):
    return default_collate([dm.datasets["test"][index]])


def check_rows(weights: torch.Tensor, causal: bool = False):
    """Each query's weights sum to 1; a causal map has nothing above its diagonal."""
    assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5)
    if causal:
        above = torch.triu(torch.ones(weights.shape[-2:], dtype=torch.bool), diagonal=1)
        assert weights[..., above].abs().max() == 0


def test_encoder_only_maps(tmp_path):
    dm, task = build(tmp_path, "model=enc_only")
    maps = task.attention_maps(one_test_window(dm))
    N = dm.context_len
    assert list(maps) == ["encoder.blocks.0.self_attn", "encoder.blocks.1.self_attn"]
    for weights in maps.values():
        assert weights.shape == (1, H, N, N)
        check_rows(weights)


def test_encoder_forecast_maps_cover_history_and_future_known_tokens(tmp_path):
    dm, task = build(tmp_path, "model=enc_only_forecast")
    maps = task.attention_maps(one_test_window(dm))
    T = dm.context_len + dm.horizon  # the plant has known covariates: history + future tokens
    assert [w.shape for w in maps.values()] == [(1, H, T, T)] * 2


def test_decoder_only_maps_of_the_cached_rollout_are_one_causal_pass(tmp_path):
    dm, task = build(tmp_path, "model=dec_only")
    batch = one_test_window(dm)
    maps = task.attention_maps(batch)
    N, M = dm.context_len, dm.horizon
    assert list(maps) == ["decoder.blocks.0.self_attn", "decoder.blocks.1.self_attn"]
    for weights in maps.values():
        assert weights.shape == (1, H, N + M - 1, N + M - 1)  # every token but the last prediction's
        check_rows(weights, causal=True)

    # The same tokens in one causal pass (history, then the generated predictions fed back): the
    # maps must be equal, row for row, to those stacked from the cached steps.
    net = task.net
    known = torch.cat([batch["hist_known"], batch["fut_known"]], dim=1)  # (1, N + M, Dk)
    pred = net.generate(batch["hist_target"], batch["hist_known"], batch["fut_known"])  # (1, M, Dy)
    target_prev = torch.cat([batch["hist_target"], pred[:, :-1]], dim=1)  # (1, N + M - 1, Dy)
    with torch.no_grad(), collect_attention(net) as calls:
        net(target_prev, known[:, 1:])
    for name, weights in maps.items():
        (one_pass,) = calls[name]
        assert torch.allclose(weights, one_pass, atol=1e-5), name


def test_encoder_decoder_maps_self_and_cross(tmp_path):
    dm, task = build(tmp_path, "model=enc_dec", "model.net.n_decoder_layers=1")
    maps = task.attention_maps(one_test_window(dm))
    N, M = dm.context_len, dm.horizon
    assert {name: tuple(w.shape) for name, w in maps.items()} == {
        "encoder.blocks.0.self_attn": (1, H, N, N),
        "encoder.blocks.1.self_attn": (1, H, N, N),
        "decoder.blocks.0.self_attn": (1, H, M, M),
        "decoder.blocks.0.cross_attn": (1, H, M, N),
    }
    check_rows(maps["decoder.blocks.0.self_attn"], causal=True)
    check_rows(maps["decoder.blocks.0.cross_attn"])


def test_channel_independent_patched_maps_have_one_series_per_target(tmp_path):
    dm, task = build(tmp_path, "model=enc_dec", "model.channel_independent=true", "model.patch_len=8")
    maps = task.attention_maps(one_test_window(dm))
    L = (dm.context_len - 8) // 8 + 2  # patch tokens of the history
    assert maps["encoder.blocks.0.self_attn"].shape == (dm.d_target, H, L, L)
    assert maps["decoder.blocks.0.cross_attn"].shape == (dm.d_target, H, dm.horizon, L)


def test_recording_uses_the_reference_path_and_leaves_fused_layers_as_they_were(tmp_path):
    dm, fused = build(tmp_path, "model=enc_dec")  # fused_attention: true by default
    _, reference = build(tmp_path, "model=enc_dec", "model.net.fused_attention=false")
    reference.load_state_dict(fused.state_dict())
    batch = one_test_window(dm)
    before = fused.forecast(batch)
    maps = fused.attention_maps(batch)
    for name, weights in reference.attention_maps(batch).items():
        assert torch.allclose(maps[name], weights, atol=1e-6), name
    assert torch.allclose(fused.forecast(batch), before, atol=1e-6)
    layers = [m for m in fused.modules() if isinstance(m, MultiHeadAttention)]
    assert layers and all(m.fused and not m.record_weights and not m._forward_hooks for m in layers)


@pytest.mark.parametrize("family", ["enc_only", "dec_only", "enc_dec"])
def test_figure_has_a_panel_per_layer_and_head(tmp_path, family):
    dm, task = build(tmp_path, f"model={family}")
    fig = attention_figure(task, SplitView.of(dm, "test"), dm.datasets["test"])
    n_maps = len(task.attention_maps(one_test_window(dm, dm.n_windows("test") // 2)))
    images = [ax for ax in fig.axes if ax.images]
    assert len(images) == n_maps * H
    assert f"test window {dm.n_windows('test') // 2}" in fig._suptitle.get_text()
