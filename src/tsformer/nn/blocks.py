"""Transformer blocks and stacks.

A block is self-attention, optionally cross-attention (decoder of an encoder-decoder), and a
position-wise feed-forward network, each wrapped in a residual connection with a norm:

    Pre-Norm  (modern default):  x = x + Dropout(Sublayer(LayerNorm(x)))   + a final LayerNorm
    Post-Norm (original paper):  x = LayerNorm(x + Dropout(Sublayer(x)))

Pre-Norm keeps an identity path from input to output and trains stably; Post-Norm normalises the
residual stream after each sublayer and needs a learning-rate warmup.

The norm itself (`norm_layer`): LayerNorm (each token over its d_model features) or BatchNorm (each
feature over all the batch's tokens in training, with the running averages kept then at test time), as
PatchTST's encoder, with Post-Norm. BatchNorm's training statistics mix every step of the batch,
future steps included, so a causal stack refuses it, and so does a padded sequence (its padding
would enter the statistics).

Residual attention (`residual_attention`, PatchTST's encoder): each block's self-attention scores
add the previous block's before the softmax (`attention.ResidualSelfAttention`); every block returns
`(x, scores)` and the stack carries the scores from block to block. Encoder stacks only.

A relative position bias (`model.net.positional=relative_bias`, `positional.RelativePositionBias`): the
stack holds one table, computes the `(H, T, T)` bias once per pass from the tokens' positions and every
block's self-attention adds it to its scores. Encoder stacks only (a decoder's KV cache keeps no key
positions).
"""

from __future__ import annotations

import torch
from torch import nn

from tsformer.nn.attention import CrossAttention, ResidualSelfAttention, SelfAttention
from tsformer.nn.config import TransformerConfig
from tsformer.nn.dropout import Dropout
from tsformer.nn.kv_cache import CrossAttentionCache, KVCache, SelfAttentionCache, SharedPrefixCache
from tsformer.nn.positional import RelativePositionBias, RotaryEmbedding

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}
NORMS = ("pre", "post")
NORM_LAYERS = ("layer", "batch")


class BatchNormOverTokens(nn.Module):
    """BatchNorm1d on `(B, T, D)`: each of the D features normalised over all B * T tokens."""

    def __init__(self, d_model: int):
        super().__init__()
        self.norm = nn.BatchNorm1d(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, 2)).transpose(1, 2)  # (B, D, T) for BatchNorm1d, back to (B, T, D)


def make_norm(cfg: TransformerConfig) -> nn.Module:
    if cfg.norm_layer not in NORM_LAYERS:
        raise ValueError(f"unknown model.net.norm_layer {cfg.norm_layer!r}; choose one of {NORM_LAYERS}")
    return BatchNormOverTokens(cfg.d_model) if cfg.norm_layer == "batch" else nn.LayerNorm(cfg.d_model)


