"""Reversible instance normalisation (RevIN, Kim et al., ICLR 2022).

The level and spread of a series drift between the windows a model is trained on and those it is
tested on (ETT's oil temperature in winter and in summer). RevIN takes them out of every window and
puts them back on the output, so the network only learns the shape of what comes next:

    normalise:    x_norm = (x - mean) / std * w + b        per window and per channel
    network:      y_norm = f(x_norm, ...)
    denormalise:  y      = (y_norm - b) / w * std + mean

mean and std (`sqrt(var + eps)`, biased variance, so that a constant channel gives std = sqrt(eps),
never 0) are computed over the HISTORY steps of the window only: the future is never read. w, b are
an optional learnable affine map per channel (`affine=True`; w = 1, b = 0 at start). The statistics
are inputs, not parameters: no gradient flows into them (as in the reference implementation).

Both directions are one affine map per window and channel, `x_norm = (x - loc) / scale` with
`scale = std / w` and `loc = mean - b * scale`; `InstanceScale` holds it, so that it can be reshaped
like any target tensor (channel independence, `channels.py`) and applied to predictions in any layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class InstanceScale:
    """`x_norm = (x - loc) / scale`; loc and scale are `(B, 1, C)`, one value per window and channel."""

    loc: torch.Tensor
    scale: torch.Tensor

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.loc) / self.scale  # (B, T, C)

    def denormalise(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.scale + self.loc  # (B, T, C)


class RevIN(nn.Module):
    def __init__(self, n_channels: int, affine: bool = False, eps: float = 1e-5):
        super().__init__()
        self.n_channels = n_channels
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = nn.Parameter(torch.ones(n_channels))  # w
            self.bias = nn.Parameter(torch.zeros(n_channels))  # b

    def forward(self, hist: torch.Tensor) -> InstanceScale:
        """hist: `(B, N, C)` the history steps of each window -> its `InstanceScale` `(B, 1, C)`."""
        if hist.shape[-1] != self.n_channels:
            raise ValueError(f"RevIN was built for {self.n_channels} channels, got {hist.shape[-1]}")
        mean = hist.mean(dim=1, keepdim=True).detach()  # (B, 1, C)
        std = (hist.var(dim=1, keepdim=True, unbiased=False) + self.eps).sqrt().detach()  # (B, 1, C)
        if not self.affine:
            return InstanceScale(loc=mean, scale=std)
        scale = std / self.weight  # (B, 1, C): (x - mean) / std * w + b = (x - loc) / scale
        return InstanceScale(loc=mean - self.bias * scale, scale=scale)
