"""Positional encodings: where a step sits in the window.

Attention itself is blind to order (permuting the inputs permutes the outputs), so order is put in:
- `sinusoidal`: fixed PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), added to the
  input. Computed for any position, so it works past the training length.
- `learned`: a trainable table `nn.Embedding(max_len, d_model)` added to the input. It knows only
  `max_len` positions: a longer input is refused at the model's entry with a clear error.
- `rope`: rotary embedding. Nothing is added to the input; inside every attention layer, Q and K
  are rotated by an angle proportional to their position, so the score q_m . k_n depends only on
  the offset m - n (relative position) and vector norms are unchanged.
- `relative_bias`: a learned bias per offset and head added to the attention scores (eRPE, Foumani et
  al. 2024, ConvTran; T5's bias without buckets): score(m, n) = q_m . k_n / sqrt(Dh) + b_h[m - n].
  Nothing is added to the input; the score depends on the offset, never on where a shape starts.
  Offsets are in steps (the positions RoPE rotates by); those beyond `max_len - 1` share the last
  entry. The table starts at zero (the encoder starts as with `none`) and is shared by the layers of a
  stack. Encoders only: a decoder's KV cache keeps no positions of its keys.
- `none`: no order information (the encoder is then permutation-equivariant).

All take absolute positions `(T,)`, so that a decoder working through a KV cache can pass the
offset of the new tokens.
"""

from __future__ import annotations

import math

import torch
from torch import nn

POSITIONAL_KINDS = ("sinusoidal", "learned", "rope", "relative_bias", "none")


class SinusoidalPositionalEncoding(nn.Module):
    def __init__(self, d_model: int, base: float = 10000.0):
        super().__init__()
        if d_model % 2 != 0:
            raise ValueError(f"sinusoidal positional encoding needs an even d_model, got {d_model}")
        inv_freq = torch.exp(-math.log(base) * torch.arange(0, d_model, 2).float() / d_model)  # (D/2,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def encoding(self, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)  # (T, D/2)
        pe = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (T, D/2, 2): sin, cos interleaved
        return pe.flatten(1)  # (T, D)

    def check_length(self, n_positions: int) -> None:
        pass  # defined for every position

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x + self.encoding(positions).to(x.dtype)  # (B, T, D)


class LearnedPositionalEncoding(nn.Module):
    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def check_length(self, n_positions: int) -> None:
        if n_positions > self.max_len:
            raise ValueError(
                f"the input needs {n_positions} positions but the learned positional encoding has "
                f"max_len={self.max_len}: raise model.max_len to at least {n_positions}, or use "
                f"model.positional=sinusoidal or rope, which work at any length"
            )

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x + self.table(positions)  # (B, T, D)


class NoPositionalEncoding(nn.Module):
    def check_length(self, n_positions: int) -> None:
        pass

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x


class RotaryEmbedding(nn.Module):
    """RoPE: rotate pairs of channels of Q and K by position-dependent angles.

    Channel i of the first half pairs with channel i of the second half; the pair is rotated by
    angle pos * base^(-2i/Dh). For a query at m and a key at n the rotations compose to an angle
    depending on m - n only.
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2 != 0:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        inv_freq = base ** (-torch.arange(0, head_dim, 2).float() / head_dim)  # (Dh/2,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: `(B, H, T, Dh)`, positions: `(T,)` -> rotated x, same shape."""
        angles = positions.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)  # (T, Dh/2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, Dh/2) each
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class RelativePositionBias(nn.Module):
    """`relative_bias`: one learned number per head and offset m - n in -(max_len - 1) .. max_len - 1,
    added to the score of query m for key n (the module docstring)."""

    def __init__(self, n_heads: int, max_len: int):
        super().__init__()
        if max_len < 1:
            raise ValueError(f"model.net.max_len={max_len}: the relative bias needs at least one offset")
        self.max_len = max_len
        self.table = nn.Parameter(torch.zeros(n_heads, 2 * max_len - 1))  # (H, offsets)

    def forward(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """Positions `(Tq,)` and `(Tk,)` -> the additive bias `(H, Tq, Tk)`."""
        offsets = q_positions.unsqueeze(1) - k_positions.unsqueeze(0)  # (Tq, Tk)
        limit = self.max_len - 1
        return self.table[:, offsets.clamp(-limit, limit) + limit]  # (H, Tq, Tk)


def build_positional(kind: str, d_model: int, head_dim: int, max_len: int, rope_base: float):
    """Returns `(additive encoding applied to the input, RotaryEmbedding or None)`."""
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model), None
    if kind == "learned":
        return LearnedPositionalEncoding(d_model, max_len), None
    if kind == "rope":
        return NoPositionalEncoding(), RotaryEmbedding(head_dim, rope_base)
    if kind in ("none", "relative_bias"):  # relative_bias: in the attention scores (`TransformerStack`)
        return NoPositionalEncoding(), None
    raise ValueError(f"unknown positional encoding {kind!r}; choose one of {POSITIONAL_KINDS}")
