"""Output heads: what the network's outputs mean, and how they are trained, sampled and read.

A family's network ends in one linear layer with `n_params` outputs per target channel (the raw
output `(..., C * P)`); the head turns them into the parameters of a forecast `(..., C, P)` and knows
- its loss against the truth `(..., C)`;
- its point value (`point(params)`, `(..., C)`): what `y_pred` holds;
- its quantiles at given levels (`quantiles(params, levels)`, `(..., C, K)`);
- one random draw per element (`sample(params)`, `(..., C)`), what the autoregressive families feed
  back when they sample trajectories;
- its parameters after a positive affine map of the data (`affine`, for RevIN and the scalers).

Heads (`model.head.kind`, config group `head=`):
- `point`: the value itself, trained with `model.loss` (MSE, MAE or Huber); no spread.
- `gaussian`: Normal(loc, scale), negative log likelihood; scale = softplus + `min_scale`.
- `student_t`: StudentT(df, loc, scale), negative log likelihood; df = `min_df` + softplus, so
  df > 2 and the variance is finite; quantiles from scipy's `stdtrit` (on the CPU).
- `quantile`: the quantiles at `quantile_levels` (pinball loss averaged over them), monotone by
  construction: the knot nearest the median is a raw output, and the others lie softplus increments
  above and below it. Anchored in the middle so that training treats the upper and lower knots
  alike (anchored at the lowest knot, every upper knot hangs on a chain of increments and the
  quantiles come out skewed: benchmarks/RESULTS_probabilistic.md). The
  distribution in between is the piecewise-linear quantile function through those knots (uniform
  density between two knots); beyond the outermost knots, exponential tails whose density matches
  the adjacent segment's (Laplace-like, unbounded): `q(u) = q_1 + b_lo log(u / tau_1)` below
  tau_1 with `b_lo = tau_1 (q_2 - q_1) / (tau_2 - tau_1)`, and the mirror image above tau_K.
  Sampling is inverse-CDF: a uniform draw through that quantile function.

The point value: `gaussian` and `student_t`: loc, their mean and median at once; `quantile`: the
median (`point: median`, default) or the mean of the distribution above (`point: mean`). For
sampled trajectories (autoregressive families) the point value is the mean or the median of the
paths at each step (`point`), see `tasks/probabilistic.py`.

Every head also carries the evaluation settings: `levels` (the quantile columns of the forecasts
CSV), `num_samples` (paths per window for the autoregressive families), `calibrate` and
`calibration_window` (widen or narrow the spread per step so that the central 80% interval covers
80% of earlier windows: the validation windows, then, rolling, the latest ones whose truth is known;
`tasks/probabilistic.py`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.distributions import Normal, StudentT

POINT_LOSSES = {"mse": F.mse_loss, "mae": F.l1_loss, "huber": F.huber_loss}
POINT_KINDS = ("mean", "median")
U_EPS = (
    1e-6  # uniform draws are kept in [U_EPS, 1 - U_EPS]: the tails' quantile function is infinite at 0 and 1
)


def check_levels(levels, setting: str) -> list[float]:
    """Sorted distinct levels strictly inside (0, 1), or a ValueError naming the setting."""
    try:
        values = [float(x) for x in levels]
    except (TypeError, ValueError):
        raise ValueError(f"{setting} must be a list of numbers in (0, 1), got {levels!r}") from None
    if not values or any(not 0.0 < x < 1.0 for x in values):
        raise ValueError(
            f"{setting} must be a non-empty list of numbers strictly between 0 and 1, got {values}"
        )
    if sorted(set(values)) != values:
        raise ValueError(f"{setting} must be increasing without repeats, got {values}")
    return values


def level_name(level: float) -> str:
    """The CSV column of a quantile level: 0.1 -> 'q0.1', 0.05 -> 'q0.05'."""
    return f"q{float(level):g}"


class Head:
    """Base class; see the module docstring. `params` are constrained, `raw` are network outputs."""

    kind = "base"
    n_params = 1
    probabilistic = True
    default_point = "mean"

    def __init__(
        self,
        levels=(0.1, 0.5, 0.9),
        num_samples: int = 100,
        point: str | None = None,
        calibrate: bool = True,
        calibration_window: str | None = "7D",
    ):
        self.levels = check_levels(levels, "model.head.levels")
        self.calibrate = bool(calibrate)
        self.calibration_window = calibration_window
        if calibration_window is not None:
            try:
                if pd.Timedelta(calibration_window) <= pd.Timedelta(0):
                    raise ValueError
            except ValueError:
                raise ValueError(
                    f"model.head.calibration_window must be a positive duration such as 7D or 12h, or null "
                    f"(the validation windows only), got {calibration_window!r}"
                ) from None
        if int(num_samples) < 2:
            raise ValueError(f"model.head.num_samples must be at least 2, got {num_samples}")
        self.num_samples = int(num_samples)
        self.point_kind = point or self.default_point
        if self.point_kind not in POINT_KINDS:
            raise ValueError(f"model.head.point must be one of {POINT_KINDS}, got {point!r}")

    def params(self, raw: torch.Tensor) -> torch.Tensor:
        """`(..., C * P)` network outputs -> `(..., C, P)` parameters."""
        if raw.shape[-1] % self.n_params:
            raise ValueError(
                f"{self.kind} head: last dimension {raw.shape[-1]} is not a multiple of {self.n_params}"
            )
        return self.constrain(raw.unflatten(-1, (raw.shape[-1] // self.n_params, self.n_params)))

    def constrain(self, raw: torch.Tensor) -> torch.Tensor:
        return raw

    def loss(self, params: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def point(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def quantiles(self, params: torch.Tensor, levels) -> torch.Tensor:
        raise NotImplementedError

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def affine(self, params: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The parameters of `loc + scale * X` for X ~ params; loc, scale `(..., C)`, scale > 0."""
        raise NotImplementedError

    def point_of_raw(self, raw: torch.Tensor) -> torch.Tensor:
        """`(..., C * P)` -> the point value `(..., C)`: what a deterministic rollout feeds back."""
        return self.point(self.params(raw))

    def sample_of_raw(self, raw: torch.Tensor) -> torch.Tensor:
        """`(..., C * P)` -> one draw `(..., C)`: what a sampled trajectory feeds back."""
        return self.sample(self.params(raw))


