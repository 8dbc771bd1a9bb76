"""Filling short gaps in time (`data.fill`), so that windows may span them.

By default a gap (consecutive timestamps of a series further apart than the frequency) splits the
series into segments and no window spans it. With `fill="interpolate"` or `fill="ffill"`, gaps of
at most `max_fill_steps` missing steps are closed instead: the missing timestamps are inserted and
their values interpolated linearly between the neighbours (or carried forward from the last one).
Longer gaps still split the series. The inserted rows are flagged (`filled`): models read them as
inputs, but they are never a target of the loss or of a metric, and the forecasts CSV leaves their
`y_true` empty, since nobody measured them.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

FILL_METHODS = ("interpolate", "ffill")
FILLED_ROW = -1  # the index (file row number) of inserted rows


def fill_gaps(
    clean: pd.DataFrame,
    time_col: str,
    series_col: str | None,
    step: pd.Timedelta,
    method: str,
    max_steps: int,
    source: str = "data",
) -> tuple[pd.DataFrame, np.ndarray]:
    """`clean` (validated, sorted by series and time) with the short gaps closed.

    Returns the new table, whose inserted rows have index FILLED_ROW (the others keep their file row
    numbers), and `filled` `(rows,)` bool. Numeric columns are interpolated or carried forward, other
    columns (series id, static categories) carried forward; only inside a gap, never past the ends.
    """
    if method not in FILL_METHODS:
        raise ValueError(
            f"unknown fill {method!r}; choose one of {FILL_METHODS} (or null: gaps split series)"
        )
    if max_steps < 1:
        raise ValueError(f"max_fill_steps must be >= 1 with fill={method!r}, got {max_steps}")
    groups = clean.groupby(series_col, sort=False) if series_col else [(None, clean)]
    parts, n_filled, n_gaps = [], 0, 0
    for _, group in groups:
        times = group[time_col].to_numpy()
        missing = (np.diff(times) // step.to_timedelta64()) - 1  # missing steps after each row
        aligned = (np.diff(times) % step.to_timedelta64()) == np.timedelta64(0)
        short = np.flatnonzero((missing >= 1) & (missing <= max_steps) & aligned)
        if not short.size:
            parts.append(group.assign(_filled=False))
            continue
        inserted = np.concatenate(
            [times[i] + step.to_timedelta64() * np.arange(1, missing[i] + 1) for i in short]
        )
        n_gaps, n_filled = n_gaps + len(short), n_filled + len(inserted)
        new = pd.DataFrame({time_col: inserted}, index=np.full(len(inserted), FILLED_ROW))
        grown = pd.concat([group.assign(_filled=False), new.assign(_filled=True)]).sort_values(
            time_col, kind="stable"
        )
        for col in grown.columns:
            if col in (time_col, "_filled"):
                continue
            if pd.api.types.is_float_dtype(group[col]):  # measurements
                if method == "interpolate":
                    grown[col] = grown[col].interpolate(method="linear", limit_area="inside")
                else:
                    grown[col] = grown[col].ffill(limit_area="inside")
            else:  # series id, static categories: carried forward, type kept (ints became floats)
                grown[col] = grown[col].ffill().astype(group[col].dtype)
        parts.append(grown)
    table = pd.concat(parts)
    if n_filled:
        log.info(
            "%s: %d gap(s) of at most %d step(s) filled (%s), %d row(s) inserted",
            source,
            n_gaps,
            max_steps,
            method,
            n_filled,
        )
    filled = table.pop("_filled").to_numpy(dtype=bool)
    return table, filled
