"""Windows of one series and their scores back to rows (anomaly detection, `tasks/anomaly.py`).

Every anomaly scorer scores windows of `length` rows; a row gets a score from the windows around it:
- `rows_of_windows` (a whole table): the mean of the scores of every window that covers the row, the
  windows starting every `stride` rows (`covering_window_starts`: the last one ends at the last row, so
  every row is covered). A change in one row moves the scores of the rows whose covering windows hold it,
  and of no other row.
- `causal_rows_of_windows` (rows arriving one at a time): the mean of the scores of the windows that end
  in the `length` rows up to and including the row, so a row's score never reads a later row. The rows
  before the first window's end have no complete window yet: their score is 0.
A window's score may also be split over its rows (a window restored, or matched to a normal window,
as a whole, each row keeping its own error): `rows_of_window_rows` gives a row the mean of its own
parts over the windows that cover it, and its causal form the part of the row in the window that ends
at it.
"""

from __future__ import annotations

import numpy as np


def covering_window_starts(n_rows: int, length: int, stride: int) -> np.ndarray:
    """Starts of windows every `stride` steps, the last one ending at the last row (every row covered)."""
    if n_rows < length:
        raise ValueError(f"{n_rows} rows hold no window of {length}")
    starts = np.arange(0, n_rows - length + 1, stride)
    if starts[-1] != n_rows - length:
        starts = np.append(starts, n_rows - length)
    return starts


def rows_of_windows(scores: np.ndarray, starts: np.ndarray, length: int, n_rows: int) -> np.ndarray:
    """Each row's mean of `scores` `(W, ...)` over the windows (starting at `starts`) that cover it:
    `(n_rows, ...)`; a row no window covers gets 0. (Summed window by window, so a row whose covering
    windows keep their scores keeps its score to the bit.)"""
    scores, starts = np.asarray(scores, dtype=float), np.asarray(starts)
    if len(np.unique(starts)) != len(starts) or (len(starts) and starts.min() < 0):
        return reference_rows_of_windows(scores, starts, length, n_rows)
    total, count = np.zeros((n_rows, *scores.shape[1:])), np.zeros(n_rows)
    # one offset into the windows at a time (no two windows at one row then); offsets from the last, so
    # each row's windows are added in the order of their starts, as `np.add.at` adds them: equal to the bit
    for offset in range(length - 1, -1, -1):
        at = starts + offset
        inside = at < n_rows
        total[at[inside]] += scores[inside]
        count[at[inside]] += 1.0
    return total / np.maximum(count, 1.0).reshape((-1,) + (1,) * (scores.ndim - 1))


def reference_rows_of_windows(scores: np.ndarray, starts: np.ndarray, length: int, n_rows: int) -> np.ndarray:
    """`rows_of_windows` written out: each window's score repeated over its rows, each row's mean of them
    (`rows_of_window_rows`); a copy of `(W, length, ...)` and `np.add.at`, several times slower."""
    scores = np.asarray(scores, dtype=float)
    return rows_of_window_rows(np.repeat(scores[:, None], length, axis=1), starts, n_rows)


def causal_rows_of_windows(scores: np.ndarray, starts: np.ndarray, length: int, n_rows: int) -> np.ndarray:
    """Each row's mean of `scores` `(W, ...)` over the windows that end at or before it, within the
    `length` rows up to it: `(n_rows, ...)`; the rows before the first window's end get 0."""
    ends = np.asarray(starts) + length - 1
    return rows_of_windows(scores, ends, length, n_rows)  # a window "covers" the rows end .. end + length - 1


def rows_of_window_rows(
    parts: np.ndarray, starts: np.ndarray, n_rows: int, causal: bool = False
) -> np.ndarray:
    """Each row's own part `(n_rows, ...)` of `parts` `(W, length, ...)` (window, row in it): its mean over
    the windows covering it, or (`causal`) its part in the window that ends at it (0 before the first
    window's end); 0 where no window has it."""
    parts = np.asarray(parts, dtype=float)
    length = parts.shape[1]
    starts = np.asarray(starts)
    if causal:  # the last row of each window, at the window's end
        out = np.zeros((n_rows, *parts.shape[2:]))
        out[starts + length - 1] = parts[:, -1]
        return out
    inside = (
        starts[:, None] + np.arange(length) < n_rows
    )  # (W, length): a causal window may end past the rows
    at = (starts[:, None] + np.arange(length))[inside]
    total = np.zeros((n_rows, *parts.shape[2:]))
    np.add.at(total, at, parts[inside])
    count = np.bincount(at, minlength=n_rows).astype(float)
    shape = (-1,) + (1,) * (parts.ndim - 2)
    return total / np.maximum(count, 1.0).reshape(shape)