class PointHead(Head):
    """The value itself (P = 1), trained with MSE, MAE or Huber (`model.loss`)."""

    kind = "point"
    probabilistic = False

    def __init__(self, loss: str = "mse", **settings):
        super().__init__(**settings)
        if loss not in POINT_LOSSES:
            raise ValueError(f"unknown loss {loss!r}; choose one of {sorted(POINT_LOSSES)}")
        self.loss_fn = POINT_LOSSES[loss]

    def loss(self, params, target):
        return self.loss_fn(params[..., 0], target)

    def point(self, params):
        return params[..., 0]

    def point_of_raw(self, raw):
        return raw  # P = 1: the network's output is the value itself

    def quantiles(self, params, levels):
        return params[..., :1].expand(
            *params.shape[:-1], len(levels)
        )  # no spread: every quantile is the value

    def sample(self, params):
        return params[..., 0]

    def affine(self, params, loc, scale):
        return params * scale.unsqueeze(-1) + loc.unsqueeze(-1)


class GaussianHead(Head):
    """Normal(loc, scale): params `(..., C, 2)` = (loc, scale)."""

    kind = "gaussian"
    n_params = 2

    def __init__(self, min_scale: float = 1e-3, **settings):
        super().__init__(**settings)
        self.min_scale = float(min_scale)

    def constrain(self, raw):
        return torch.stack([raw[..., 0], F.softplus(raw[..., 1]) + self.min_scale], dim=-1)

    def distribution(self, params) -> Normal:
        return Normal(params[..., 0], params[..., 1])

    def loss(self, params, target):
        return -self.distribution(params).log_prob(target).mean()

    def point(self, params):
        return params[..., 0]  # mean = median

    def quantiles(self, params, levels):
        z = Normal(0.0, 1.0).icdf(torch.as_tensor(levels, dtype=params.dtype, device=params.device))  # (K,)
        return params[..., :1] + params[..., 1:2] * z  # (..., C, K)

    def sample(self, params):
        return params[..., 0] + params[..., 1] * torch.randn_like(params[..., 0])

    def affine(self, params, loc, scale):
        return torch.stack([params[..., 0] * scale + loc, params[..., 1] * scale], dim=-1)


