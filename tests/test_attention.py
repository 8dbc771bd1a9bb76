"""Attention: the reference path, the fused path and PyTorch's own MultiheadAttention agree."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tsformer.nn.attention import (
    CrossAttention,
    MultiHeadAttention,
    ResidualSelfAttention,
    SelfAttention,
    record_attention,
    residual_attention,
    scaled_dot_product_attention,
    stacked_projections,
)
from tsformer.nn.config import TransformerConfig
from tsformer.nn.kv_cache import CrossAttentionCache, SelfAttentionCache
from tsformer.nn.masks import causal_mask, combine_masks, lengths_to_valid, padding_mask
from tsformer.nn.positional import RotaryEmbedding

B, H, DH = 3, 4, 8


def qkv(n_q, n_k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, n_q, DH, generator=g),
        torch.randn(B, H, n_k, DH, generator=g),
        torch.randn(B, H, n_k, DH, generator=g),
    )


def masks_for(n_q, n_k):
    valid = lengths_to_valid(torch.tensor([n_k, n_k - 2, 1]), n_k)
    return {
        "none": (None, False),
        "causal": (None, True),
        "padding": (padding_mask(valid), False),
        "causal+padding": (padding_mask(valid), True),
    }


@pytest.mark.parametrize("n_q,n_k", [(6, 6), (1, 9), (4, 9)])
@pytest.mark.parametrize("kind", ["none", "causal", "padding", "causal+padding"])
def test_reference_and_fused_agree(n_q, n_k, kind):
    q, k, v = qkv(n_q, n_k)
    mask, causal = masks_for(n_q, n_k)[kind]
    fused, _ = scaled_dot_product_attention(q, k, v, mask=mask, causal=causal, fused=True)
    ref, weights = scaled_dot_product_attention(
        q, k, v, mask=mask, causal=causal, fused=False, return_weights=True
    )
    assert torch.allclose(fused, ref, atol=1e-5), (fused - ref).abs().max()
    assert weights.shape == (B, H, n_q, n_k)
    assert torch.allclose(weights.sum(-1), torch.ones(B, H, n_q), atol=1e-5)


def test_reference_matches_the_formula():
    q, k, v = qkv(5, 7)
    expected = torch.softmax(q @ k.transpose(-2, -1) / DH**0.5, dim=-1) @ v
    out, _ = scaled_dot_product_attention(q, k, v, fused=False)
    assert torch.allclose(out, expected, atol=1e-6)


def test_causal_weights_are_zero_above_the_diagonal():
    q, k, v = qkv(5, 5)
    _, w = scaled_dot_product_attention(q, k, v, causal=True, fused=False, return_weights=True)
    upper = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    assert w[..., upper].abs().max() == 0
    assert w[..., ~upper].min() > 0


@pytest.mark.parametrize("fused", [True, False])
def test_fully_masked_row_is_zero_not_nan(fused):
    q, k, v = qkv(4, 6)
    mask = torch.ones(B, 1, 4, 6, dtype=torch.bool)
    mask[0, :, 2] = False  # query 2 of sample 0 may attend nowhere
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask, fused=fused)
    assert not torch.isnan(out).any()
    assert out[0, :, 2].abs().max() == 0
    assert out[0, :, 1].abs().max() > 0
    # a padded batch whose first query sees only padding under a causal mask (left padding)
    valid = torch.tensor([[False, False, True, True, True, True]] * B)
    out, _ = scaled_dot_product_attention(*qkv(6, 6), mask=padding_mask(valid), causal=True, fused=fused)
    assert not torch.isnan(out).any() and out[:, :, :2].abs().max() == 0


def test_masks_follow_the_may_attend_convention():
    m = causal_mask(3, 5)  # three newest queries of five positions
    assert m.tolist() == [[True, True, True, False, False], [True, True, True, True, False], [True] * 5]
    valid = lengths_to_valid(torch.tensor([2, 3]), 3)
    assert padding_mask(valid).shape == (2, 1, 1, 3)
    both = combine_masks(padding_mask(valid), causal_mask(3))
    assert both.shape == (2, 1, 3, 3)
    assert both[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert combine_masks(None, None) is None
    with pytest.raises(TypeError):
        padding_mask(torch.ones(2, 3))


def copy_into_torch_mha(ours: MultiHeadAttention, d_model: int, n_heads: int) -> nn.MultiheadAttention:
    """torch's attention with our weights: its in_proj is [W_Q; W_K; W_V], as our stacked projections."""
    ref = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    projections = [ours.q_proj, ours.kv_proj] if isinstance(ours, CrossAttention) else [ours.qkv_proj]
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([p.weight for p in projections]))
        ref.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref.eval()


