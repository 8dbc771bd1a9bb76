"""Dropout with two paths: torch's (the reference) and one that draws its mask from fewer random numbers.

    out = x * keep / (1 - p),   keep ~ Bernoulli(1 - p) per element, in training only

The reference path is `nn.Dropout` (`F.dropout`): one Bernoulli draw per element, which on one CPU
thread is most of a narrow Transformer's training step (`benchmarks/RESULTS_forecast_speed.md`). The
fast path (`fast=True`, `model.net.fast_dropout`) draws one 64-bit random word per four elements and
reads each element's 16 bits as a uniform integer u in [0, 65536): the element is dropped when
u < round(p * 65536). Its drop rate is p to within 2^-17 (`keep_probability` gives it exactly) and the
kept values are scaled by 1 / keep_probability, so the output's expectation is x as with torch's. The
masks come from torch's generator (`torch.manual_seed` repeats them), but not the same masks as the
reference path's: the two paths train the same model in distribution, not to the bit.

Tests check the fast path against the formula on its own mask (`fast_keep_mask`, drawn again from the
same seed), its drop rate, its gradient, and that evaluation leaves x as it is.
"""

from __future__ import annotations

import torch
from torch import nn

FIELDS = 65536  # a mask element reads 16 random bits


def drop_threshold(p: float) -> int:
    """Elements whose 16-bit field is below this are dropped: round(p * 2^16)."""
    return round(p * FIELDS)


def keep_probability(p: float) -> float:
    """The fast path's exact probability of keeping an element (1 - p to within 2^-17)."""
    return 1.0 - drop_threshold(p) / FIELDS


def fast_keep_mask(shape: torch.Size, p: float, device=None) -> torch.Tensor:
    """Bool `shape`, True where an element is kept, from one 64-bit random word per 4 elements."""
    n = shape.numel()
    # 64 random bits a word: `random_()` without bounds would leave the sign bit 0 (its range is [0, 2^63))
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), 2**63 - 1)
    fields = words.view(torch.int16)[:n].view(shape)  # 4 fields a word, uniform in [-2^15, 2^15)
    return fields >= drop_threshold(p) - FIELDS // 2  # P(dropped) = threshold / 2^16


def fast_scaled_mask(shape: torch.Size, p: float, dtype: torch.dtype, device=None) -> torch.Tensor:
    """`shape` of 1 / keep_probability(p) where an element is kept, else 0 (`fast_keep_mask`)."""
    kept = fast_keep_mask(shape, p, device=device)
    # through uint8: torch casts uint8 to float many times faster than bool on a CPU
    return kept.view(torch.uint8).to(dtype).mul_(1.0 / keep_probability(p))


def fast_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout of `x` (any shape) with the fast mask; training only (the caller checks). Autograd keeps
    the mask for the backward pass, which is the same product."""
    return x * fast_scaled_mask(x.shape, p, x.dtype, device=x.device)


class Dropout(nn.Dropout):
    """`nn.Dropout` (the reference path), or with `fast=True` the fast mask (`fast_dropout`)."""

    def __init__(self, p: float = 0.5, fast: bool = False):
        super().__init__(p)
        self.fast = fast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fast or not self.training or self.p == 0.0:
            return super().forward(x)
        return fast_dropout(x, self.p)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fast={self.fast}"