class StudentTHead(Head):
    """StudentT(df, loc, scale): params `(..., C, 3)` = (loc, scale, df), df > `min_df`."""

    kind = "student_t"
    n_params = 3

    def __init__(self, min_scale: float = 1e-3, min_df: float = 2.0, **settings):
        super().__init__(**settings)
        self.min_scale = float(min_scale)
        self.min_df = float(min_df)
        if self.min_df < 1.0:
            raise ValueError(f"model.head.min_df must be at least 1 (the mean exists), got {min_df}")

    def constrain(self, raw):
        return torch.stack(
            [raw[..., 0], F.softplus(raw[..., 1]) + self.min_scale, F.softplus(raw[..., 2]) + self.min_df],
            dim=-1,
        )

    def distribution(self, params) -> StudentT:
        return StudentT(params[..., 2], params[..., 0], params[..., 1])

    def loss(self, params, target):
        return -self.distribution(params).log_prob(target).mean()

    def point(self, params):
        return params[..., 0]  # mean (df > 1) = median

    def quantiles(self, params, levels):
        from scipy.special import stdtrit  # the Student-t quantile function; torch has none

        df = params[..., 2:3].detach().cpu().double().numpy()  # (..., C, 1)
        t = stdtrit(df, np.asarray(levels, dtype=np.float64))  # (..., C, K)
        t = torch.as_tensor(t, dtype=params.dtype, device=params.device)
        return params[..., :1] + params[..., 1:2] * t

    def sample(self, params):
        return self.distribution(params).sample()

    def affine(self, params, loc, scale):
        return torch.stack([params[..., 0] * scale + loc, params[..., 1] * scale, params[..., 2]], dim=-1)