@pytest.mark.parametrize("fused", [True, False])
def test_multi_head_attention_matches_torch(fused):
    torch.manual_seed(0)
    d_model, n_heads, n_q, n_k = 32, 4, 5, 7
    x, ctx = torch.randn(2, n_q, d_model), torch.randn(2, n_k, d_model)
    # self-attention with a causal mask (torch: True = NOT allowed)
    ours = SelfAttention(d_model, n_heads, fused=fused).eval()
    expected, _ = copy_into_torch_mha(ours, d_model, n_heads)(x, x, x, attn_mask=~causal_mask(n_q))
    assert torch.allclose(ours(x, causal=True), expected, atol=1e-5)
    # cross-attention with key padding
    ours = CrossAttention(d_model, n_heads, fused=fused).eval()
    valid = lengths_to_valid(torch.tensor([n_k, 4]), n_k)
    expected, _ = copy_into_torch_mha(ours, d_model, n_heads)(x, ctx, ctx, key_padding_mask=~valid)
    assert torch.allclose(ours(x, ctx, mask=padding_mask(valid)), expected, atol=1e-5)


def test_stacked_projections_draw_what_separate_layers_draw():
    torch.manual_seed(3)
    separate = [nn.Linear(8, 8) for _ in range(3)]
    torch.manual_seed(3)
    stacked = stacked_projections(8, 3, bias=True)
    assert torch.equal(stacked.weight, torch.cat([p.weight for p in separate]))  # (24, 8): [W_Q; W_K; W_V]
    assert torch.equal(stacked.bias, torch.cat([p.bias for p in separate]))
    assert stacked_projections(8, 2, bias=False).bias is None


def test_self_attention_with_its_cache_equals_one_causal_pass():
    """Tokens fed a few at a time through a `SelfAttentionCache` see what one causal pass shows them."""
    torch.manual_seed(0)
    attn = SelfAttention(16, 2, rope=RotaryEmbedding(8)).eval()
    x, positions = torch.randn(2, 7, 16), torch.arange(7)
    cache = SelfAttentionCache(max_len=7)
    steps = [(0, 4), (4, 5), (5, 7)]  # a prefill of 4 tokens, then 1, then 2
    cached = [attn(x[:, a:b], causal=True, positions=positions[a:b], cache=cache) for a, b in steps]
    assert cache.length == 7
    torch.testing.assert_close(torch.cat(cached, dim=1), attn(x, causal=True, positions=positions))


def test_cross_attention_computes_the_memory_kv_once_per_cache():
    """The memory is fixed for a forecast: through a `CrossAttentionCache` its K/V are projected at the
    first step only, and every step attends as it would without the cache."""
    torch.manual_seed(0)
    attn = CrossAttention(16, 2, rope=RotaryEmbedding(8)).eval()
    x, memory = torch.randn(2, 4, 16), torch.randn(2, 6, 16)
    mask = padding_mask(lengths_to_valid(torch.tensor([6, 3]), 6))
    projections = []
    attn.kv_proj.register_forward_hook(lambda module, args, out: projections.append(out))
    cache = CrossAttentionCache()
    steps = [
        attn(x[:, t : t + 1], memory, mask, torch.tensor([6 + t]), torch.arange(6), cache=cache)
        for t in range(4)
    ]
    assert len(projections) == 1 and cache.filled
    expected = attn(x, memory, mask, torch.arange(6, 10), torch.arange(6))
    torch.testing.assert_close(torch.cat(steps, dim=1), expected)


def test_record_attention_keeps_weights_and_switches_back():
    torch.manual_seed(0)
    mha = SelfAttention(16, 2).eval()
    x = torch.randn(2, 5, 16)
    plain = mha(x, causal=True)
    with record_attention(mha) as layers:
        recorded = mha(x, causal=True)
    assert layers == [mha]
    assert torch.allclose(plain, recorded, atol=1e-5)
    assert mha.last_weights.shape == (2, 2, 5, 5)
    assert not mha.record_weights


@pytest.mark.parametrize("kind", ["none", "padding"])
def test_residual_attention_adds_the_previous_scores(kind):
    """softmax(q k^T / sqrt(Dh) + prev) v, checked against the fused kernel given prev as an additive
    mask; the scores it passes on are that sum, masked keys at -inf."""
    q, k, v = qkv(6, 6)
    prev = torch.randn(B, H, 6, 6, generator=torch.Generator().manual_seed(1))
    mask, _ = masks_for(6, 6)[kind]
    out, weights, scores = residual_attention(q, k, v, prev, mask=mask)

    expected_scores = q @ k.transpose(-2, -1) / DH**0.5 + prev
    additive = prev if mask is None else prev.masked_fill(~mask, float("-inf"))
    if mask is not None:
        expected_scores = expected_scores.masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(scores, expected_scores)
    torch.testing.assert_close(
        out, F.scaled_dot_product_attention(q, k, v, attn_mask=additive), atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, 6))

    # the first layer (no previous scores) is plain attention
    first, _, _ = residual_attention(q, k, v, None, mask=mask)
    torch.testing.assert_close(
        first, scaled_dot_product_attention(q, k, v, mask=mask)[0], atol=1e-5, rtol=1e-5
    )


