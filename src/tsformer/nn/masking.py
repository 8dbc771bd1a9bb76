"""Masks for masked fill-in (the cloze task of BERT, for time series): which values a model must restore.

A mask is a bool tensor `(B, N, D)` over the values of B windows of N steps and D channels, True
where a value is hidden. Two ways to draw one:
- `geometric`: per channel, alternating runs of hidden and kept values whose lengths are geometric,
  hidden runs of mean `mean_length` (lm) and kept runs of mean lm * (1 - r) / r, so that a fraction r
  of the values is hidden on average (Zerveas et al., "A Transformer-based Framework for Multivariate
  Time Series Representation Learning", KDD 2021). Runs make the model restore whole stretches, not
  single points that a neighbour gives away;
- `random`: every value hidden on its own with probability r (the Time-Series-Library imputation
  protocol: 12.5, 25, 37.5 or 50 %).

`hide` replaces the hidden values by 0 (the train mean after standard scaling) and appends the mask as
D extra input channels (1 = hidden), so the model knows which zeros are real.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MASK_KINDS = ("geometric", "random")


@dataclass
class MaskConfig:
    kind: str = "geometric"  # "geometric" (runs, TST) | "random" (each value alone, TSLib)
    ratio: float = 0.15  # r: fraction of the values hidden, on average
    mean_length: float = 3.0  # lm: mean length of a hidden run (geometric)

    def __post_init__(self):
        if self.kind not in MASK_KINDS:
            raise ValueError(f"mask kind {self.kind!r} is not one of {', '.join(MASK_KINDS)}")
        if not 0.0 < self.ratio < 1.0:
            raise ValueError(f"mask ratio {self.ratio} must be in (0, 1)")
        if self.mean_length < 1.0:
            raise ValueError(f"mask mean_length {self.mean_length} must be >= 1 step")


def draw_mask(shape: tuple[int, int, int], cfg: MaskConfig, generator: torch.Generator | None = None):
    """A mask `(B, N, D)` bool, True = hidden, drawn as `cfg` says (from `generator`, else torch's own)."""
    B, N, D = shape
    u = torch.rand(B, N, D, generator=generator)  # one uniform draw per value
    if cfg.kind == "random":
        return u < cfg.ratio
    return _geometric_runs(u, cfg.ratio, cfg.mean_length)


def _geometric_runs(u: torch.Tensor, ratio: float, mean_length: float) -> torch.Tensor:
    """A two-state Markov chain along the steps of every (window, channel): a hidden run ends with
    probability 1 / lm at each step, a kept run with probability 1 / (lm (1 - r) / r), so run lengths
    are geometric with those means; the first state is hidden with probability r (the chain's
    stationary share). `u`: `(B, N, D)` uniforms, one per step and channel."""
    p_end_hidden = 1.0 / mean_length
    p_end_kept = p_end_hidden * ratio / (1.0 - ratio)
    hidden = torch.empty(u.shape, dtype=torch.bool)  # (B, N, D)
    state = u[:, 0] < ratio  # (B, D)
    hidden[:, 0] = state
    for t in range(1, u.shape[1]):
        switch = torch.where(state, u[:, t] < p_end_hidden, u[:, t] < p_end_kept)  # (B, D)
        state = state ^ switch
        hidden[:, t] = state
    return hidden


def eval_masks(n_windows: int, n_steps: int, n_channels: int, cfg: MaskConfig, seed: int) -> torch.Tensor:
    """The fixed masks `(W, N, D)` of the W windows of a validation or test split: drawn once from
    `seed`, so that every evaluation (and the baselines beside it) scores the same hidden values."""
    generator = torch.Generator().manual_seed(int(seed))
    return draw_mask((n_windows, n_steps, n_channels), cfg, generator)


def hide(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`values (B, N, D)` with the hidden ones set to 0, and the mask appended: `(B, N, 2 D)`.

    NaN (a value nobody measured) must be in `mask`: it is replaced like any hidden value."""
    kept = values.masked_fill(mask, 0.0)  # (B, N, D)
    return torch.cat([kept, mask.to(values.dtype)], dim=-1)  # (B, N, 2 D)


def interpolate(values: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """`values (B, N, D)` with each hidden one replaced by linear interpolation between the nearest kept
    values of its channel (the nearest kept value before the first or after the last one; 0 in a
    channel with nothing kept). Hidden values may be NaN."""
    B, N, D = values.shape
    steps = torch.arange(N, device=values.device).view(1, N, 1).expand(B, N, D)  # (B, N, D)
    kept = ~hidden
    # index of the nearest kept step at or before / at or after each step (-1 / N where there is none)
    before = torch.where(kept, steps, -1).cummax(dim=1).values  # (B, N, D)
    after = torch.where(kept, steps, N).flip(1).cummin(dim=1).values.flip(1)  # (B, N, D)
    has_before, has_after = before >= 0, after < N
    before = torch.where(has_before, before, after).clamp(0, N - 1)  # one side missing: the other side
    after = torch.where(has_after, after, before).clamp(0, N - 1)
    safe = values.nan_to_num(0.0)
    v0, v1 = safe.gather(1, before), safe.gather(1, after)  # (B, N, D)
    span = (after - before).clamp_min(1).to(values.dtype)
    w = ((steps - before).to(values.dtype) / span).clamp(0.0, 1.0)
    line = v0 + w * (v1 - v0)
    line = torch.where(has_before | has_after, line, torch.zeros_like(line))
    return torch.where(hidden, line, values)
