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

Spread calibration (`model.head.calibrate`, on by default; `SpreadCalibration`): a model trained
on one-step likelihoods and fed its own draws is rarely calibrated many steps ahead, and a spread
right for the training months can be wrong for the next ones. Every forecast is widened (or
narrowed) about its median by a factor per step and target variable, `median + c[t, d] (x - median)`,
with c the smallest factor that would have made the central 80% interval cover 80% of earlier
windows (a split-conformal quantile of the factors each window needed: `spread_needed`). Sampled
paths: each step's values are rescaled so; where c > 1 the widened part is carried persistently by
each path (`SampleForecast.with_spread_scale`), where c <= 1 the paths are rescaled whole.
Which earlier windows (`model.head.calibration_window`):
- a duration, e.g. `7D` (rolling, the default): for a forecast made at origin t, the windows whose
  truth at that step was known at t and at most that long before it: the validation windows, then
  the test windows as their truth comes in (the test loader goes forward in time, all series
  together: `TimeSeriesDataModule.eval_order`), as a forecaster in operation recalibrates on its
  latest errors. Never a truth measured after t.
- `null`: the validation windows only, one factor per step for the whole test.
The factors of the latest calibration are stored with the weights (the task's `spread_scale`
buffer) and applied to every later forecast (`Forecaster.predict`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
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


def crps_from_samples(
    samples: torch.Tensor, y: torch.Tensor, ordered: torch.Tensor | None = None
) -> torch.Tensor:
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


def lag1_autocorrelation_of_changes(paths: np.ndarray) -> float:
    """Coherence of paths `(n_paths, M)`: the pooled lag-1 autocorrelation of their step-to-step
    changes (real series move on, near 0; fresh noise at every step turns back, -0.5)."""
    d = np.diff(paths, axis=1)  # (n, M - 1)
    a, b = d[:, :-1].ravel(), d[:, 1:].ravel()
    return float(np.corrcoef(a, b)[0, 1])


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
        """The forecast widened about its median by `scale`, `(T, Dy)` for every window or
        `(B, T, Dy)` one per window (> 1 wider, < 1 narrower)."""
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
        """Each step keeps exactly the values `median + scale (x - median)` of its paths (so the
        quantiles, coverage and CRPS are those of the rescaled draws); which path carries which value
        is decided as follows. Where `scale` <= 1 a path keeps its rank: the paths are rescaled whole.
        Where `scale` > 1 the model sampled too little spread, and the spread it missed is taken to
        persist over the horizon (on T1 the models' errors do: a wrong level lasts hours): each path
        draws one offset z ~ N(0, 1) for the whole horizon, and at each step the paths are ranked by
        their own standardised deviation plus sqrt(scale^2 - 1) z, the part of the widened spread the
        model did not sample, and take the rescaled values in that order. Rescaling the paths whole
        instead amplifies their step-to-step jitter with the spread (README "Probabilistic forecasts")."""
        B, S = self.samples.shape[:2]
        median = self.quantiles([0.5])[..., 0].unsqueeze(1)  # (B, 1, T, Dy)
        scale = scale.expand(B, *scale.shape[-2:]).unsqueeze(1)  # (B, 1, T, Dy)
        values = median + scale * (self.ordered - median)  # (B, S, T, Dy), sorted along the paths
        if S < 2 or not bool((scale > 1).any()):  # nothing widened (or one path): no ranks, no draws of z
            rescaled = SampleForecast(median + scale * (self.samples - median), self.point_kind)
        else:
            spread = self.samples.std(dim=1, keepdim=True).clamp_min(torch.finfo(self.samples.dtype).tiny)
            z = torch.randn(
                B, S, 1, self.samples.shape[-1], dtype=self.samples.dtype, device=self.samples.device
            )
            missed = (scale.square() - 1).clamp_min(0).sqrt()  # (B, 1, T, Dy): 0 where scale <= 1
            score = (self.samples - median) / spread + missed * z  # (B, S, T, Dy)
            rank = score.argsort(dim=1).argsort(dim=1)  # each path's rank at each step
            rescaled = SampleForecast(values.gather(1, rank), self.point_kind)
        rescaled._ordered = values  # the same values at each step: no new sort
        return rescaled


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


def conformal_factor(needed: np.ndarray, coverage: float, empty: np.ndarray) -> np.ndarray:
    """Factors needed by n windows `(n, Dy)` (NaN: a step not scored) -> `(Dy,)`: per variable the
    ceil((n + 1) coverage)-th smallest of its values (the split-conformal quantile: with
    exchangeable windows, a new one is covered with probability >= coverage); the largest where n
    is too small for that; `empty` where nothing was scored."""
    ordered = np.sort(needed, axis=0)  # NaN last
    n = (~np.isnan(needed)).sum(axis=0)  # (Dy,)
    k = np.minimum(n, np.ceil((n + 1) * coverage).astype(int))  # 1-based rank
    picked = ordered[np.maximum(k - 1, 0), np.arange(needed.shape[1])]
    return np.where(n > 0, picked, empty)


def conformal_by_step(needed: np.ndarray, coverage: float) -> np.ndarray:
    """`(W, T, Dy)` factors needed by W windows (NaN on steps not scored) -> `(T, Dy)`, each step's
    `conformal_factor`; 1 (no change) where nothing was scored."""
    ones = np.ones(needed.shape[2])
    return np.stack([conformal_factor(needed[:, t], coverage, ones) for t in range(needed.shape[1])])


class SpreadCalibration:
    """The spread factors of the module docstring, from the factors scored windows needed.

    `fit_validation` takes the validation windows (and gives the one factor per step used when
    `window` is None); `add` pools more scored windows as their truth comes in; `at(origins)` gives
    the factor of forecasts made at those times; `latest()` the factor after the last known truth.
    Times are the target times (when a truth is measured, hence known).
    """

    def __init__(self, window: str | pd.Timedelta | None, coverage: float = CENTRAL_80_COVERAGE):
        self.window = None if window is None else pd.Timedelta(window)
        self.coverage = coverage
        self._needed: list[np.ndarray] = []  # (W, T, Dy) each
        self._known: list[np.ndarray] = []  # (W, T) datetime64[ns] each
        self._sorted = None  # per step: (known times sorted, factors in that order)

    def fit_validation(self, needed: np.ndarray, known_at: np.ndarray) -> np.ndarray:
        """Factors needed by the validation windows `(W, T, Dy)`, known at `(W, T)` -> `(T, Dy)`."""
        self.static = conformal_by_step(np.asarray(needed, dtype=np.float64), self.coverage)
        self._needed, self._known, self._sorted = [], [], None
        self.add(needed, known_at)
        return self.static

    def add(self, needed: np.ndarray, known_at: np.ndarray) -> None:
        self._needed.append(np.asarray(needed, dtype=np.float64))
        self._known.append(np.asarray(known_at, dtype="datetime64[ns]"))
        self._sorted = None

    def at(self, origins: np.ndarray) -> np.ndarray:
        """`(B,)` forecast origins -> `(B, T, Dy)` factors: over the pooled windows whose truth at
        that step was known at the origin (and within `window` before it); the validation factor
        where none was, or for every origin when `window` is None."""
        origins = np.asarray(origins, dtype="datetime64[ns]")
        scale = np.broadcast_to(self.static, (len(origins), *self.static.shape)).copy()  # (B, T, Dy)
        if self.window is None:
            return scale
        if self._sorted is None:
            needed, known = np.concatenate(self._needed), np.concatenate(self._known)  # (n, T, Dy), (n, T)
            order = known.argsort(axis=0, kind="stable")  # (n, T): per step, by the time its truth came in
            self._sorted = [(known[order[:, t], t], needed[order[:, t], t]) for t in range(known.shape[1])]
        span = np.timedelta64(self.window.value, "ns")
        for t, (known_t, needed_t) in enumerate(self._sorted):
            hi = np.searchsorted(known_t, origins, side="right")  # known at the origin
            lo = np.searchsorted(known_t, origins - span, side="right")  # and not longer than `window` before
            for b in range(len(origins)):
                if hi[b] > lo[b]:
                    scale[b, t] = conformal_factor(needed_t[lo[b] : hi[b]], self.coverage, self.static[t])
        return scale

    def latest(self) -> np.ndarray:
        """`(T, Dy)`: the factor for a forecast made after every pooled truth (what later forecasts use)."""
        if self.window is None:
            return self.static
        last = max(k.max() for k in self._known)
        return self.at(np.array([last]))[0]


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
