"""The linear gate (`model.linear_gate`): how much of the Transformer's correction a forecaster keeps.

A forecaster beside the closed-form linear forecaster (`models/linear.py`, solved on the run's train
windows as the run's `linear` baseline is) gives

    forecast = linear + a * (model - linear),    a in [0, 1] per group,

the share `a` chosen on the run's validation windows after training, in closed form for each group
of forecast values: `global` (one share), `step` (one per horizon step), `channel` (one per target
channel). With r = y - linear (what the linear forecaster misses) and c = model - linear (the
correction), the least-squares share is a = clip(<r, c> / <c, c>, 0, 1).

The validation windows also chose the checkpoint, and a share fitted on them always lowers their
MSE, so a group keeps its share only where the gain is clear out of sample: the validation windows
are cut by time into `BLOCKS` blocks, the share fitted on the other blocks must lower each block's
squared error, and the total of those out-of-block gains must reach `MIN_GAIN` of the linear
forecaster's squared error in the group. Elsewhere a = 0: the forecast is exactly the linear
forecaster's.
"""

from __future__ import annotations

import torch

GATES = ("none", "global", "step", "channel")
BLOCKS = 4  # contiguous blocks of validation windows, by time
MIN_GAIN = 1e-3  # the out-of-block gain a kept share must reach, relative to the linear forecaster's SSE


class GateSums:
    """Per block of validation windows and per (step, channel): the sums <r, c>, <c, c>, <r, r> (float64)
    over the valid values, and their count."""

    def __init__(self, n_windows: int, horizon: int, d_target: int):
        self.n_windows = n_windows
        shape = (BLOCKS, horizon, d_target)
        self.rc, self.cc, self.rr, self.n = (torch.zeros(shape, dtype=torch.float64) for _ in range(4))
        self.seen = 0  # windows added so far: they arrive in time order

    def add(self, y: torch.Tensor, linear: torch.Tensor, model: torch.Tensor, valid: torch.Tensor) -> None:
        """`y, linear, model (B, M, Dy)` of the next B validation windows, `valid (B, M)` bool."""
        r, c = (y - linear).double().cpu(), (model - linear).double().cpu()  # (B, M, Dy)
        keep = valid.cpu()[..., None].expand_as(r)  # (B, M, Dy)
        r, c = r.where(keep, 0.0), c.where(keep, 0.0)
        position = torch.arange(self.seen, self.seen + len(r))
        block = (position * BLOCKS // max(self.n_windows, 1)).clamp(max=BLOCKS - 1)  # (B,)
        for name, value in (("rc", r * c), ("cc", c * c), ("rr", r * r), ("n", keep.double())):
            getattr(self, name).index_add_(0, block, value)
        self.seen += len(r)


def _grouped(x: torch.Tensor, form: str) -> torch.Tensor:
    """`(..., M, Dy)` sums -> the form's groups, kept 2-d: `(..., 1, 1)`, `(..., M, 1)` or `(..., 1, Dy)`."""
    dims = {"global": (-2, -1), "step": (-1,), "channel": (-2,)}[form]
    return x.sum(dim=dims, keepdim=True)


def _share(rc: torch.Tensor, cc: torch.Tensor) -> torch.Tensor:
    return torch.where(cc > 0, rc / cc.clamp(min=1e-300), torch.zeros_like(rc)).clamp(0.0, 1.0)


def fit_gate(sums: GateSums, form: str) -> tuple[torch.Tensor, dict[str, float]]:
    """The share `(M, Dy)` (float32) of `form` and its validation figures (`gate/*`, scaled units):
    the MSE of the linear forecaster, of the model as trained (a = 1) and gated, the share of groups
    kept and the mean share over the forecast values."""
    if form not in GATES[1:]:
        raise ValueError(f"model.linear_gate: {form!r} is not one of {', '.join(GATES[1:])}")
    rc, cc, rr = (_grouped(getattr(sums, k), form) for k in ("rc", "cc", "rr"))  # (BLOCKS, g, h)
    share = _share(rc.sum(0), cc.sum(0))  # (g, h), fitted on every validation window
    gains = []
    for b in range(BLOCKS):  # the share of the other blocks, scored on block b
        a = _share(rc.sum(0) - rc[b], cc.sum(0) - cc[b])
        gains.append(2 * a * rc[b] - a * a * cc[b])  # linear SSE - gated SSE on block b
    gains = torch.stack(gains)  # (BLOCKS, g, h)
    present = sums.n.sum(dim=(-2, -1)) > 0  # (BLOCKS,) blocks with windows
    clear = (gains[present] > 0).all(0) & (gains.sum(0) >= MIN_GAIN * rr.sum(0))
    share = torch.where(clear, share, torch.zeros_like(share))
    M, Dy = sums.rc.shape[1:]
    full = share.expand(M, Dy)  # (M, Dy)
    n = float(sums.n.sum())
    rc_all, cc_all, rr_all = (getattr(sums, k).sum(0) for k in ("rc", "cc", "rr"))  # (M, Dy)
    report = {
        "gate/val_mse_linear": float(rr_all.sum()) / n,
        "gate/val_mse_model": float((rr_all - 2 * rc_all + cc_all).sum()) / n,
        "gate/val_mse_gated": float((rr_all - 2 * full * rc_all + full * full * cc_all).sum()) / n,
        "gate/kept_groups": float(clear.double().mean()),
        "gate/mean_share": float(full.mean()),
    }
    return full.float().contiguous(), report
