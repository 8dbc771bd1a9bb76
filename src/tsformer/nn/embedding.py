"""Input embedding: lift the D raw features of one time step to a d_model-dimensional token.

Text models look tokens up in a table; a time step is already a vector of real numbers, so a linear
layer `x_t W + b` does the lifting. Positional information is added afterwards (`positional.py`).
"""

from __future__ import annotations

import torch
from torch import nn


class InputProjection(nn.Module):
    def __init__(self, d_in: int, d_model: int):
        super().__init__()
        if d_in < 1:
            raise ValueError(f"a token needs at least one input feature, got d_in={d_in}")
        self.d_in = d_in
        self.proj = nn.Linear(d_in, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.d_in:
            raise ValueError(
                f"expected {self.d_in} features per step, got {x.shape[-1]} (input shape {tuple(x.shape)})"
            )
        return self.proj(x)  # (B, T, d_in) -> (B, T, d_model)
