"""Encoder-only Transformer: bidirectional attention over one window.

Every step sees every other step of the window (no causal mask), so the model maps a whole window of
observations to outputs at the same time: `Y = F(X)`, like a sensor-calibration function.

Heads:
- `per_step`: state reconstruction, `(B, N, d_in) -> (B, N, d_out)` (infer hidden states from
  observed inputs over the same window). With `linear_skip`, a linear map of each step's own inputs
  is added to the output, so the Transformer learns what a per-row linear regression misses; the
  linear part extrapolates when a plant drifts outside the training range, where a network alone
  saturates;
- `per_token`: `(B, N, d_in) -> (B, N', d_out)`, one output vector per token: per step, or per patch
  (masked pre-training of a classifier's encoder restores each patch's P * D values with it);
- `classification`: `(B, N, d_in) -> (B, n_classes)` logits, pooled from a learned `[CLS]` token
  (prepended at position 0) or by the mean over real steps;
- `forecast`: `(B, N, d_in) -> (B, M, d_out)`: the N encoder outputs flattened and mapped to M future
  steps by one linear layer. This is the "encoder-only + linear head" that the documents compare
  with the encoder-decoder.

Tokens: one per step, or with `patch_len` one per patch of steps (`tsformer.nn.patching`; PatchTST):
the N steps become L = floor((N - P) / S) + 2 tokens at the positions of their first steps, and the
forecast head flattens the L token outputs. The `per_step` head needs one token per step (no patches).

With a distribution head (`tsformer.nn.heads`), `n_params` > 1: the per_step and forecast heads give
`d_out * n_params` outputs per step, the distribution's parameters of each channel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tsformer.nn.blocks import TransformerStack
from tsformer.nn.config import TransformerConfig
from tsformer.nn.conv_embedding import StridedTokens
from tsformer.nn.dropout import Dropout
from tsformer.nn.embedding import build_embedding, token_grid
from tsformer.nn.masks import padding_mask
from tsformer.nn.patching import Patching, n_step_positions, n_step_tokens, step_positions, token_features
from tsformer.nn.positional import build_positional

HEADS = ("per_step", "per_token", "classification", "forecast")
POOLINGS = ("cls", "mean")


@dataclass
class EncoderOnlyConfig(TransformerConfig):
    d_in: int = 1  # features per input step
    d_out: int = 1  # outputs per step (per_step and forecast heads)
    head: str = "per_step"  # "per_step" | "per_token" | "classification" | "forecast"
    n_classes: int = 2  # classification head
    pooling: str = "cls"  # classification head: "cls" token or "mean" over real steps
    context_len: int = 100  # forecast head: the fixed window length N it flattens
    horizon: int = 1  # forecast head: the M steps it outputs
    linear_skip: bool = False  # per_step head: add Linear(inputs of the step) to the output
    patch_len: int | None = None  # None: one token per step; P: one token per patch of P steps
    patch_stride: int | None = None  # S, steps between patch starts (None: = patch_len)
    n_params: int = 1  # per_step and forecast heads: outputs per d_out channel (a distribution's parameters)


class EncoderOnly(nn.Module):
    def __init__(self, cfg: EncoderOnlyConfig):
        super().__init__()
        if cfg.head not in HEADS:
            raise ValueError(f"unknown encoder-only head {cfg.head!r}; choose one of {HEADS}")
        if cfg.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {cfg.pooling!r}; choose one of {POOLINGS}")
        self.cfg = cfg
        self.patching = Patching(cfg.patch_len, cfg.patch_stride) if cfg.patch_len else None
        if self.patching is not None and cfg.head == "per_step":
            raise ValueError(
                "the per_step head gives one output per step: it takes no patch tokens (patch_len)"
            )
        self.input_proj = build_embedding(cfg, token_features(self.patching, cfg.d_in), self.patching)
        self.conv = isinstance(self.input_proj, StridedTokens)
        self.grid = token_grid(self.patching, self.input_proj)  # patches, strided convolution, or None
        if self.conv and self.input_proj.stride > 1 and cfg.head == "per_step":
            raise ValueError(
                "the per_step head gives one output per step: it takes no model.net.conv_stride > 1"
            )
        self.positional, rope = build_positional(
            cfg.positional, cfg.d_model, cfg.head_dim, cfg.max_len, cfg.rope_base
        )
        self.dropout = Dropout(cfg.dropout, cfg.fast_dropout)
        self.encoder = TransformerStack(cfg, cfg.n_layers, rope=rope)
        self.use_cls = cfg.head == "classification" and cfg.pooling == "cls"
        if self.use_cls:
            self.cls_token = nn.Parameter(torch.randn(cfg.d_model) * 0.02)
        if cfg.linear_skip and cfg.head != "per_step":
            raise ValueError(f"linear_skip belongs to the per_step head, not to head={cfg.head!r}")
        d_out = cfg.d_out * cfg.n_params  # outputs per step: every parameter of every channel
        self.linear_skip = nn.Linear(cfg.d_in, d_out) if cfg.linear_skip else None
        self.head = self._output_head(d_out)

    def _output_head(self, d_out: int) -> nn.Linear:
        """The head's linear layer: per step or token (`d_out`), per class, or the flattened tokens to
        the M steps of the horizon."""
        cfg = self.cfg
        if cfg.head in ("per_step", "per_token"):
            return nn.Linear(cfg.d_model, d_out)
        if cfg.head == "classification":
            return nn.Linear(cfg.d_model, cfg.n_classes)
        n_tokens = n_step_tokens(self.grid, cfg.context_len)
        return nn.Linear(n_tokens * cfg.d_model, cfg.horizon * d_out)  # flattened tokens -> M steps

    def encode(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x: `(B, N, d_in)`, valid: `(B, N)` bool, True on real steps -> `(B, N', d_model)`.

        N' = N tokens (one per step), or L with patches; + 1 when a [CLS] token is prepended (it is
        then at index 0, position 0, and the other tokens' positions move up by one).
        """
        B, N, _ = x.shape
        self.positional.check_length(n_step_positions(self.grid, N) + int(self.use_cls))
        positions = step_positions(
            self.grid, N, device=x.device
        )  # (N,) or (L,): first step of each patch, or the step of each strided token
        if self.patching is not None:
            if valid is not None:
                raise ValueError("patch tokens take whole windows: no padding mask (valid) with patch_len")
            x = self.patching(x)  # (B, N, d_in) -> (B, L, P * d_in)
        if self.conv:
            h = self.input_proj(x, valid)  # (B, L, d_model), padding kept out of the convolutions
            valid = self.input_proj.token_valid(valid)  # (B, L)
        else:
            h = self.input_proj(x)  # (B, N or L, d_model)
        if self.use_cls:
            h = torch.cat([self.cls_token.expand(B, 1, -1), h], dim=1)  # (B, N' + 1, d_model)
            positions = torch.cat([positions.new_zeros(1), positions + 1])  # (N' + 1,)
            if valid is not None:
                valid = torch.cat([valid.new_ones(B, 1), valid], dim=1)  # (B, N + 1)
        h = self.dropout(self.positional(h, positions))
        mask = padding_mask(valid) if valid is not None else None
        return self.encoder(h, mask=mask, positions=positions)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        B, N, _ = x.shape
        h = self.encode(x, valid)
        if self.conv:
            valid = self.input_proj.token_valid(valid)  # (B, L): the tokens' own mask
        if self.cfg.head == "per_token":
            return self.head(h)  # (B, N', d_out)
        if self.cfg.head == "per_step":
            out = self.head(h)  # (B, N, d_out)
            return out + self.linear_skip(x) if self.linear_skip is not None else out
        if self.cfg.head == "classification":
            if self.use_cls:
                pooled = h[:, 0]  # (B, d_model)
            elif valid is None:
                pooled = h.mean(dim=1)
            else:
                w = valid.unsqueeze(-1).to(h.dtype)  # (B, N, 1)
                pooled = (h * w).sum(dim=1) / w.sum(dim=1).clamp_min(1.0)
            return self.head(pooled)  # (B, n_classes)
        # forecast head: needs the window length it was built for
        if N != self.cfg.context_len:
            raise ValueError(
                f"the forecast head was built for windows of context_len={self.cfg.context_len} steps, got {N}"
            )
        if valid is not None:
            h = h * valid.unsqueeze(-1).to(h.dtype)  # padded steps contribute nothing
        out = self.head(
            h.reshape(B, h.shape[1] * self.cfg.d_model)
        )  # (B, N' * d_model) -> (B, M * d_out * P)
        return out.view(B, self.cfg.horizon, self.cfg.d_out * self.cfg.n_params)  # (B, M, d_out * P)