class FeedForward(nn.Module):
    """Two linear layers applied to every step alone: d_model -> expansion * d_model -> d_model.

    fast_dropout: the dropout's fast mask (`nn/dropout.py`); off: torch's dropout.
    """

    def __init__(
        self,
        d_model: int,
        expansion: int = 4,
        activation: str = "gelu",
        dropout: float = 0.0,
        fast_dropout: bool = False,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
        self.net = nn.Sequential(
            nn.Linear(d_model, expansion * d_model),
            ACTIVATIONS[activation](),
            Dropout(dropout, fast_dropout),
            nn.Linear(expansion * d_model, d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TransformerBlock(nn.Module):
    def __init__(
        self, cfg: TransformerConfig, cross_attention: bool = False, rope: RotaryEmbedding | None = None
    ):
        super().__init__()
        if cfg.norm not in NORMS:
            raise ValueError(f"unknown norm placement {cfg.norm!r}; choose one of {NORMS}")
        self.pre_norm = cfg.norm == "pre"
        heads = (cfg.d_model, cfg.n_heads, cfg.attention_weights_dropout, cfg.bias, rope)
        self.residual_attention = cfg.residual_attention
        if cfg.residual_attention:
            self.self_attn = ResidualSelfAttention(*heads)
        else:
            self.self_attn = SelfAttention(*heads, cfg.fused_attention)
        self.norm_self = make_norm(cfg)
        self.cross_attn = CrossAttention(*heads, cfg.fused_attention) if cross_attention else None
        self.norm_cross = make_norm(cfg) if cross_attention else None
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_expansion, cfg.activation, cfg.dropout, cfg.fast_dropout)
        self.norm_ffn = make_norm(cfg)
        self.dropout = Dropout(cfg.dropout, cfg.fast_dropout)  # on the FFN's output
        # on the attention sublayers' outputs
        self.dropout_attn = Dropout(cfg.attention_residual_dropout, cfg.fast_dropout)

    def _residual(self, x: torch.Tensor, norm: nn.Module, sublayer, dropout: nn.Module) -> torch.Tensor:
        if self.pre_norm:
            return x + dropout(sublayer(norm(x)))
        return norm(x + dropout(sublayer(x)))

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        positions: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        memory_positions: torch.Tensor | None = None,
        self_cache: SelfAttentionCache | SharedPrefixCache | None = None,
        cross_cache: CrossAttentionCache | None = None,
        prev_scores: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: `(B, T, d_model)`; memory: `(B, N, d_model)` encoder output for cross-attention; bias:
        `(H, T, T)` added to the self-attention scores (the stack's relative position bias) or None.

        Returns `(x, scores)`: with residual attention, scores are this block's `(B, H, T, T)`
        self-attention scores, the next block's `prev_scores` (None in the first); else None.
        """
        scores = None

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            nonlocal scores
            if not self.residual_attention:
                return self.self_attn(
                    h, mask=mask, causal=causal, positions=positions, cache=self_cache, bias=bias
                )
            if causal or self_cache is not None:
                raise ValueError("residual attention scores are for encoders: no causal mask, no KV cache")
            out, scores = self.self_attn(
                h, prev_scores=prev_scores, mask=mask, positions=positions, bias=bias
            )
            return out

        def cross_attention(h: torch.Tensor) -> torch.Tensor:
            return self.cross_attn(h, memory, memory_mask, positions, memory_positions, cache=cross_cache)

        x = self._residual(x, self.norm_self, self_attention, self.dropout_attn)
        if self.cross_attn is not None:
            x = self._residual(x, self.norm_cross, cross_attention, self.dropout_attn)
        x = self._residual(x, self.norm_ffn, self.ffn, self.dropout)
        return x, scores


class TransformerStack(nn.Module):
    """`n_layers` blocks; a final norm when Pre-Norm (Post-Norm blocks already end normalised).

    causal=True makes it a decoder (each step sees only itself and earlier steps);
    cross_attention=True adds cross-attention to an encoder memory in every block.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        n_layers: int,
        causal: bool = False,
        cross_attention: bool = False,
        rope: RotaryEmbedding | None = None,
    ):
        super().__init__()
        if causal and cfg.norm_layer == "batch":
            raise ValueError(
                "model.net.norm_layer=batch is for encoders only: in training, BatchNorm's statistics over "
                "the batch would carry later steps into earlier ones of a causal (decoder) stack"
            )
        if cfg.residual_attention and (causal or cross_attention):
            raise ValueError(
                "model.net.residual_attention=true is for encoders only: a decoder's KV cache keeps keys and "
                "values, not the scores of earlier layers"
            )
        relative = cfg.positional == "relative_bias"
        if relative and (causal or cross_attention):
            raise ValueError(
                "model.net.positional=relative_bias is for encoder-only models: a decoder's KV cache keeps "
                "no positions of its keys; use rope, sinusoidal or learned"
            )
        self.relative_bias = RelativePositionBias(cfg.n_heads, cfg.max_len) if relative else None
        self.causal = causal
        self.residual_attention = cfg.residual_attention
        self.batch_norm = cfg.norm_layer == "batch"
        self.blocks = nn.ModuleList(TransformerBlock(cfg, cross_attention, rope) for _ in range(n_layers))
        self.final_norm = make_norm(cfg) if cfg.norm == "pre" else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        memory_positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        if self.batch_norm and mask is not None:
            raise ValueError(
                "model.net.norm_layer=batch takes whole sequences: its statistics would include padded steps"
            )
        scores = None  # residual attention: the previous block's scores
        bias = None  # the relative position bias (H, T, T), the same for every block
        if self.relative_bias is not None:
            at = positions if positions is not None else torch.arange(x.shape[1], device=x.device)  # (T,)
            bias = self.relative_bias(at, at)
        for i, block in enumerate(self.blocks):
            self_cache, cross_cache = cache.layer(i) if cache is not None else (None, None)
            x, scores = block(
                x,
                mask=mask,
                causal=self.causal,
                positions=positions,
                memory=memory,
                memory_mask=memory_mask,
                memory_positions=memory_positions,
                self_cache=self_cache,
                cross_cache=cross_cache,
                prev_scores=scores,
                bias=bias,
            )
        return self.final_norm(x)
