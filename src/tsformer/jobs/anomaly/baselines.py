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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.decomposition import PCA
from sklearn.ensemble import IsolationForest
from sklearn.preprocessing import StandardScaler


@dataclass(frozen=True)
class BaselineScores:
    score: np.ndarray  # (T,)
    contributions: np.ndarray | None  # (T, C), or None where the method has none


def _as_rows(x, what: str) -> np.ndarray:
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


def baselines(seed: int = 0) -> list:
    """One of each baseline (unfitted), those with randomness seeded with `seed`."""
    return [HotellingT2(), PCAResidual(), IsolationForestScore(seed=seed), RandomScore(seed=seed)]
