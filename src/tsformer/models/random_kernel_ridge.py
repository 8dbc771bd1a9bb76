"""A ridge classifier on random dilated kernel features (tsformer.nn.random_kernels), with probabilities
calibrated on its own leave-one-out scores.

Fit: the kernels' PPV features of the training series (and, with `diff=True`, of their first
differences, half the features each), standardised on the training series; a ridge regression on
the classes' +1/-1 codes, its penalty the one of `alphas` with the least leave-one-out squared error
(closed form from one eigendecomposition of the series' Gram matrix, so every penalty costs one
product); the probabilities are softmax(scores / T), T fitted by the least log loss of the training
series' leave-one-out scores: calibrated on series the ridge did not fit, every one of them used for
the fit too.
"""

from __future__ import annotations

import numpy as np
import torch

from tsformer.nn.random_kernels import RandomDilatedKernels

ALPHAS = np.logspace(-3, 3, 10)
TEMPERATURES = np.logspace(-3, 2, 101)  # of scores on the +1/-1 scale


class RandomKernelRidge:
    """Random-kernel features -> standardised -> ridge (LOO penalty) -> temperature-scaled softmax."""

    def __init__(self, n_features: int = 9996, diff: bool = False, alphas=ALPHAS, seed: int = 0):
        self.n_features, self.diff, self.seed = int(n_features), bool(diff), int(seed)
        self.alphas = np.asarray(alphas, dtype=np.float64)

    def _views(self, x: torch.Tensor, valid: torch.Tensor):
        """The series the kernels read: x itself and, with diff, its first differences (T - 1 steps)."""
        yield x, valid
        if self.diff:
            yield (x[:, 1:] - x[:, :-1]) * valid[:, 1:].unsqueeze(-1), valid[:, 1:]

    def features(self, x: torch.Tensor, valid: torch.Tensor) -> np.ndarray:
        """(S, T, D), (S, T) -> (S, F) float64 PPV features (fitted kernels)."""
        with torch.no_grad():
            parts = [
                k(v, m).double().numpy()
                for k, (v, m) in zip(self.kernels, self._views(x, valid), strict=True)
            ]
        return np.concatenate(parts, axis=1)

    def fit(
        self, x: torch.Tensor, valid: torch.Tensor, labels: np.ndarray, n_classes: int
    ) -> RandomKernelRidge:
        views = list(self._views(x, valid))
        per_view = self.n_features // len(views)
        self.kernels = [
            RandomDilatedKernels(per_view, seed=self.seed + i).fit(v, m) for i, (v, m) in enumerate(views)
        ]
        F = self.features(x, valid)  # (S, P)
        self.mean, self.scale = F.mean(0), F.std(0)
        self.scale[self.scale == 0] = 1.0
        Z = (F - self.mean) / self.scale
        Y = -np.ones((len(labels), n_classes))
        Y[np.arange(len(labels)), labels] = 1.0
        self.y_mean = Y.mean(0)
        self.alpha, loo, dual = ridge_loo(Z, Y, self.alphas)
        self.coef = Z.T @ dual  # (P, C)
        self.loo_scores = loo  # (S, C) each training series' score from a fit without it
        self.temperature = fit_temperature(loo, labels)
        return self

    def decision(self, x: torch.Tensor, valid: torch.Tensor) -> np.ndarray:
        Z = (self.features(x, valid) - self.mean) / self.scale
        return Z @ self.coef + self.y_mean  # (S, C)

    def predict_proba(self, x: torch.Tensor, valid: torch.Tensor, calibrated: bool = True) -> np.ndarray:
        return softmax(self.decision(x, valid) / (self.temperature if calibrated else 1.0))

    # -- as tensors (a model folder keeps these, `tasks.classification.RandomKernelRidgeTask`) --------

    def layout(self) -> list[tuple[list[int], list[int]]]:
        """Per view (the series, their differences): the kernels' dilations and biases per dilation."""
        return [k.layout() for k in self.kernels]

    def fitted_tensors(self) -> dict[str, torch.Tensor]:
        """Every fitted number: the kernels' draws (`view<i>_...`), standardisation, ridge weights."""
        out = {
            f"view{i}_{name}": t for i, k in enumerate(self.kernels) for name, t in k.fitted_tensors().items()
        }
        for name in ("mean", "scale", "coef", "y_mean"):
            out[name] = torch.as_tensor(getattr(self, name), dtype=torch.float64)
        return out

    def restore(self, layout, tensors: dict[str, torch.Tensor], temperature: float) -> RandomKernelRidge:
        """The fitted model again from `layout()`, `fitted_tensors()` and its temperature."""
        self.kernels = [
            RandomDilatedKernels(self.n_features // len(layout), seed=self.seed + i).restore(
                view, {name: tensors[f"view{i}_{name}"] for name in ("channels", "biases")}
            )
            for i, view in enumerate(layout)
        ]
        for name in ("mean", "scale", "coef", "y_mean"):
            setattr(self, name, tensors[name].double().cpu().numpy())
        self.temperature = float(temperature)
        return self


