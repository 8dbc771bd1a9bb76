"""Classical anomaly scores, fitted on the train rows alone, to measure a detector against.

Each baseline is fitted on the train rows (assumed normal, labels never used) with `fit(train)`,
`train` an array (N, C), and scores any rows with `score(x)` -> `BaselineScores`: a score per row
(higher = more anomalous) and, where the method splits it by channel, per-channel contributions.
Each standardises the channels with a scaler fitted on the train rows (a channel constant there
keeps scale 1).
- `HotellingT2`: the Mahalanobis distance to the train rows' mean, T² = dᵀ Σ⁺ d, with the
  pseudo-inverse of their covariance (a constant or collinear channel adds no direction and no
  error). A channel's contribution is how much T² drops when that channel alone is replaced by its
  best value given the others, (Σ⁺ d)_c² / Σ⁺_cc (reconstruction-based contribution, Alcala & Qin
  2009): never negative, and largest for the faulty channel of a large single-channel fault, where
  the plain split d_c (Σ⁺ d)_c, which sums to T², can point at a correlated healthy channel. These
  contributions do not sum to the score.
- `PCAResidual`: the squared reconstruction error (SPE, the Q statistic) after projecting on the
  principal components that explain `explained_variance` of the train rows' variance; contributions
  are the squared errors per channel (they sum to the score).
- `IsolationForestScore`: scikit-learn's IsolationForest (fixed seed); score = -score_samples.
- `RandomScore`: uniform noise (seeded), the floor every other score must clear.
- `WindowMemoryScore` (`window_memory`): state channels (every train value 0 or 1) left as they are, the
  others z-scored on the train rows; every window of `length` rows of the train rows kept; a window's
  score is its Euclidean distance to the nearest kept window; a row's, the mean over the windows that
  cover it. No training; the strongest simple score on MSL (issue 41).
- `WindowedPCAResidual` (`pca_residual_window`): the PCA residual of each row, its mean over each
  window of `length` rows, and a row's score the mean over the windows that cover it.
The row-wise scores take the train rows as one array (or a list of series, joined); the window scores
take a list of series (windows never cross two) and score one series at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.decomposition import PCA
from sklearn.ensemble import IsolationForest
from sklearn.preprocessing import StandardScaler

from tsformer.data.anomaly import state_channels
from tsformer.data.window_scores import covering_window_starts, rows_of_windows


@dataclass(frozen=True)
class BaselineScores:
    score: np.ndarray  # (T,)
    contributions: np.ndarray | None  # (T, C), or None where the method has none


def _as_rows(x, what: str) -> np.ndarray:
    if isinstance(x, list | tuple):  # series: their rows, one after the other
        x = np.concatenate([np.asarray(s, dtype=float) for s in x])
    x = np.asarray(x, dtype=float)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"error: {what} must be a non-empty (rows, channels) array, not {x.shape}")
    bad = np.argwhere(~np.isfinite(x))
    if len(bad):
        row, channel = bad[0]
        raise ValueError(f"error: {what} is not finite at row {row}, channel {channel} ({x[row, channel]})")
    return x


class _Standardised:
    """Scaler fitted on the train rows; `score` checks the channels match."""

    name = ""

    def fit(self, train) -> _Standardised:
        train = _as_rows(train, "the train rows")
        self.scaler = StandardScaler().fit(train)
        self._fit(self.scaler.transform(train))
        return self

    def score(self, x) -> BaselineScores:
        x = _as_rows(x, "the scored rows")
        if x.shape[1] != self.scaler.n_features_in_:
            raise ValueError(
                f"error: {self.name} was fitted on {self.scaler.n_features_in_} channels, given {x.shape[1]}"
            )
        return self._score(self.scaler.transform(x))


class HotellingT2(_Standardised):
    name = "hotelling_t2"
    description = "Hotelling's T² from the train rows' mean and covariance"

    def __init__(self, rcond: float = 1e-10):
        self.rcond = rcond  # singular values below rcond x the largest count as zero (pinv)

    def _fit(self, z: np.ndarray) -> None:
        self.mean = z.mean(axis=0)
        cov = np.atleast_2d(np.cov(z, rowvar=False))  # (C, C)
        self.precision = np.linalg.pinv(cov, rcond=self.rcond, hermitian=True)

    def _score(self, z: np.ndarray) -> BaselineScores:
        d = z - self.mean  # (T, C)
        pulled = d @ self.precision  # (T, C): Σ⁺ d per row (Σ⁺ is symmetric)
        diagonal = np.diag(self.precision)  # (C,), 0 for a channel without variance in the train rows
        safe = np.where(diagonal > 0, diagonal, 1.0)
        contributions = np.where(diagonal > 0, pulled**2 / safe, 0.0)  # (T, C)
        return BaselineScores((d * pulled).sum(axis=1), contributions)


class PCAResidual(_Standardised):
    name = "pca_residual"
    description = "PCA reconstruction error (components of 95 % of the train rows' variance)"

    def __init__(self, explained_variance: float = 0.95):
        self.explained_variance = explained_variance

    def _fit(self, z: np.ndarray) -> None:
        # a float n_components keeps the fewest components reaching that fraction of the variance
        self.pca = PCA(n_components=self.explained_variance, svd_solver="full").fit(z)

    def _score(self, z: np.ndarray) -> BaselineScores:
        residual = z - self.pca.inverse_transform(self.pca.transform(z))  # (T, C)
        contributions = residual**2
        return BaselineScores(contributions.sum(axis=1), contributions)


class IsolationForestScore(_Standardised):
    name = "isolation_forest"
    description = "scikit-learn's IsolationForest fitted on the train rows"

    def __init__(self, seed: int = 0, n_estimators: int = 100):
        self.seed = seed
        self.n_estimators = n_estimators

    def _fit(self, z: np.ndarray) -> None:
        self.forest = IsolationForest(n_estimators=self.n_estimators, random_state=self.seed).fit(z)

    def _score(self, z: np.ndarray) -> BaselineScores:
        return BaselineScores(-self.forest.score_samples(z), None)


class RandomScore:
    name = "random"
    description = "uniform noise: the floor every score must clear"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def fit(self, train) -> RandomScore:
        _as_rows(train, "the train rows")
        return self

    def score(self, x) -> BaselineScores:
        x = _as_rows(x, "the scored rows")
        return BaselineScores(np.random.default_rng(self.seed).uniform(size=len(x)), None)


def _series(train, what: str) -> list[np.ndarray]:
    """The train rows as a list of series `(T_s, C)` (one array: one series)."""
    series = list(train) if isinstance(train, list | tuple) else [train]
    return [_as_rows(s, what) for s in series]


def _windows(z: np.ndarray, length: int, starts: np.ndarray) -> np.ndarray:
    """`(W, length * C)`: the flattened windows of `z (T, C)` starting at `starts`."""
    return np.lib.stride_tricks.sliding_window_view(z, length, axis=0)[starts].reshape(len(starts), -1)


class WindowMemoryScore:
    name = "window_memory"
    description = "distance of each window to the nearest train window (0/1 states as they are), row: mean of its windows"

    def __init__(self, length: int = 32, chunk: int = 1024):
        self.length, self.chunk = length, chunk

    def fit(self, train) -> WindowMemoryScore:
        series = _series(train, "the train rows")
        rows = np.concatenate(series)
        self.states = state_channels(rows)  # (C,)
        sd = rows.std(axis=0)
        self.loc = np.where(self.states, 0.0, rows.mean(axis=0))
        self.scale = np.where(self.states | (sd < 1e-8), 1.0, sd)
        kept = [s for s in series if len(s) >= self.length]
        if not kept:
            raise ValueError(f"error: window_memory: no train series holds a window of {self.length} rows")
        self.memory = np.concatenate(
            [
                _windows((s - self.loc) / self.scale, self.length, np.arange(len(s) - self.length + 1))
                for s in kept
            ]
        )  # (M, length * C)
        self.memory_sq = (self.memory**2).sum(axis=1)
        return self

    def score(self, x) -> BaselineScores:
        x = _as_rows(x, "the scored rows")
        if x.shape[1] != len(self.loc):
            raise ValueError(f"error: {self.name} was fitted on {len(self.loc)} channels, given {x.shape[1]}")
        z = (x - self.loc) / self.scale
        starts = covering_window_starts(len(z), self.length, 1)
        nearest = np.empty(len(starts))
        for a in range(0, len(starts), self.chunk):
            q = _windows(z, self.length, starts[a : a + self.chunk])
            squared = (q**2).sum(axis=1, keepdims=True) + self.memory_sq - 2 * q @ self.memory.T  # (Q, M)
            nearest[a : a + self.chunk] = np.sqrt(np.maximum(squared.min(axis=1), 0.0))
        return BaselineScores(rows_of_windows(nearest, starts, self.length, len(z)), None)


class WindowedPCAResidual(PCAResidual):
    name = "pca_residual_window"
    description = "PCA residual, its mean over windows of 32 rows, row: mean of its windows"

    def __init__(self, explained_variance: float = 0.95, length: int = 32):
        super().__init__(explained_variance)
        self.length = length

    def _score(self, z: np.ndarray) -> BaselineScores:
        rows = super()._score(z).contributions  # (T, C)
        starts = covering_window_starts(len(z), self.length, 1)
        summed = np.concatenate([np.zeros((1, rows.shape[1])), np.cumsum(rows, axis=0)])
        windows = (summed[starts + self.length] - summed[starts]) / self.length  # (W, C)
        contributions = rows_of_windows(windows, starts, self.length, len(z))
        return BaselineScores(contributions.sum(axis=1), contributions)


def baselines(seed: int = 0) -> list:
    """One of each baseline (unfitted), those with randomness seeded with `seed`."""
    return [HotellingT2(), PCAResidual(), IsolationForestScore(seed=seed), RandomScore(seed=seed),
            WindowMemoryScore(), WindowedPCAResidual()]  # fmt: skip