def test_residual_self_attention_returns_its_scores_and_refuses_other_uses():
    from tsformer.nn.blocks import TransformerBlock

    torch.manual_seed(0)
    plain = SelfAttention(16, 4).eval()
    residual = ResidualSelfAttention(16, 4).eval()
    residual.load_state_dict(plain.state_dict())  # the same parameters
    x = torch.randn(2, 5, 16)
    out, scores = residual(x)
    assert scores.shape == (2, 4, 5, 5)
    torch.testing.assert_close(out, plain(x), atol=1e-5, rtol=1e-5)
    out2, scores2 = residual(x, prev_scores=scores)
    assert not torch.allclose(out2, out, atol=1e-3)  # the previous scores change the weights
    torch.testing.assert_close(scores2, scores + scores)  # same input, same own scores, plus the previous

    block = TransformerBlock(TransformerConfig(d_model=16, n_heads=4, residual_attention=True)).eval()
    assert isinstance(block.self_attn, ResidualSelfAttention)
    with pytest.raises(ValueError, match="no causal mask, no KV cache"):
        block(x, causal=True)
    with pytest.raises(ValueError, match="no causal mask, no KV cache"):
        block(x, self_cache=SelfAttentionCache(5))


@pytest.mark.parametrize("attention_dropout, expected", [(None, 0.3), (0.0, 0.0), (0.1, 0.1)])
def test_attention_dropout_sets_the_weights_dropout_only(attention_dropout, expected):
    """`attention_dropout` drops attention weights (None: `dropout`); `dropout` stays on the residual
    branches and the FFN (PatchTST's code: 0 on the weights, 0.2-0.3 elsewhere)."""
    from tsformer.models.encoder_only import EncoderOnly, EncoderOnlyConfig

    cfg = EncoderOnlyConfig(
        d_model=16, n_heads=2, n_layers=2, dropout=0.3, attention_dropout=attention_dropout
    )
    model = EncoderOnly(cfg).train()
    attentions = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(attentions) == 2 and all(m.dropout == expected for m in attentions)
    dropouts = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(p == 0.3 for p in dropouts)
    if expected == 0.0:  # in training mode, the weights are the same from one call to the next
        x = torch.randn(2, 5, 16)
        a = attentions[0]
        assert torch.equal(a(x), a(x))


class CountingDropout(nn.Module):
    """Stands in for a block's dropout: counts the tensors passed through it, returns them as they are."""

    def __init__(self, p: float):
        super().__init__()
        self.p, self.calls = p, 0

    def forward(self, x):
        self.calls += 1
        return x


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("attention_output_dropout, expected", [(None, 0.3), (0.51, 0.51)])
def test_attention_output_dropout_is_the_attention_sublayers_residual_dropout(
    cross, attention_output_dropout, expected
):
    """`attention_output_dropout` (None: `dropout`) drops the output of every attention sublayer (self,
    and cross in a decoder block) before the residual add; the FFN's output keeps `dropout`."""
    from tsformer.nn.blocks import TransformerBlock

    cfg = TransformerConfig(
        d_model=16, n_heads=2, dropout=0.3, attention_output_dropout=attention_output_dropout
    )
    block = TransformerBlock(cfg, cross_attention=cross)
    assert block.dropout_attn.p == expected and block.dropout.p == 0.3
    block.dropout_attn, block.dropout = CountingDropout(expected), CountingDropout(0.3)
    x = torch.randn(2, 5, 16)
    block(x, memory=torch.randn(2, 3, 16) if cross else None)
    assert (block.dropout_attn.calls, block.dropout.calls) == (2 if cross else 1, 1)


def test_attention_output_dropout_acts_in_training_only():
    from tsformer.nn.blocks import TransformerBlock

    block = TransformerBlock(
        TransformerConfig(d_model=16, n_heads=2, dropout=0.0, attention_output_dropout=0.5)
    )
    x = torch.randn(2, 5, 16)
    assert not torch.equal(block.train()(x)[0], block(x)[0])  # a fresh draw each call
    assert torch.equal(block.eval()(x)[0], block(x)[0])


@pytest.mark.parametrize("name", ["dropout", "attention_dropout", "attention_output_dropout"])
@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_dropout_settings_outside_0_1_are_refused_by_name(name, p):
    from tsformer.models.encoder_only import EncoderOnly, EncoderOnlyConfig

    with pytest.raises(
        ValueError, match=rf"model\.net\.{name}={p}: a dropout probability must be in \[0, 1\)"
    ):
        EncoderOnly(EncoderOnlyConfig(d_model=16, n_heads=2, **{name: p}))