class QuantileHead(Head):
    """Quantiles at `quantile_levels`: params `(..., C, K)`, non-decreasing along K."""

    kind = "quantile"
    default_point = "median"

    def __init__(self, quantile_levels=(0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95), **settings):
        super().__init__(**settings)
        self.taus = check_levels(quantile_levels, "model.head.quantile_levels")
        if len(self.taus) < 2:
            raise ValueError(f"model.head.quantile_levels needs at least 2 levels, got {self.taus}")
        self.n_params = len(self.taus)
        self.anchor = min(
            range(len(self.taus)), key=lambda k: abs(self.taus[k] - 0.5)
        )  # knot nearest the median

    def constrain(self, raw):
        m = self.anchor
        anchor = raw[..., m : m + 1]  # (..., C, 1): the knot nearest the median
        up = F.softplus(raw[..., m + 1 :]).cumsum(
            dim=-1
        )  # (..., C, K - 1 - m) gaps above it, summed outwards
        down = (
            F.softplus(raw[..., :m]).flip(-1).cumsum(dim=-1).flip(-1)
        )  # (..., C, m) gaps below, summed outwards
        return torch.cat([anchor - down, anchor, anchor + up], dim=-1)  # (..., C, K), increasing

    def loss(self, params, target):
        taus = params.new_tensor(self.taus)  # (K,)
        return pinball_loss(params, target.unsqueeze(-1), taus).mean()

    def point(self, params):
        if self.point_kind == "median":
            return self.quantiles(params, [0.5])[..., 0]
        return self.mean(params)

    def mean(self, params):
        """The mean of the distribution of the module docstring: the integral of its quantile function."""
        taus = self.taus
        lo_slope, hi_slope = self._tail_slopes(params)
        inner = sum(
            (taus[k + 1] - taus[k]) * (params[..., k] + params[..., k + 1]) / 2 for k in range(len(taus) - 1)
        )
        lower = taus[0] * (params[..., 0] - lo_slope)  # integral of q_1 + b log(u / tau_1) over (0, tau_1)
        upper = (1 - taus[-1]) * (params[..., -1] + hi_slope)
        return inner + lower + upper

    def _tail_slopes(self, params):
        t = self.taus
        lo = t[0] * (params[..., 1] - params[..., 0]) / (t[1] - t[0])  # (..., C)
        hi = (1 - t[-1]) * (params[..., -1] - params[..., -2]) / (t[-1] - t[-2])
        return lo, hi

    def quantile_function(self, params: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The quantiles at levels `u (..., C, L)` (or `(L,)` for all elements) -> `(..., C, L)`."""
        taus = params.new_tensor(self.taus)  # (K,)
        K = len(self.taus)
        u = u.to(params.dtype).clamp(U_EPS, 1 - U_EPS)
        u = u.expand(*params.shape[:-1], u.shape[-1]).contiguous()  # (..., C, L)
        seg = (torch.searchsorted(taus, u) - 1).clamp(
            0, K - 2
        )  # inner segment [seg, seg + 1] (or the end one)
        q_lo, q_hi = params.gather(-1, seg), params.gather(-1, seg + 1)
        t_lo, t_hi = taus[seg], taus[seg + 1]
        inner = torch.lerp(
            q_lo, q_hi, (u - t_lo) / (t_hi - t_lo)
        )  # exact at both knots (monotone in float too)
        lo_slope, hi_slope = self._tail_slopes(params)  # (..., C)
        lower = params[..., :1] + lo_slope.unsqueeze(-1) * torch.log(u / taus[0])
        upper = params[..., -1:] - hi_slope.unsqueeze(-1) * torch.log((1 - u) / (1 - taus[-1]))
        return torch.where(u < taus[0], lower, torch.where(u > taus[-1], upper, inner))

    def quantiles(self, params, levels):
        return self.quantile_function(
            params, torch.as_tensor(levels, dtype=params.dtype, device=params.device)
        )

    def sample(self, params):
        u = torch.rand(params.shape[:-1], dtype=params.dtype, device=params.device)  # (..., C)
        return self.quantile_function(params, u.unsqueeze(-1))[..., 0]

    def affine(self, params, loc, scale):
        return params * scale.unsqueeze(-1) + loc.unsqueeze(-1)


def pinball_loss(q: torch.Tensor, y: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Elementwise pinball (quantile) loss of quantiles `q (..., K)` at `levels (K,)` for truth `y (..., 1)`."""
    diff = y - q
    return torch.maximum(levels * diff, (levels - 1) * diff)


HEADS = {cls.kind: cls for cls in (PointHead, GaussianHead, StudentTHead, QuantileHead)}


def build_head(settings: dict | None, loss: str = "mse") -> Head:
    """The head of `model.head` (a plain dict: `kind` and the head's settings); None = the point head.

    `loss` (`model.loss`) is the point head's loss; the distribution heads train on their own.
    """
    settings = dict(settings or {})
    kind = settings.pop("kind", "point")
    if kind not in HEADS:
        raise ValueError(
            f"unknown model.head.kind {kind!r}; choose one of {sorted(HEADS)} (config group head=)"
        )
    if kind == "point":
        settings["loss"] = loss
    try:
        return HEADS[kind](**settings)
    except TypeError as err:  # an unknown key
        raise ValueError(f"model.head ({kind}): {err}") from None
