"""Scaled dot-product attention and the attention layers.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V

Two paths compute it, side by side in `scaled_dot_product_attention`:
- the reference path spells the formula out and can return the attention weights (for plots);
- the fused path calls `F.scaled_dot_product_attention` (faster, less memory) and is the default.
Tests check that both agree. Masks are boolean, True = "may attend" (see `masks.py`). A float `bias`
(`positional.RelativePositionBias`: one number per head, query and key) is added to the scores; the
fused path takes it with the mask as one additive float mask (-inf where the mask forbids).

A query whose keys are ALL masked (e.g. a padded query in a padded batch) would give softmax over
all -inf = NaN. Here such a row attends nowhere and its output is defined as zero.

The layers, one class per job, share `MultiHeadAttention` (heads, RoPE, W_O, weight recording):
- `SelfAttention`: Q, K, V from the same tokens; causal in a decoder; its KV cache when decoding.
- `CrossAttention`: Q from the decoder, K/V from the encoder memory, computed once per forecast.
- `ResidualSelfAttention` (RealFormer, He et al. 2021, and PatchTST's encoder): each layer's scores
  before the softmax add the previous layer's, Q_l K_l^T / sqrt(d_k) + S_(l-1), and are passed on
  to the next layer (`residual_attention`). Encoders only, and always the reference path: the next
  layer needs the scores, which the fused kernel does not return.

Sampled trajectories (S paths per window, `KVCache.share`) attend over keys shared by the S paths of
a window (its history, its encoder memory) and keys of their own: `shared_prefix_attention` reads
the shared keys once per window for all S queries, as one matrix product, instead of S copies.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from tsformer.nn.kv_cache import CrossAttentionCache, SelfAttentionCache, SharedPrefixCache
from tsformer.nn.masks import causal_mask, combine_masks
from tsformer.nn.positional import RotaryEmbedding


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    fused: bool = True,
    return_weights: bool = False,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of `q (B, H, Tq, Dh)` over `k, v (B, H, Tk, Dh)`.

    mask: bool, broadcastable to `(B, H, Tq, Tk)`, True = may attend.
    bias: float, broadcastable to `(B, H, Tq, Tk)`, added to the scores (a relative position bias).
    causal: queries are the last `Tq` positions of the key sequence and see no later key.
    return_weights: use the reference path and also return the `(B, H, Tq, Tk)` weights.
    Returns `(out (B, H, Tq, Dh), weights or None)`.
    """
    n_q, n_k = q.shape[-2], k.shape[-2]
    use_is_causal = False
    if causal and n_q > 1:  # a single newest query may see every key: no mask needed
        if mask is None and bias is None and n_q == n_k and fused and not return_weights:
            use_is_causal = True  # lets SDPA pick its causal kernel
        else:
            mask = combine_masks(mask, causal_mask(n_q, n_k, device=q.device))

    mask, has_key = open_rows_with_no_key(mask)
    if fused and not return_weights:
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=additive_mask(mask, bias, q.dtype),
            dropout_p=dropout_p,
            is_causal=use_is_causal,
        )
        weights = None
    else:
        out, weights, _ = reference_attention(q, k, v, mask, dropout_p, bias=bias)
    return zero_rows_with_no_key(out, weights, has_key)


