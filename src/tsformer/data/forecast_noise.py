"""Forecast error on the future wind: known covariates as a weather forecast would give them.

A model that is trained and tested with the measured future wind (a perfect forecast) is judged on
information nobody has at forecast time. `ForecastNoise` turns the future part of each window's
known covariates into an imperfect forecast: the measured wind plus an error whose spread grows with
the lead time. The history stays measured (the past is known).

Error model, for the M future steps k = 1..M of one window:
- standard deviation linear in k through two reference points (`lead_steps`): by default the wind
  speed error has sd 0.5 m/s at step 1 and 1.5 m/s at step 18 (10-min steps: 3 h ahead), the
  direction error 5 deg at step 1 and 15 deg at step 18; beyond the points the line goes on
  (floored at 0);
- correlated over lead time: a unit AR(1) sequence e_k = rho e_{k-1} + sqrt(1 - rho^2) z_k
  (rho = `correlation`, 0.9 by default) times the sd, since a forecast that is too high at one step
  tends to be too high at the next; speed and direction errors are independent;
- applied in original units: speed + error, clipped at 0 m/s; the direction error rotates the
  angle, i.e. (sin, cos) of the direction are rotated, which keeps sin^2 + cos^2 = 1.

Determinism: the error of a window depends only on (`seed`, split, row of its first future step),
so every epoch, every training seed and every evaluation sees the same forecast for the same window
(the forecast is part of the data set, not of the run), and it does not change with the stride.
"""

from __future__ import annotations

import numpy as np
import torch

from tsformer.data.features import Affine


class ForecastNoise:
    """Lead-time-growing error on the future wind speed and direction (see the module docstring)."""

    def __init__(
        self,
        speed_col: str = "wind_speed",
        direction_cols: tuple[str, str] = ("wind_direction_sin", "wind_direction_cos"),
        speed_sd: tuple[float, float] = (0.5, 1.5),
        direction_sd_deg: tuple[float, float] = (5.0, 15.0),
        lead_steps: tuple[int, int] = (1, 18),
        correlation: float = 0.9,
        seed: int = 0,
    ):
        self.speed_col = str(speed_col)
        self.direction_cols = tuple(str(c) for c in direction_cols)
        self.speed_sd = tuple(float(s) for s in speed_sd)
        self.direction_sd_deg = tuple(float(s) for s in direction_sd_deg)
        self.lead_steps = tuple(int(k) for k in lead_steps)
        self.correlation = float(correlation)
        self.seed = int(seed)
        if len(self.direction_cols) != 2 or len(self.speed_sd) != 2 or len(self.direction_sd_deg) != 2:
            raise ValueError("direction_cols, speed_sd and direction_sd_deg each take two values")
        if len(self.lead_steps) != 2 or self.lead_steps[0] >= self.lead_steps[1]:
            raise ValueError(f"lead_steps must be two increasing steps, got {lead_steps}")
        if not 0.0 <= self.correlation < 1.0:
            raise ValueError(f"correlation must be in [0, 1), got {correlation}")
        self._columns = None  # set by bind()
        self._profiles: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    # -- the error model, in original units --------------------------------------------------------

    def _line(self, values: tuple[float, float], horizon: int) -> np.ndarray:
        k0, k1 = self.lead_steps
        steps = np.arange(1, horizon + 1)
        return np.maximum(values[0] + (values[1] - values[0]) * (steps - k0) / (k1 - k0), 0.0)

    def speed_sd_by_step(self, horizon: int) -> np.ndarray:
        """Wind speed error sd at lead steps 1..horizon, (M,) in m/s."""
        return self._line(self.speed_sd, horizon)

    def direction_sd_by_step(self, horizon: int) -> np.ndarray:
        """Direction error sd at lead steps 1..horizon, (M,) in degrees."""
        return self._line(self.direction_sd_deg, horizon)

    def _profile(self, horizon: int) -> tuple[np.ndarray, np.ndarray]:
        """(AR(1) mixing matrix (M, M), sd per step and variable (M, 2) in m/s and radians), cached:
        computed once per horizon rather than once per window."""
        if horizon not in self._profiles:
            steps = np.arange(horizon)
            lag = steps[:, None] - steps[None, :]  # (M, M): k - j
            weight = np.where(steps == 0, 1.0, np.sqrt(1.0 - self.correlation**2))  # (M,) of z_j
            # e_k = sum_{j <= k} rho^(k - j) w_j z_j, i.e. e_k = rho e_{k-1} + w_k z_k with unit variance
            mixing = np.where(lag >= 0, self.correlation ** np.maximum(lag, 0), 0.0) * weight[None, :]
            sd = np.stack(
                [self.speed_sd_by_step(horizon), np.deg2rad(self.direction_sd_by_step(horizon))], axis=1
            )  # (M, 2)
            self._profiles[horizon] = (mixing, sd)
        return self._profiles[horizon]

    def errors(self, horizon: int, split: int, row: int) -> tuple[np.ndarray, np.ndarray]:
        """(speed error in m/s, direction error in radians), each (M,), for the window whose first
        future step is `row` of the table in split number `split` (0 train, 1 val, 2 test)."""
        mixing, sd = self._profile(horizon)
        z = np.random.default_rng([self.seed, split, row]).standard_normal((horizon, 2))  # (M, 2)
        e = mixing @ z * sd  # (M, 2): speed, direction
        return e[:, 0], e[:, 1]

    # -- on the scaled window arrays ---------------------------------------------------------------

    def bind(self, scaled_known_cols: list[str], covariate_scaler: Affine) -> None:
        """Find the columns in the known covariates and how to un-scale them (called by the DataModule).

        `scaled_known_cols` are the known columns the covariate scaler (`FeaturePipeline`'s) was
        fitted on, in order (they come first in the known array and in the scaler; calendar channels
        follow, unscaled).
        """
        names = [self.speed_col, *self.direction_cols]
        missing = [c for c in names if c not in scaled_known_cols]
        if missing:
            raise ValueError(
                f"forecast noise needs {missing} among the known covariates {list(scaled_known_cols)}"
            )
        columns = np.array([scaled_known_cols.index(c) for c in names])
        scale, offset = np.asarray(covariate_scaler.scale), np.asarray(covariate_scaler.offset)
        self._columns, self._scale, self._offset = columns, scale[columns], offset[columns]

    def __call__(self, fut_known: torch.Tensor, *, split: int, row: int) -> torch.Tensor:
        """A noisy copy of one window's future known covariates, (M, Dk) scaled -> (M, Dk) scaled.

        Never writes into `fut_known`: it is a view of the shared data array.
        """
        if self._columns is None:
            raise RuntimeError("ForecastNoise.bind() must be called before use (the DataModule does it)")
        horizon = fut_known.shape[0]
        if not horizon:  # a window without future rows: nothing to perturb
            return fut_known
        out = fut_known.numpy().astype(np.float64)  # (M, Dk), a copy
        speed, sin, cos = (out[:, self._columns] * self._scale + self._offset).T  # each (M,) original units
        speed_error, angle_error = self.errors(horizon, split, row)
        speed = np.maximum(speed + speed_error, 0.0)
        # rotate the direction by the error: sin(a + d), cos(a + d)
        sin, cos = (
            sin * np.cos(angle_error) + cos * np.sin(angle_error),
            cos * np.cos(angle_error) - sin * np.sin(angle_error),
        )
        out[:, self._columns] = (np.stack([speed, sin, cos], axis=1) - self._offset) / self._scale  # (M, 3)
        return torch.from_numpy(out.astype(np.float32))
