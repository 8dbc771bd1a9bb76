"""Random dilated kernels (tsformer.nn.random_kernels): the vectorised transform equals the loop
reference; the ridge on their features (random_kernel_ridge): leave-one-out scores equal explicit
refits, and a toy set is learnt with probabilities that sum to one; an ensemble of such ridges is
its members' scores (or calibrated probabilities) averaged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tsformer.models.random_kernel_ridge import (
    RandomKernelRidge,
    RandomKernelRidgeEnsemble,
    ridge_loo,
    softmax,
)
from tsformer.nn.random_kernels import RandomDilatedKernels, kernel_weights


def series(S=4, T=32, D=3, seed=0):
    rng = np.random.default_rng(seed)
    x = torch.tensor(rng.normal(size=(S, T, D)))
    valid = torch.ones(S, T, dtype=torch.bool)
    valid[1, 22:] = False  # unequal lengths: padded at the end, masked
    valid[2, 12:] = False
    return x * valid.unsqueeze(-1), valid


def test_kernels_are_minirocket_weights():
    w = kernel_weights()
    assert w.shape == (84, 9) and np.all(w.sum(1) == 0) and set(np.unique(w)) == {-1.0, 2.0}


def test_vectorised_transform_equals_the_loop_reference():
    x, valid = series()
    kernels = RandomDilatedKernels(n_features=84 * 4, seed=1).fit(x, valid)
    assert len(kernels.dilations) > 1 and kernels.n_out == 84 * 4
    fresh, fresh_valid = series(seed=1)  # series the biases were not drawn from: no exact ties
    expected = kernels.reference(fresh.numpy(), fresh_valid.numpy())  # (S, F) float64 loops
    np.testing.assert_array_equal(kernels(fresh, fresh_valid, chunk=3).numpy(), expected)
    np.testing.assert_allclose(kernels(fresh.float(), fresh_valid).numpy(), expected, atol=1e-6)
    assert 0.05 < expected.mean() < 0.95  # PPV features: shares, neither all 0 nor all 1


def test_ridge_leave_one_out_equals_explicit_refits():
    rng = np.random.default_rng(0)
    F = rng.normal(size=(9, 30))
    Z = F - F.mean(0)
    Y = np.where(rng.random((9, 2)) > 0.5, 1.0, -1.0)
    alpha, loo, _ = ridge_loo(Z, Y, [0.1, 3.0, 100.0])
    for i in range(len(Z)):
        rest = np.arange(len(Z)) != i
        Zr, Yr = Z[rest], Y[rest]
        zm, ym = Zr.mean(0), Yr.mean(0)  # the intercept refitted without series i
        W = np.linalg.solve((Zr - zm).T @ (Zr - zm) + alpha * np.eye(Z.shape[1]), (Zr - zm).T @ (Yr - ym))
        np.testing.assert_allclose(loo[i], (Z[i] - zm) @ W + ym, rtol=1e-8, atol=1e-8)


def test_ridge_learns_a_toy_set_with_calibrated_probabilities():
    rng = np.random.default_rng(0)
    t = np.arange(64)
    labels = np.arange(40) % 2
    periods = np.where(labels == 1, 8.0, 20.0)  # two classes: fast and slow waves, random phase
    x = np.sin(2 * np.pi * (t[None] / periods[:, None] + rng.random((40, 1)))) + rng.normal(0, 0.3, (40, 64))
    x = torch.tensor(x[..., None])
    valid = torch.ones(40, 64, dtype=torch.bool)
    model = RandomKernelRidge(n_features=840, seed=0).fit(x[:30], valid[:30], labels[:30], 2)
    proba = model.predict_proba(x[30:], valid[30:])
    np.testing.assert_allclose(proba.sum(1), 1.0)
    assert (proba.argmax(1) == labels[30:]).all()
    assert model.temperature > 0 and model.alpha in model.alphas


def waves(n=40, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(64)
    labels = np.arange(n) % 3
    periods = np.array([6.0, 12.0, 24.0])[labels]  # three classes: wave periods, random phase
    x = np.sin(2 * np.pi * (t[None] / periods[:, None] + rng.random((n, 1)))) + rng.normal(0, 0.5, (n, 64))
    return torch.tensor(x[..., None]), torch.ones(n, 64, dtype=torch.bool), labels


@pytest.mark.parametrize("combine", ["scores", "proba"])
def test_ensemble_is_its_members_averaged(combine):
    x, valid, labels = waves()
    ens = RandomKernelRidgeEnsemble(3, combine, n_features=336, seed=2).fit(
        x[:30], valid[:30], labels[:30], 3
    )
    single = RandomKernelRidge(336, seed=2).fit(x[:30], valid[:30], labels[:30], 3)
    # member 0 is the single model of the same seed; the others draw other kernels
    np.testing.assert_array_equal(
        ens.members[0].decision(x[30:], valid[30:]), single.decision(x[30:], valid[30:])
    )
    assert not np.allclose(ens.members[1].coef, ens.members[0].coef[: len(ens.members[1].coef)])
    proba = ens.predict_proba(x[30:], valid[30:])
    np.testing.assert_allclose(proba.sum(1), 1.0)
    members = [m.decision(x[30:], valid[30:]) for m in ens.members]
    if combine == "scores":  # averaged scores, one temperature fitted on the averaged leave-one-out scores
        np.testing.assert_allclose(proba, softmax(np.mean(members, 0) / ens.temperature), rtol=1e-12)
        np.testing.assert_allclose(ens.loo_scores, np.mean([m.loo_scores for m in ens.members], 0))
    else:  # each member's calibrated probabilities, averaged
        expected = np.mean([softmax(d / m.temperature) for d, m in zip(members, ens.members, strict=True)], 0)
        np.testing.assert_allclose(proba, expected, rtol=1e-10, atol=1e-12)
        assert ens.temperature == 1.0
    assert (proba.argmax(1) == labels[30:]).mean() >= 0.8


def test_ensemble_refuses_bad_settings():
    with pytest.raises(ValueError, match="combine='mean'"):
        RandomKernelRidgeEnsemble(3, "mean")
    with pytest.raises(ValueError, match="members=0"):
        RandomKernelRidgeEnsemble(0)