def additive_mask(
    mask: torch.Tensor | None, bias: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """The fused kernel's `attn_mask`: the boolean mask as it is without a bias; with one, the bias where
    the mask allows and -inf where it forbids, `(B, H, Tq, Tk)` (the reference path adds the bias, then
    masks: the same scores)."""
    if bias is None:
        return mask
    bias = bias.to(dtype)
    return bias if mask is None else torch.where(mask, bias, float("-inf"))


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    prev_scores: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The formula spelled out, on a mask whose rows each have a key (`open_rows_with_no_key`).

    prev_scores: added to the scores before the softmax (residual attention); bias: likewise (a
    relative position bias, broadcastable to the scores). Returns `(out
    (B, H, Tq, Dh), weights (B, H, Tq, Tk), scores (B, H, Tq, Tk))`, masked keys' scores at -inf.
    """
    # scaled on q (Tq x Dh numbers), not on the scores (Tq x Tk): the same product, far less work
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
    if prev_scores is not None:
        scores = scores + prev_scores
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights, scores  # out (B, H, Tq, Dh)


def open_rows_with_no_key(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A query whose keys are all masked would softmax to NaN: its row may attend everywhere instead
    (finite), and `zero_rows_with_no_key` zeroes its output after. Returns `(mask, has_key (..., Tq, 1))`."""
    if mask is None:
        return None, None
    has_key = mask.any(dim=-1, keepdim=True)  # (..., Tq, 1): False on fully masked rows
    return mask | ~has_key, has_key


def zero_rows_with_no_key(
    out: torch.Tensor, weights: torch.Tensor | None, has_key: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if has_key is not None:
        out = out.masked_fill(~has_key, 0.0)
        if weights is not None:
            weights = weights.masked_fill(~has_key, 0.0)
    return out, weights


def residual_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prev_scores: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention whose scores add the previous layer's: softmax(q k^T / sqrt(Dh) + prev_scores) v.

    q, k, v as `scaled_dot_product_attention` (no causal option: encoders only); prev_scores:
    `(B, H, Tq, Tk)`, the previous layer's scores, or None in the first layer. Returns `(out
    (B, H, Tq, Dh), weights (B, H, Tq, Tk), scores (B, H, Tq, Tk))`: `scores` (masked keys at -inf)
    are the next layer's `prev_scores`.
    """
    mask, has_key = open_rows_with_no_key(mask)
    out, weights, scores = reference_attention(q, k, v, mask, dropout_p, prev_scores, bias)
    out, weights = zero_rows_with_no_key(out, weights, has_key)
    return out, weights, scores


def shared_prefix_attention(
    q: torch.Tensor,
    k_shared: torch.Tensor,
    v_shared: torch.Tensor,
    n_paths: int,
    k_own: torch.Tensor | None = None,
    v_own: torch.Tensor | None = None,
    shared_mask: torch.Tensor | None = None,
    return_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One new query per path, S paths per sequence, over keys the S paths share and keys of their own.

    q: `(B * S, H, 1, Dh)`, path s of sequence b in row b * S + s; k_shared, v_shared:
    `(B, H, T0, Dh)` (a window's history or encoder memory); k_own, v_own: `(B * S, H, T1, Dh)` or
    None (the path's own earlier steps, the new one included); shared_mask: bool, True = may attend,
    broadcastable to `(B, H, 1, T0)`. The same softmax as `scaled_dot_product_attention` over the
    keys [shared, own], computed in two parts: the shared keys are read once per sequence, for its S
    queries at once (one matrix product), never copied per path. Returns `(out (B * S, H, 1, Dh),
    weights (B * S, H, 1, T0 + T1) or None)`; a query with no key to attend gets zeros.
    """
    BS, H, Tq, Dh = q.shape
    if Tq != 1:
        raise ValueError(f"shared-prefix attention takes one new query per path, got {Tq}")
    S = n_paths
    B = BS // S
    q = q * (1.0 / math.sqrt(Dh))  # scaled once here, not every score
    by_seq = q.view(B, S, H, Dh).transpose(1, 2)  # (B, H, S, Dh): a sequence's S queries side by side
    shared = by_seq @ k_shared.transpose(-2, -1)  # (B, H, S, T0)
    if shared_mask is not None:
        shared = shared.masked_fill(~shared_mask, float("-inf"))
    top = shared.amax(dim=-1, keepdim=True)  # (B, H, S, 1): softmax's shift, over both parts
    if k_own is not None:
        T1 = k_own.shape[2]
        k_own, v_own = k_own.view(B, S, H, T1, Dh), v_own.view(B, S, H, T1, Dh)  # (B * S, ...) -> (B, S, ...)
        own = (q.view(B, S, H, 1, Dh) * k_own).sum(dim=-1).transpose(1, 2)  # (B, H, S, T1): a dot per key
        top = torch.maximum(top, own.amax(dim=-1, keepdim=True))
    top = top.masked_fill(torch.isinf(top), 0.0)  # no key at all: every exp below is 0, the output 0
    e_shared = shared.sub_(top).exp_()  # (B, H, S, T0), in place: the largest tensor here
    denom = e_shared.sum(dim=-1, keepdim=True)  # (B, H, S, 1)
    out = (e_shared @ v_shared).transpose(1, 2)  # (B, H, S, Dh) -> (B, S, H, Dh)
    if k_own is not None:
        e_own = own.sub_(top).exp_()  # (B, H, S, T1)
        denom = denom + e_own.sum(dim=-1, keepdim=True)
        out = out + (e_own.transpose(1, 2).unsqueeze(-1) * v_own).sum(dim=-2)  # (B, S, H, Dh)
    denom = denom.transpose(1, 2).clamp_min(torch.finfo(q.dtype).tiny)  # (B, S, H, 1)
    out = (out / denom).reshape(BS, H, 1, Dh)  # (B, S, H, Dh) -> (B * S, H, 1, Dh)
    weights = None
    if return_weights:
        parts = [e_shared] + ([e_own] if k_own is not None else [])
        weights = torch.cat(parts, dim=-1).transpose(1, 2) / denom  # (B, S, H, T0 + T1)
        weights = weights.reshape(BS, H, 1, -1)  # (B * S, H, 1, T0 + T1)
    return out, weights


def stacked_projections(d_model: int, n: int, bias: bool) -> nn.Linear:
    """n projections d_model -> d_model side by side, as one `nn.Linear(d_model, n * d_model)`.

    Each block is initialised as its own `nn.Linear(d_model, d_model)`, one after the other: the same
    distribution as one wide layer (both bound by 1 / sqrt(d_model)), and a seeded run draws the same
    weights as with n separate layers.
    """
    blocks = [nn.Linear(d_model, d_model, bias=bias) for _ in range(n)]
    # torch's default device and dtype, as the blocks; skip_init: the stacked layer draws nothing of its own
    like = {"device": blocks[0].weight.device, "dtype": blocks[0].weight.dtype}
    stacked = torch.nn.utils.skip_init(nn.Linear, d_model, n * d_model, bias=bias, **like)
    with torch.no_grad():
        stacked.weight.copy_(torch.cat([b.weight for b in blocks]))  # (n * d_model, d_model)
        if bias:
            stacked.bias.copy_(torch.cat([b.bias for b in blocks]))
    return stacked


class MultiHeadAttention(nn.Module):
    """What every attention layer shares; the layers themselves are its subclasses, one per job:

    - `SelfAttention`: Q, K and V from the same tokens, causal in a decoder, with its KV cache;
    - `CrossAttention`: Q from the decoder's tokens, K and V from the encoder memory, fixed for a
      forecast and so computed once when decoding with a cache;
    - `ResidualSelfAttention`: an encoder's self-attention whose scores add the previous layer's.

    Shared here: H heads of Dh = d_model / H, the RoPE rotation, the attention itself (`attend`:
    fused or the reference path, `scaled_dot_product_attention`), the output projection W_O and the
    recording of the weights for plots (`record_attention`). Each subclass builds its input
    projections and then `out_proj`, in that order: the order in which a seeded run draws them.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, rope: RotaryEmbedding | None, fused: bool):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout  # on the attention weights, in training
        self.rope = rope
        self.fused = fused
        # When True (see `record_attention`), the reference path runs and keeps the weights here.
        self.record_weights = False
        self.last_weights: torch.Tensor | None = None

    def split_heads(self, x: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        """`(B, T, n * d_model)`, n projections side by side -> n tensors `(B, H, T, Dh)` (views)."""
        B, T, _ = x.shape
        heads = x.view(B, T, n, self.n_heads, self.head_dim)  # (B, T, n, H, Dh)
        return heads.permute(2, 0, 3, 1, 4).unbind(0)  # (n, B, H, T, Dh) -> n x (B, H, T, Dh)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """Queries or keys `(B, H, T, Dh)` rotated by their positions `(T,)` with RoPE, else as they are."""
        return x if self.rope is None else self.rope(x, positions)

    @property
    def dropout_p(self) -> float:
        return self.dropout if self.training else 0.0

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool = False,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Heads `q (B, H, Tq, Dh)` over `k, v (B, H, Tk, Dh)` -> `(B, H, Tq, Dh)`: the fused kernel,
        or the reference path when the layer is built with `fused=False` or records its weights.
        bias: added to the scores, broadcastable to `(B, H, Tq, Tk)` (a relative position bias)."""
        out, weights = scaled_dot_product_attention(
            q, k, v, mask, causal, self.dropout_p, self.fused, self.record_weights, bias
        )
        self.keep(weights)
        return out

    def attend_shared(
        self,
        q: torch.Tensor,
        k_shared: torch.Tensor,
        v_shared: torch.Tensor,
        n_paths: int,
        k_own: torch.Tensor | None = None,
        v_own: torch.Tensor | None = None,
        shared_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`attend` for sampled paths: S = n_paths queries `(B * S, H, 1, Dh)` per sequence of the shared
        `k_shared, v_shared (B, H, T0, Dh)`, and their own keys (`shared_prefix_attention`)."""
        out, weights = shared_prefix_attention(
            q, k_shared, v_shared, n_paths, k_own, v_own, shared_mask, return_weights=self.record_weights
        )
        self.keep(weights)
        return out  # (B * S, H, 1, Dh)

    def keep(self, weights: torch.Tensor | None) -> None:
        """Keeps a call's weights for plots while recording (`record_attention`)."""
        if self.record_weights:
            self.last_weights = weights.detach()  # (B, H, Tq, Tk)

    def merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        """Heads `(B, H, Tq, Dh)` -> `(B, Tq, d_model)` through W_O."""
        B, H, Tq, Dh = out.shape
        out = out.transpose(1, 2).reshape(B, Tq, H * Dh)  # (B, Tq, H, Dh) -> (B, Tq, d_model)
        return self.out_proj(out)


class SelfAttention(MultiHeadAttention):
    """Self-attention: Q, K and V are projections of the same tokens, stacked into one product
    `qkv_proj` = [W_Q; W_K; W_V] (the same numbers as three products, in one kernel launch).

    Decoding with a cache, each call projects only the new tokens and attends over every key cached
    so far: a `SelfAttentionCache` (one sequence per row) or a `SharedPrefixCache` (S sampled paths
    per sequence, whose shared history is kept and read once).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        rope: RotaryEmbedding | None = None,
        fused: bool = True,
    ):
        super().__init__(d_model, n_heads, dropout, rope, fused)
        self.qkv_proj = stacked_projections(d_model, 3, bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        positions: torch.Tensor | None = None,
        cache: SelfAttentionCache | SharedPrefixCache | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: `(B, Tq, d_model)` -> `(B, Tq, d_model)`.

        mask: bool, broadcastable to `(B, H, Tq, Tk)`, True = may attend. causal: each token sees no
        later one. positions: `(Tq,)` absolute positions (RoPE). cache: the new tokens continue after
        those cached, whose keys they all see (a single new token needs no causal mask). bias: float,
        broadcastable to `(B, H, Tq, Tk)`, added to the scores (an encoder's relative position bias).
        """
        q, k, v = self.split_heads(self.qkv_proj(x), 3)  # (B, H, Tq, Dh) each
        q, k = self.rotate(q, positions), self.rotate(k, positions)
        if bias is not None and cache is not None:
            raise ValueError("a relative position bias is for encoders: a KV cache keeps no key positions")
        if isinstance(cache, SharedPrefixCache):  # sampled paths continuing a shared history
            k_own, v_own = cache.append(k, v)  # the paths' own (B * S, H, T1, Dh)
            out = self.attend_shared(
                q, cache.k_prefix, cache.v_prefix, cache.n_paths, k_own=k_own, v_own=v_own
            )
            return self.merge_heads(out)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, T_cached + Tq, Dh)
        return self.merge_heads(self.attend(q, k, v, mask, causal, bias))


class CrossAttention(MultiHeadAttention):
    """Cross-attention of a decoder to the encoder memory: queries from the decoder's tokens
    (`q_proj`), keys and values from the memory (`kv_proj` = [W_K; W_V], one product).

    The memory is fixed for a forecast, and so are its K/V (`memory_kv`): decoding with a
    `CrossAttentionCache`, they are computed at the first step and reused at every later one.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        rope: RotaryEmbedding | None = None,
        fused: bool = True,
    ):
        super().__init__(d_model, n_heads, dropout, rope, fused)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.kv_proj = stacked_projections(d_model, 2, bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def memory_kv(
        self, memory: torch.Tensor, memory_positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """memory `(B, Tk, d_model)`, memory_positions `(Tk,)` (RoPE) -> K, V `(B, H, Tk, Dh)`."""
        k, v = self.split_heads(self.kv_proj(memory), 2)  # (B, H, Tk, Dh) each
        return self.rotate(k, memory_positions), v

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        memory_positions: torch.Tensor | None = None,
        cache: CrossAttentionCache | None = None,
    ) -> torch.Tensor:
        """x: `(B, Tq, d_model)` decoder tokens, memory: `(B, Tk, d_model)` -> `(B, Tq, d_model)`.

        mask: bool, broadcastable to `(B, H, Tq, Tk)`, True = may attend (the memory's padding).
        positions / memory_positions: `(Tq,)` / `(Tk,)` on the time axis both share (RoPE). cache:
        holds the memory's K/V after the first call; once shared by S sampled paths per sequence
        (`KVCache.share`), x has B * S rows while the memory, its K/V and mask keep B.
        """
        (q,) = self.split_heads(self.q_proj(x), 1)  # (B, H, Tq, Dh)
        q = self.rotate(q, positions)
        if cache is None:
            k, v = self.memory_kv(memory, memory_positions)
        else:
            if not cache.filled:
                cache.store(*self.memory_kv(memory, memory_positions))
            k, v = cache.k, cache.v  # (B, H, Tk, Dh)
            if cache.n_paths > 1:  # the memory's K/V once per sequence for its S paths
                return self.merge_heads(self.attend_shared(q, k, v, cache.n_paths, shared_mask=mask))
        return self.merge_heads(self.attend(q, k, v, mask))


class ResidualSelfAttention(MultiHeadAttention):
    """An encoder's self-attention whose scores add the previous layer's (`residual_attention`;
    PatchTST). Same projections as `SelfAttention`; no causal mask and no cache. Always the reference
    path: the next layer needs the scores, which the fused kernel does not return.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        rope: RotaryEmbedding | None = None,
    ):
        super().__init__(d_model, n_heads, dropout, rope, fused=False)
        self.qkv_proj = stacked_projections(d_model, 3, bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        prev_scores: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: `(B, T, d_model)`; prev_scores: the previous layer's `(B, H, T, T)` scores, None in the
        first layer; bias: added to this layer's scores (a relative position bias). Returns `(out
        (B, T, d_model), scores (B, H, T, T))`, the scores for the next."""
        q, k, v = self.split_heads(self.qkv_proj(x), 3)  # (B, H, T, Dh) each
        q, k = self.rotate(q, positions), self.rotate(k, positions)
        out, weights, scores = residual_attention(q, k, v, prev_scores, mask, self.dropout_p, bias)
        self.keep(weights)
        return self.merge_heads(out), scores


@contextlib.contextmanager
def record_attention(model: nn.Module):
    """Within this context every attention layer of `model` keeps its weights in `.last_weights`.

    Usage: `with record_attention(model): model(x)`, then read `m.last_weights` (B, H, Tq, Tk).
    """
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    for m in layers:
        m.record_weights = True
    try:
        yield layers
    finally:
        for m in layers:
            m.record_weights = False


@contextlib.contextmanager
def collect_attention(model: nn.Module):
    """Within this context every call of every attention layer of `model` appends its weights.

    Yields `{layer name: [weights of each call (B, H, Tq, Tk)]}`, the names as in
    `model.named_modules()` (e.g. `decoder.blocks.0.cross_attn`). One forward pass makes one call per
    layer; autoregressive decoding with a KV cache makes one call per step (see `stack_query_rows`).
    Like `record_attention`, it runs the reference path, also where the layers are fused.
    """
    layers = {name: m for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)}
    calls = {name: [] for name in layers}

    def keep(name):
        return lambda module, args, output: calls[name].append(module.last_weights)

    hooks = [m.register_forward_hook(keep(name)) for name, m in layers.items()]
    try:
        with record_attention(model):
            yield calls
    finally:
        for hook in hooks:
            hook.remove()


def stack_query_rows(calls: list[torch.Tensor]) -> torch.Tensor:
    """The calls of one layer during cached decoding, as one map `(B, H, sum Tq, max Tk)`.

    With a KV cache each call adds the queries of the new tokens, which see the keys cached so far:
    a later call has more keys. Keys that did not exist yet at a call are keys its queries could not
    see, weight 0, as under the causal mask; so the rows of a cached self-attention stack into the
    same lower-triangular map as one causal pass over all tokens.
    """
    n_keys = max(w.shape[-1] for w in calls)
    padded = [F.pad(w, (0, n_keys - w.shape[-1])) for w in calls]  # (B, H, Tq_i, n_keys) each
    return torch.cat(padded, dim=-2)  # (B, H, sum Tq_i, n_keys)
