"""Windows cut by index: a window is just the row where it starts.

All series are stored once, concatenated along time, as float32 tensors (rows, D). A window of
`context_len` N history steps and `horizon` M future steps starting at row s covers rows [s, s + N + M);
`__getitem__` returns views of those rows, so building a dataset of a million windows costs a million
integers, not a million copies of the data (the batch is only materialised by the DataLoader's collate).

Two kinds of window share this class:
- forecast (M > 0): the targets are the M future steps [s + N, s + N + M);
- reconstruction (M = 0): the N steps of the window are themselves the target, fut_* are (0, D).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import Dataset


def target_span(context_len: int, horizon: int) -> tuple[int, int]:
    """(offset of the first target step from the window start, number of target steps): the window's
    geometry, the data layer's one reading of a horizon of 0 (a window without future rows is its own
    target). Tasks declare what they produce (`tasks.base.WindowTask.produces`) and check that their
    horizon fits it; the data module is built before and without the task."""
    return (context_len, horizon) if horizon else (0, context_len)


def window_starts(
    segment: tuple[int, int],
    split_rows: tuple[int, int],
    context_len: int,
    horizon: int,
    stride: int = 1,
) -> np.ndarray:
    """Start rows of the windows inside one contiguous segment whose targets all lie in one split.

    `segment` = [start, stop) rows without gaps; `split_rows` = [lo, hi) rows of this series that
    belong to the split. The whole window must fit in the segment, its target steps in the split;
    the history may reach back before `lo` (the past is known at forecast time). Stride counts from
    the first valid window of the segment.
    """
    offset, n_target = target_span(context_len, horizon)
    first = max(segment[0], split_rows[0] - offset)
    last = min(segment[1] - context_len - horizon, split_rows[1] - offset - n_target)
    if last < first:
        return np.empty(0, dtype=np.int64)
    return np.arange(first, last + 1, stride, dtype=np.int64)


class WindowDataset(Dataset):
    """Windows over shared arrays; an item is a dict of float32 tensors plus the window's index.

    Item shapes: hist_target (N, Dy), hist_known (N, Dk), hist_observed (N, Do),
    fut_target (M, Dy), fut_known (M, Dk), fut_observed (M, Do), static_num (S_num,),
    static_cat (S_cat,) int64 category codes, hist_valid (N,) and fut_valid (M,) bool (False on filled
    steps), series () int64 (the window's series, 0.. in sorted order of the series ids), window () int64.

    `fut_known_transform(fut_known, row=...)`, when given, replaces each window's future known
    covariates (e.g. a weather forecast's error, `forecast_noise.py`); `row` is the table row of the
    window's first future step. It must return a new tensor, never write into the shared view.
    """

    def __init__(
        self,
        target,
        known,
        observed,
        starts,
        context_len: int,
        horizon: int,
        fut_known_transform: Callable[..., torch.Tensor] | None = None,
        static_num=None,
        static_cat=None,
        valid=None,
        series=None,
    ):
        # torch.as_tensor shares memory with a float32 numpy array: nothing is copied here
        self.target = torch.as_tensor(target, dtype=torch.float32)  # (rows, Dy)
        self.known = torch.as_tensor(known, dtype=torch.float32)  # (rows, Dk)
        self.observed = torch.as_tensor(observed, dtype=torch.float32)  # (rows, Do)
        rows = len(self.target)
        # False on rows inserted to fill a gap (data.fill): inputs, never targets of a loss or metric
        self.valid = torch.as_tensor(
            valid if valid is not None else np.ones(rows, dtype=bool), dtype=torch.bool
        )  # per row (constant within a series): scaled static numbers and static category codes
        self.static_num = torch.as_tensor(
            static_num if static_num is not None else np.zeros((rows, 0)), dtype=torch.float32
        )  # (rows, S_num)
        self.static_cat = torch.as_tensor(
            static_cat if static_cat is not None else np.zeros((rows, 0)), dtype=torch.int64
        )  # (rows, S_cat)
        # per row, the series as a code (per-series baselines); one series when not given
        self.series = torch.as_tensor(series if series is not None else np.zeros(rows), dtype=torch.int64)
        self.starts = np.asarray(starts, dtype=np.int64)  # (W,)
        self.context_len = int(context_len)
        self.horizon = int(horizon)
        self.fut_known_transform = fut_known_transform
        if self.context_len < 1 or self.horizon < 0:
            raise ValueError(f"need context_len >= 1 and horizon >= 0, got {context_len}, {horizon}")

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start = int(self.starts[i])
        hist = slice(start, start + self.context_len)
        fut = slice(start + self.context_len, start + self.context_len + self.horizon)
        fut_known = self.known[fut]
        if self.fut_known_transform is not None:
            fut_known = self.fut_known_transform(fut_known, row=fut.start)
        return {
            "hist_target": self.target[hist],
            "hist_known": self.known[hist],
            "hist_observed": self.observed[hist],
            "fut_target": self.target[fut],
            "fut_known": fut_known,
            "fut_observed": self.observed[fut],
            "hist_valid": self.valid[hist],
            "fut_valid": self.valid[fut],
            "static_num": self.static_num[start],
            "static_cat": self.static_cat[start],
            "series": self.series[start],
            "window": torch.tensor(i, dtype=torch.int64),
        }

    def target_rows(self) -> np.ndarray:
        """Row of every target step of every window, (W, T_out): T_out = M, or N for reconstruction."""
        offset, n_target = target_span(self.context_len, self.horizon)
        return self.starts[:, None] + offset + np.arange(n_target)[None, :]  # (W, T_out)

    def measured_target_rows(self) -> np.ndarray:
        """Every row some window predicts, once, sorted, without the rows filled in for gaps: the
        rows a per-row baseline may be fitted on."""
        rows = np.unique(self.target_rows())
        return rows[self.valid[rows].numpy()]

    @property
    def targets_are_window(self) -> bool:
        """Whether each window's targets are its own rows (reconstruction) rather than the rows after it."""
        return target_span(self.context_len, self.horizon)[0] == 0

    def origin_rows(self) -> np.ndarray:
        """Row of each window's origin, (W,): last history step (forecast) or window start."""
        offset, _ = target_span(self.context_len, self.horizon)
        return self.starts + max(offset - 1, 0)
