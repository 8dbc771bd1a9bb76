"""The closed-form linear forecaster: one ridge regression from a window to its horizon, every target
channel through the same weights.

What a forecasting Transformer must beat ("Are Transformers Effective for Time Series Forecasting?",
2023): on the scaled values, each channel's window minus a reference (its last value or its mean)
maps to the next M values minus the same reference; the future steps' known covariates, where the
data has them, are extra inputs. The weights solve the normal equations

    (X^T X + lambda D) W = X^T Y,    X (rows, P), Y (rows, M), D = I but 0 for the intercept,

with one row per window and target channel (P = N + M * Dk + 1 inputs: the window, the known
covariates of the M future steps, an intercept). The penalty is chosen among `penalties`, relative
to the mean diagonal of X^T X (so the choice does not depend on the number of rows or the scaling),
by the mean squared error on validation windows: both Gram matrices are accumulated once, in float64,
batch by batch, so a fit costs one pass over each split and a P x P solve per candidate.

Windows with a filled step (data.fill) or a missing value among their targets are not fitted on,
as a model's loss leaves such steps out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

SUBTRACT = ("last", "mean")
# relative penalties (x the mean diagonal of X^T X), from almost none to strong shrinkage; what the ETT
# rows chose: benchmarks/RESULTS_forecasting.md
PENALTIES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)


@dataclass
class LinearConfig:
    context_len: int  # N history steps of each channel
    horizon: int  # M future steps
    d_known: int = 0  # known covariates of each future step, taken as inputs
    subtract: str = "last"  # last | mean: the window's reference, taken from inputs and added back
    penalties: tuple[float, ...] = PENALTIES

    def __post_init__(self) -> None:
        if self.subtract not in SUBTRACT:
            raise ValueError(f"model.subtract: {self.subtract!r} is not one of {', '.join(SUBTRACT)}")
        penalties = tuple(float(p) for p in self.penalties)
        if not penalties or any(not p >= 0 for p in penalties):
            raise ValueError(f"model.penalties: {list(self.penalties)} must be one or more numbers >= 0")
        self.penalties = penalties

    @property
    def n_inputs(self) -> int:
        return self.context_len + self.horizon * self.d_known + 1


class NormalEquations:
    """X^T X, X^T Y and Y^T Y (float64) summed over batches of rows, and the row count."""

    def __init__(self, n_inputs: int, n_outputs: int):
        self.xtx = torch.zeros(n_inputs, n_inputs, dtype=torch.float64)
        self.xty = torch.zeros(n_inputs, n_outputs, dtype=torch.float64)
        self.yty = torch.zeros((), dtype=torch.float64)
        self.rows = 0

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        x, y = x.double().cpu(), y.double().cpu()  # (R, P), (R, M)
        self.xtx += x.T @ x
        self.xty += x.T @ y
        self.yty += (y * y).sum()
        self.rows += len(x)

    def mse(self, weight: torch.Tensor) -> float:
        """Mean squared error of `weight` (P, M) over the rows and outputs summed here."""
        sse = self.yty - 2 * (weight * self.xty).sum() + (weight * (self.xtx @ weight)).sum()
        return float(sse) / (self.rows * self.xty.shape[1])


class ChannelSharedLinear(nn.Module):
    """`(hist_target (B, N, C), fut_known (B, M, Dk)) -> (B, M, C)`, fitted in closed form (`fit`).

    The weights are parameters that no optimiser moves (requires_grad False): they live in the
    state_dict like any model's, so a checkpoint and a model folder hold them.
    """

    attends = False  # no attention layer: no attention figure

    def __init__(self, cfg: LinearConfig):
        super().__init__()
        self.cfg = cfg
        P, M = cfg.n_inputs, cfg.horizon
        self.weight = nn.Parameter(torch.zeros(P, M), requires_grad=False)  # (P, M)
        self.register_buffer(
            "penalty", torch.tensor(float("nan"), dtype=torch.float64)
        )  # the chosen one (relative); NaN: unfitted

    def design(self, hist_target: torch.Tensor, fut_known: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(X (B * C, P), reference (B, 1, C))`: one row per window and channel, window-major."""
        B, N, C = hist_target.shape
        if N != self.cfg.context_len:
            raise ValueError(f"the linear forecaster reads {self.cfg.context_len} history steps, got {N}")
        ref = hist_target[:, -1:] if self.cfg.subtract == "last" else hist_target.mean(dim=1, keepdim=True)
        window = (hist_target - ref).transpose(1, 2).reshape(B * C, N)  # (B * C, N)
        parts = [window]
        if self.cfg.d_known:
            known = fut_known[..., : self.cfg.d_known].reshape(B, -1)  # (B, M * Dk)
            parts.append(known.repeat_interleave(C, dim=0))  # (B * C, M * Dk), the same for each channel
        parts.append(window.new_ones(B * C, 1))
        return torch.cat(parts, dim=1), ref  # (B * C, P), (B, 1, C)

    def forward(self, hist_target: torch.Tensor, fut_known: torch.Tensor) -> torch.Tensor:
        B, _, C = hist_target.shape
        x, ref = self.design(hist_target, fut_known)
        out = (x @ self.weight.to(x.dtype)).reshape(B, C, -1).transpose(1, 2)  # (B, M, C)
        return out + ref

    def _equations(self, batches: Iterable[dict]) -> NormalEquations:
        eq = NormalEquations(self.cfg.n_inputs, self.cfg.horizon)
        for batch in batches:
            x, ref = self.design(batch["hist_target"], batch["fut_known"])
            y = (batch["fut_target"] - ref).transpose(1, 2).reshape(len(x), -1)  # (B * C, M)
            C = batch["hist_target"].shape[-1]
            usable = torch.isfinite(x).all(dim=1) & torch.isfinite(y).all(dim=1)  # (B * C,)
            if "fut_valid" in batch:  # filled steps are never learned from
                usable &= batch["fut_valid"].all(dim=1).repeat_interleave(C)
            eq.add(x[usable], y[usable])
        return eq

    @torch.no_grad()
    def fit(self, train_batches: Iterable[dict], val_batches: Iterable[dict]) -> dict[float, float]:
        """Solve the normal equations of the train windows for each penalty, keep the one with the
        lowest validation MSE; returns `{penalty: validation MSE}` (scaled units, reference included)."""
        train, val = self._equations(train_batches), self._equations(val_batches)
        for name, eq in (("train", train), ("validation", val)):
            if eq.rows == 0:
                raise ValueError(f"the linear forecaster has no complete {name} window to fit on")
        scores, weights = {}, {}
        for penalty in self.cfg.penalties:
            weights[penalty] = ridge_solution(train.xtx, train.xty, penalty)
            scores[penalty] = val.mse(weights[penalty])
        best = min(scores, key=scores.get)
        self.weight.copy_(weights[best].to(self.weight.dtype))
        self.penalty.fill_(best)
        return scores


def ridge_solution(xtx: torch.Tensor, xty: torch.Tensor, penalty: float) -> torch.Tensor:
    """`(X^T X + lambda D)^-1 X^T Y`, lambda = penalty x the mean diagonal of X^T X without the
    intercept (the last input), D the identity without the intercept's entry."""
    P = len(xtx)
    scale = xtx.diagonal()[:-1].mean() if P > 1 else xtx.new_ones(())
    ridge = torch.ones(P, dtype=xtx.dtype)
    ridge[-1] = 0.0  # the intercept is not shrunk
    a = xtx + torch.diag(ridge * penalty * scale)
    return torch.linalg.lstsq(a, xty).solution if penalty == 0 else torch.linalg.solve(a, xty)
