"""Convolutional token embedding (`model.net.embedding=conv`): a few Conv1d layers lift the steps to tokens.

A linear projection sees one step (or one patch) at a time, so a token knows its own values only and
attention must find every local shape from scratch. The convolutional networks that lead on shape data
(FCN, ResNet, InceptionTime) read local patterns with kernels of a few steps; ConvTran (Foumani et al.
2024) puts such a stem under its Transformer. Here each layer is

    steps masked (padding set to 0) -> Conv1d(kernel k, 'same' padding) -> LayerNorm over channels -> GELU

with kernels `conv_kernels` (8, 5, 3: FCN's), all `d_model` channels wide. The first layer may take a
`conv_stride` S > 1: one token per S steps (token i at step i * S), which shortens attention's sequence.

Padding never leaks in: before every convolution the padded steps of a batch are set to 0, which is what
the 'same' padding of a sample alone puts past its end; the norm is per step (LayerNorm over the
channels), never over the batch or the time axis. So a sample's tokens are the same alone or among
longer, padded ones (tested). A token is valid when the step it sits at is (`token_valid`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def same_padding(h: torch.Tensor, kernel: int) -> torch.Tensor:
    """`(B, C, T)` with the zeros a 'same' convolution of `kernel` reads past each end: (k - 1) // 2
    before, k // 2 after (so a strided kernel's output i starts at step i * S - (k - 1) // 2)."""
    return F.pad(h, ((kernel - 1) // 2, kernel // 2))


def check_sizes(d_in: int, stride: int) -> tuple[int, int]:
    if d_in < 1:
        raise ValueError(f"a token needs at least one input feature, got d_in={d_in}")
    if stride < 1:
        raise ValueError(f"model.net.conv_stride={stride}: must be >= 1")
    return int(d_in), int(stride)


class StridedTokens(nn.Module):
    """The token grid of a convolutional embedding: token i at step i * `stride`, valid when its step is.
    `ConvEmbedding` and `tsformer.nn.multiscale_embedding.MultiScaleEmbedding` set `d_in` and `stride`
    and map steps `(B, T, d_in)` (valid `(B, T)` or None) to tokens `(B, ceil(T / S), d_model)`."""

    d_in: int
    stride: int

    # the token grid, as `tsformer.nn.patching.Patching` gives it (the models ask either the same way)
    def count(self, n_steps: int) -> int:
        return -(-n_steps // self.stride)  # ceil(T / S)

    def n_positions(self, n_steps: int) -> int:
        return (self.count(n_steps) - 1) * self.stride + 1

    def positions(self, n_steps: int, device=None) -> torch.Tensor:
        """`(L,)`: the step each token sits at."""
        return torch.arange(self.count(n_steps), device=device) * self.stride

    def token_valid(self, valid: torch.Tensor | None) -> torch.Tensor | None:
        """`(B, T)` valid steps -> `(B, L)` valid tokens (a token is real when its step is)."""
        return valid if valid is None or self.stride == 1 else valid[:, :: self.stride]

    def group_steps(self, values: torch.Tensor) -> torch.Tensor:
        """Per-step values `(B, T, C)` -> `(B, L, S * C)`, the S steps from each token's own step on
        (step-major, the end padded with 0): what a per-token output restores, as a patch's."""
        B, T, C = values.shape
        L = self.count(T)
        values = F.pad(values, (0, 0, 0, L * self.stride - T))  # (B, L * S, C)
        return values.reshape(B, L, self.stride * C)

    def check_input(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.d_in:
            raise ValueError(
                f"expected {self.d_in} features per step, got {x.shape[-1]} (input shape {tuple(x.shape)})"
            )


class ConvEmbedding(StridedTokens):
    """Steps `(B, T, d_in)` -> tokens `(B, ceil(T / S), d_model)` (see the module docstring)."""

    def __init__(self, d_in: int, d_model: int, kernels=(8, 5, 3), stride: int = 1):
        super().__init__()
        kernels = [int(k) for k in kernels]
        if not kernels or min(kernels) < 1:
            raise ValueError(f"model.net.conv_kernels={kernels}: give one kernel size >= 1 per layer")
        (self.d_in, self.stride), self.kernels = check_sizes(d_in, stride), kernels
        widths = [d_in, *[d_model] * len(kernels)]
        self.convs = nn.ModuleList(
            nn.Conv1d(widths[i], widths[i + 1], k, stride=self.stride if i == 0 else 1)
            for i, k in enumerate(kernels)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in kernels)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        self.check_input(x)
        h = x.transpose(1, 2)  # (B, d_in, T): Conv1d's layout
        keep = None if valid is None else valid.unsqueeze(1).to(h.dtype)  # (B, 1, T)
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms, strict=True)):
            if keep is not None:
                h = h * keep  # padded steps read as the zeros past a lone sample's end
            h = conv(same_padding(h, conv.kernel_size[0]))  # (B, d_model, L)
            if i == 0 and keep is not None:
                keep = keep[:, :, :: self.stride]  # (B, 1, L)
            h = self.act(norm(h.transpose(1, 2)).transpose(1, 2))  # LayerNorm per token over channels
        if keep is not None:
            h = h * keep  # padded tokens carry nothing
        return h.transpose(1, 2)  # (B, L, d_model)

    def extra_repr(self) -> str:
        return f"kernels={self.kernels}, stride={self.stride}"
