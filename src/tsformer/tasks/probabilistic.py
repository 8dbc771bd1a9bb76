"""Probabilistic forecasts of a batch of windows, and the scores they are judged by.

Two kinds of forecast, both in the data's scaled units and the batch layout `(B, T, Dy)`:
- `SampleForecast`: S sampled trajectories per window `(B, S, T, Dy)`, from the autoregressive
  families (each step drawn from the predicted distribution and fed back). Its quantiles are the
  empirical quantiles of the paths at each step (linear interpolation between order statistics, as
  `torch.quantile`'s default, which refuses tensors of more than 2^24 elements) and its point value
  their mean or median (`model.head.point`).
- `QuantileFunctionForecast`: a marginal distribution per step given by its quantile function, from
  the encoder-only families (the head's parameters) and from the probabilistic baseline (empirical
  error quantiles). Its quantiles are exact; no sampling.

Scores (per element, then averaged over the valid steps by the task):
- CRPS. From samples, the energy form `E|X - y| - 1/2 E|X - X'|` with the unbiased ("fair")
  pairwise term `1 / (S (S - 1))`. From a quantile function, twice the pinball loss averaged over the
  midpoint grid `u_i = (i - 1/2) / n`, n = 100 (`CRPS_GRID`): the CRPS is the integral over u of
  twice the pinball loss, and this midpoint rule equals the energy form of the n grid quantiles.
- pinball loss averaged over the configured levels (`model.head.levels`);
- coverage and width of the central 80% interval [q0.1, q0.9], whatever the configured levels.

Spread calibration (`model.head.calibrate`, on by default): a model trained on one-step
likelihoods and fed its own draws is rarely calibrated many steps ahead. After training, every
forecast is widened (or narrowed) about its median by a factor per step and target variable,
`median + c[t, d] (x - median)`, with c the smallest factor that makes the central 80% interval
cover 80% of the validation windows (a conformal quantile of the factors each window needs:
`spread_needed`, `conformal_spread_scale`). Sampled paths are rescaled as whole paths, so a draw
above the median stays above it at every step. Fitted on the validation split only, stored with
the weights (the task's `spread_scale` buffer), applied to every later forecast.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tsformer.nn.heads import pinball_loss

CRPS_GRID = [(i + 0.5) / 100 for i in range(100)]  # midpoints of 100 equal slices of (0, 1)
CENTRAL_80 = (0.1, 0.9)
CENTRAL_80_COVERAGE = CENTRAL_80[1] - CENTRAL_80[0]  # what the spread calibration aims at
BAND_LEVELS = [0.1, 0.25, 0.5, 0.75, 0.9]  # the fan chart's 80% and 50% bands and median


def pinball(q: torch.Tensor, y: torch.Tensor, levels) -> torch.Tensor:
    """Mean pinball loss over the levels: quantiles `q (..., K)`, truth `y (...)` -> `(...)`."""
    return pinball_loss(q, y.unsqueeze(-1), q.new_tensor(list(levels))).mean(dim=-1)


def crps_from_quantiles(q: torch.Tensor, y: torch.Tensor, levels=CRPS_GRID) -> torch.Tensor:
    """CRPS from quantiles `q (..., n)` on a midpoint grid of levels: 2 x mean pinball -> `(...)`."""
    return 2.0 * pinball(q, y, levels)


def empirical_quantiles(ordered: torch.Tensor, levels) -> torch.Tensor:
    """Quantiles of samples sorted along dim 1, `(B, S, T, D)` -> `(B, T, D, K)`: at level u, the
    order statistics around position u (S - 1), linearly interpolated."""
    S = ordered.shape[1]
    pos = ordered.new_tensor(list(levels)) * (S - 1)  # (K,)
    lo = pos.floor().long().clamp(0, S - 1)
    hi = (lo + 1).clamp(max=S - 1)
    frac = (pos - lo).view(1, -1, 1, 1)  # (1, K, 1, 1)
    q = ordered[:, lo] + frac * (ordered[:, hi] - ordered[:, lo])  # (B, K, T, D)
    return q.movedim(1, -1)  # (B, T, D, K)


def crps_from_samples(samples: torch.Tensor, y: torch.Tensor, ordered: torch.Tensor | None = None) -> torch.Tensor:
    """Fair CRPS of samples `(B, S, T, D)` for the truth `(B, T, D)` -> `(B, T, D)`.

    E|X - X'| over distinct pairs from the sorted samples: sum_{i<j} (x_j - x_i) = sum_i (2i - S + 1) x_(i)
    (0-based i), so the cost is a sort, not S^2 differences (`ordered`: the samples sorted along dim 1).
    """
    S = samples.shape[1]
    spread_to_truth = (samples - y.unsqueeze(1)).abs().mean(dim=1)  # (B, T, D)
    ordered = samples.sort(dim=1).values if ordered is None else ordered
    weights = (2 * torch.arange(S, device=samples.device, dtype=samples.dtype) - S + 1).view(1, S, 1, 1)
    pair_sum = (weights * ordered).sum(dim=1)  # sum over pairs i < j of |x_i - x_j|
    return spread_to_truth - pair_sum / (S * (S - 1))


class Forecast:
    """A probabilistic forecast of a batch (see the module docstring)."""

    def point(self) -> torch.Tensor:
        raise NotImplementedError

    def quantiles(self, levels) -> torch.Tensor:
        """`(B, T, Dy, K)`."""
        raise NotImplementedError

    def crps(self, y: torch.Tensor) -> torch.Tensor:
        """`(B, T, Dy)`."""
        raise NotImplementedError

    def with_spread_scale(self, scale: torch.Tensor) -> Forecast:
        """The forecast widened about its median by `scale (T, Dy)` (> 1 wider, < 1 narrower)."""
        raise NotImplementedError


@dataclass
class SampleForecast(Forecast):
    samples: torch.Tensor  # (B, S, T, Dy)
    point_kind: str = "mean"

    def __post_init__(self):
        self._ordered = None

    @property
    def ordered(self) -> torch.Tensor:
        """The samples sorted along the paths, once (quantiles and CRPS both read them)."""
        if self._ordered is None:
            self._ordered = self.samples.sort(dim=1).values
        return self._ordered

    def point(self):
        if self.point_kind == "median":
            return self.quantiles([0.5])[..., 0]  # interpolated between the middle paths for even S
        return self.samples.mean(dim=1)

    def quantiles(self, levels):
        return empirical_quantiles(self.ordered, levels)  # (B, T, Dy, K)

    def crps(self, y):
        return crps_from_samples(self.samples, y, self.ordered)

    def with_spread_scale(self, scale):
        median = self.quantiles([0.5])[..., 0].unsqueeze(1)  # (B, 1, T, Dy)
        return SampleForecast(median + scale * (self.samples - median), self.point_kind)  # (B, S, T, Dy)


@dataclass
class QuantileFunctionForecast(Forecast):
    quantile_fn: Callable[[list[float]], torch.Tensor]  # levels -> (B, T, Dy, K)
    point_fn: Callable[[], torch.Tensor]  # -> (B, T, Dy)

    def point(self):
        return self.point_fn()

    def quantiles(self, levels):
        return self.quantile_fn(list(levels))

    def crps(self, y):
        return crps_from_quantiles(self.quantiles(CRPS_GRID), y)

    def with_spread_scale(self, scale):
        def median():
            return self.quantile_fn([0.5])  # (B, T, Dy, 1)

        def quantiles(levels):
            m = median()
            return m + scale.unsqueeze(-1) * (self.quantile_fn(levels) - m)  # (B, T, Dy, K)

        def point():
            m = median()[..., 0]
            return m + scale * (self.point_fn() - m)  # (B, T, Dy)

        return QuantileFunctionForecast(quantiles, point)


def head_forecast(head, params: torch.Tensor) -> QuantileFunctionForecast:
    """The marginal forecast of a head's parameters `(B, T, Dy, P)` (data's scaled units)."""
    return QuantileFunctionForecast(lambda levels: head.quantiles(params, levels), lambda: head.point(params))


def spread_needed(forecast: Forecast, y: torch.Tensor) -> torch.Tensor:
    """Per element `(B, T, Dy)`, the smallest factor c for which the central 80% interval widened
    about the median by c, `[m - c (m - q0.1), m + c (q0.9 - m)]`, holds the truth y."""
    q = forecast.quantiles([CENTRAL_80[0], 0.5, CENTRAL_80[1]])  # (B, T, Dy, 3)
    lo, med, hi = q.unbind(-1)
    above = y >= med
    gap = torch.where(above, y - med, med - y)  # >= 0
    half_width = torch.where(above, hi - med, med - lo).clamp_min(torch.finfo(q.dtype).tiny)
    return gap / half_width


def conformal_spread_scale(needed: torch.Tensor, coverage: float = CENTRAL_80_COVERAGE) -> torch.Tensor:
    """`(W, T, Dy)` factors needed by W validation windows (NaN on steps not scored) -> `(T, Dy)`:
    per step and variable, the ceil((n + 1) coverage)-th smallest of its n values (the split-
    conformal quantile: with exchangeable windows, a new window is covered with probability >=
    coverage); the largest value where n is too small for that, 1 (no change) where n = 0."""
    _, T, D = needed.shape
    scale = torch.ones(T, D, dtype=needed.dtype)
    for t in range(T):
        for d in range(D):
            values = needed[:, t, d]
            values = values[~values.isnan()].sort().values
            n = len(values)
            if n:
                scale[t, d] = values[min(n, math.ceil((n + 1) * coverage)) - 1]
    return scale


def scores(forecast: Forecast, y: torch.Tensor, levels) -> dict[str, torch.Tensor]:
    """Per-element scores `(B, T, Dy)`: crps, pinball (at `levels`), covered_80, width_80."""
    q = forecast.quantiles([*CENTRAL_80, *levels])  # (B, T, Dy, 2 + K)
    lo, hi = q[..., 0], q[..., 1]
    return {
        "crps": forecast.crps(y),
        "pinball": pinball(q[..., 2:], y, levels),
        "coverage_80": ((y >= lo) & (y <= hi)).to(y.dtype),
        "width_80": hi - lo,
    }
