"""Anomaly baselines: fitted on train rows only, a score per row, contributions per channel."""

from __future__ import annotations

import numpy as np
import pytest

from tsformer.jobs.anomaly.baselines import (
    HotellingT2,
    IsolationForestScore,
    PCAResidual,
    RandomScore,
    WindowedPCAResidual,
    WindowMemoryScore,
    baselines,
)


def correlated_rows(n: int, seed: int = 0) -> np.ndarray:
    """(n, 4) rows with two underlying factors, channel scales 1 to 100."""
    rng = np.random.default_rng(seed)
    factors = rng.normal(size=(n, 2))
    mixing = np.array([[1.0, 0.5, 0.0, 2.0], [0.0, 1.0, 1.0, -1.0]])
    return (factors @ mixing + 0.05 * rng.normal(size=(n, 4))) * np.array([1.0, 10.0, 100.0, 1.0])


def test_hotelling_t2_is_the_mahalanobis_distance_to_the_train_rows():
    train, x = correlated_rows(500), correlated_rows(20, seed=1)
    result = HotellingT2().fit(train).score(x)
    mean, cov = train.mean(axis=0), np.cov(train, rowvar=False)  # unscaled: T² does not depend on scales
    d = x - mean
    expected = np.einsum("tc,cd,td->t", d, np.linalg.inv(cov), d)
    np.testing.assert_allclose(result.score, expected, rtol=1e-6)
    assert (result.contributions >= 0).all()


def test_hotelling_t2_ignores_a_channel_constant_in_the_train_rows():
    train = np.c_[correlated_rows(300), np.full(300, 5.0)]  # a command channel, constant while training
    x = np.c_[correlated_rows(10, seed=2), np.full(10, 5.0)]
    model = HotellingT2().fit(train)
    moved = x.copy()
    moved[:, 4] = 9.0
    np.testing.assert_allclose(model.score(moved).score, model.score(x).score, rtol=1e-9)
    assert np.isfinite(model.score(x).score).all() and (model.score(moved).contributions[:, 4] == 0).all()


def test_the_channel_that_broke_the_relation_contributes_most():
    train = correlated_rows(500)
    x = correlated_rows(5, seed=3)
    x[:, 2] += 300.0  # channel 2 leaves the plane of the other channels
    for model in (HotellingT2(), PCAResidual()):
        result = model.fit(train).score(x)
        assert (result.contributions.argmax(axis=1) == 2).all(), model.name
    np.testing.assert_allclose(result.contributions.sum(axis=1), result.score, rtol=1e-9)  # PCA's sum


def test_pca_keeps_the_components_of_the_train_rows_variance():
    train = correlated_rows(500)
    model = PCAResidual(explained_variance=0.95).fit(train)
    assert model.pca.n_components_ == 2  # two factors; the rest is noise
    normal, off = correlated_rows(50, seed=4), correlated_rows(50, seed=4) + np.array([0.0, 0.0, 0.0, 5.0])
    assert model.score(off).score.min() > model.score(normal).score.max()


@pytest.mark.parametrize("make", [HotellingT2, PCAResidual, IsolationForestScore, RandomScore])
def test_each_row_is_scored_by_the_train_rows_alone(make):
    """Scaling and fit come from the train rows: a row's score does not depend on the other scored rows."""
    train, x = correlated_rows(300), correlated_rows(60, seed=5)
    model = make().fit(train)
    whole = model.score(x)
    assert whole.score.shape == (60,) and np.isfinite(whole.score).all()
    if make is not RandomScore:  # noise has no rows to depend on
        np.testing.assert_allclose(model.score(x[30:]).score, whole.score[30:], rtol=1e-12)
    if whole.contributions is not None:
        assert whole.contributions.shape == (60, 4)


def test_isolation_forest_and_random_are_seeded():
    train, x = correlated_rows(300), correlated_rows(50, seed=6)
    forest = [IsolationForestScore(seed=s).fit(train).score(x).score for s in (0, 0, 1)]
    np.testing.assert_array_equal(forest[0], forest[1])
    assert not np.array_equal(forest[0], forest[2])
    noise = [RandomScore(seed=s).fit(train).score(x).score for s in (0, 0, 1)]
    np.testing.assert_array_equal(noise[0], noise[1])
    assert not np.array_equal(noise[0], noise[2]) and ((noise[0] >= 0) & (noise[0] < 1)).all()
    outlier = IsolationForestScore().fit(train).score(np.r_[x, [[50.0, 500.0, 5000.0, 50.0]]]).score
    assert outlier[-1] > outlier[:-1].max()


def test_bad_rows_are_named():
    train = correlated_rows(50)
    train[7, 2] = np.nan
    with pytest.raises(ValueError, match=r"train rows is not finite at row 7, channel 2"):
        HotellingT2().fit(train)
    with pytest.raises(ValueError, match="fitted on 4 channels, given 3"):
        PCAResidual().fit(correlated_rows(50)).score(correlated_rows(5)[:, :3])
    assert [b.name for b in baselines(seed=0)] == [
        "hotelling_t2",
        "pca_residual",
        "isolation_forest",
        "random",
        "window_memory",
        "pca_residual_window",
    ]
    with pytest.raises(ValueError, match="window_memory was fitted on 4 channels, given 3"):
        WindowMemoryScore(length=8).fit(correlated_rows(50)).score(correlated_rows(20)[:, :3])


def test_window_memory_is_the_distance_to_the_nearest_train_window_averaged_over_covering_windows():
    rng = np.random.default_rng(0)
    train = [np.c_[correlated_rows(60, seed=s), rng.integers(0, 2, 60)] for s in (1, 2)]  # 2 series, a state
    x = np.c_[correlated_rows(30, seed=3), rng.integers(0, 2, 30)]
    score = WindowMemoryScore(length=8).fit(train).score(x).score
    rows = np.concatenate(train)
    mean, sd = rows.mean(axis=0), rows.std(axis=0)
    mean[4], sd[4] = 0.0, 1.0  # the 0/1 channel is left as it is
    z = [(s - mean) / sd for s in [*train, x]]
    memory = [s[a : a + 8].ravel() for s in z[:2] for a in range(len(s) - 7)]  # never across the two series
    windows = [np.min([np.linalg.norm(z[2][a : a + 8].ravel() - m) for m in memory]) for a in range(23)]
    expected = [np.mean([windows[a] for a in range(23) if a <= t < a + 8]) for t in range(30)]
    np.testing.assert_allclose(score, expected, rtol=1e-6)
    pca = WindowedPCAResidual(length=8).fit(rows).score(x)
    by_row = PCAResidual().fit(rows).score(x).score
    window_means = [by_row[a : a + 8].mean() for a in range(23)]
    expected = [np.mean([window_means[a] for a in range(23) if a <= t < a + 8]) for t in range(30)]
    np.testing.assert_allclose(pca.score, expected, rtol=1e-6)
    np.testing.assert_allclose(pca.contributions.sum(axis=1), pca.score)