def ridge_loo(Z: np.ndarray, Y: np.ndarray, alphas) -> tuple[float, np.ndarray, np.ndarray]:
    """Ridge with an intercept on centred features Z (S, P) and targets Y (S, C), through the Gram
    matrix: the penalty of `alphas` with the least leave-one-out squared error, the leave-one-out
    predictions (S, C) at that penalty, and the dual coefficients (S, C) (coef = Z.T @ dual)."""
    Yc = Y - Y.mean(0)
    s, U = np.linalg.eigh(Z @ Z.T)  # Gram (S, S) = U diag(s) U^T
    s = np.clip(s, 0, None)
    UtY = U.T @ Yc
    # the intercept's direction (the constant series vector, in the Gram's null space since Z is
    # centred) is fitted exactly by the means: no residual, and its leverage 1/S is left out
    constant = int(np.argmax(np.abs(U.sum(0))))
    best = None
    for alpha in alphas:
        kept = alpha / (s + alpha)  # the share of each direction left in the residual
        kept[constant] = 0.0
        residual = U @ (kept[:, None] * UtY)  # (S, C) Y - fitted, without cancellation
        left = np.einsum("ij,j,ij->i", U, kept, U)  # (S,) 1 - leverage
        loo_residual = residual / np.clip(left, 1e-300, None)[:, None]
        error = float((loo_residual**2).mean())
        if best is None or error < best[0]:
            best = (error, float(alpha), Y - loo_residual)
    _, alpha, loo = best
    dual = U @ ((1.0 / (s + alpha))[:, None] * UtY)
    return alpha, loo, dual


def softmax(scores: np.ndarray) -> np.ndarray:
    z = scores - scores.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


def fit_temperature(scores: np.ndarray, labels: np.ndarray) -> float:
    """The T of `TEMPERATURES` with the least log loss of softmax(scores / T) on `labels`."""
    losses = [
        -np.log(np.clip(softmax(scores / t)[np.arange(len(labels)), labels], 1e-15, None)).mean()
        for t in TEMPERATURES
    ]
    return float(TEMPERATURES[int(np.argmin(losses))])


MEMBER_SEED_STRIDE = 1000  # member j draws its kernels from seed + 1000 j (member 0: the single model's)
COMBINES = ("scores", "proba")


class RandomKernelRidgeEnsemble:
    """`members` RandomKernelRidge fits on the same series, each with its own kernels' draws.

    combine="scores": the members' scores averaged, one temperature fitted on their averaged
    leave-one-out scores (calibrated after pooling); combine="proba": each member's calibrated
    probabilities averaged (each calibrated on its own leave-one-out scores), no temperature after.
    `decision` gives scores whose softmax over `temperature` is the ensemble's probabilities either way
    (with "proba", the log of the averaged probabilities and temperature 1)."""

    def __init__(
        self,
        members: int = 3,
        combine: str = "scores",
        n_features: int = 9996,
        diff: bool = False,
        alphas=ALPHAS,
        seed: int = 0,
    ):
        if combine not in COMBINES:
            raise ValueError(f"combine={combine!r}: one of {', '.join(COMBINES)}")
        if members < 1:
            raise ValueError(f"members={members}: at least 1")
        self.n_members, self.combine, self.seed = int(members), combine, int(seed)
        self.settings = {"n_features": n_features, "diff": diff, "alphas": alphas}

    def fit(
        self, x: torch.Tensor, valid: torch.Tensor, labels: np.ndarray, n_classes: int
    ) -> RandomKernelRidgeEnsemble:
        self.members = [
            RandomKernelRidge(seed=self.seed + MEMBER_SEED_STRIDE * j, **self.settings).fit(
                x, valid, labels, n_classes
            )
            for j in range(self.n_members)
        ]
        self.alpha = float(np.exp(np.mean([np.log(m.alpha) for m in self.members])))  # geometric mean
        if self.combine == "scores":
            self.loo_scores = np.mean([m.loo_scores for m in self.members], axis=0)
            self.temperature = fit_temperature(self.loo_scores, labels)
        else:
            loo = np.mean([softmax(m.loo_scores / m.temperature) for m in self.members], axis=0)
            self.loo_scores = np.log(np.clip(loo, 1e-300, None))
            self.temperature = 1.0
        return self

    def decision(self, x: torch.Tensor, valid: torch.Tensor) -> np.ndarray:
        if self.combine == "scores":
            return np.mean([m.decision(x, valid) for m in self.members], axis=0)
        proba = np.mean([m.predict_proba(x, valid) for m in self.members], axis=0)
        return np.log(np.clip(proba, 1e-300, None))

    def predict_proba(self, x: torch.Tensor, valid: torch.Tensor, calibrated: bool = True) -> np.ndarray:
        if not calibrated:
            return np.mean([m.predict_proba(x, valid, calibrated=False) for m in self.members], axis=0)
        return softmax(self.decision(x, valid) / self.temperature)
