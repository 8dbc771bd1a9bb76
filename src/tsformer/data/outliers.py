"""Values far outside a column's robust range in the train rows, reported before the scalers are fitted.

One absurd value (a reading of 1e12 among values near 20) stretches a StandardScaler's sd so far that
every other value scales to almost the same number: the model then learns nothing, and nothing says
why. `check_outliers` profiles every column the scalers see (targets, known, observed and static
numbers) on the train rows and reports, per column, the values beyond the rule below, by row as in
the file.

Rule: a value x of column c is flagged when |x - median(c)| > OUTLIER_SD * robust_sd(c), where
robust_sd is the larger of 1.4826 * MAD (the median absolute deviation from the median) and
IQR / 1.349, both the sd of normal data. Neither moves for a few absurd values, so the scale is that
of the clean rows. The IQR keeps a column that sits at one level most of the time (a temperature at
its control limit, an on/off signal, a set-point) from getting a scale of nearly 0 from its MAD; a
column whose MAD and IQR are both 0 (three quarters of its rows one value) has no spread to measure
against and is not checked. OUTLIER_SD is large on purpose: real measurements have heavy tails
(the gas turbine's CO emission spikes, for one), and the check is for values that cannot be
measurements at all (a sensor's error code, a unit slip, 1e12 among values near 20).

`data.outliers` (the DataModule's `outliers`) says what to do: 'warn' (default) logs one line per
flagged column (count, worst values with their rows); 'error' raises a DataValidationError naming
the first flagged column, before any model or MLflow run is created; 'ignore' skips the check.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tsformer.data.schema import DataValidationError, describe_row

log = logging.getLogger(__name__)

OUTLIER_MODES = ("warn", "error", "ignore")
OUTLIER_SD = 100.0  # robust sd from the median beyond which a value is flagged
N_WORST = 3  # values named per flagged column; the others are counted


@dataclass(frozen=True)
class ColumnOutliers:
    """The values of one column beyond the rule: `rows` (file row numbers) and `values`, worst first."""

    column: str
    median: float
    robust_sd: float
    rows: np.ndarray
    values: np.ndarray

    def describe(self, source: str) -> str:
        worst = zip(self.values[:N_WORST], self.rows[:N_WORST])
        worst = ", ".join(f"{value:.6g} at {describe_row(source, int(row))}" for value, row in worst)
        more = f" and {len(self.rows) - N_WORST} more" if len(self.rows) > N_WORST else ""
        return (
            f"{source}: column '{self.column}' has {len(self.rows)} value(s) in the train rows more than "
            f"{OUTLIER_SD:g} robust sd from its median ({self.median:.6g}, robust sd {self.robust_sd:.3g}): "
            f"{worst}{more}"
        )


def robust_sd(values: np.ndarray) -> float:
    """max(1.4826 * MAD, IQR / 1.349) of `values`; 0 when at least three quarters of them are equal."""
    median = np.median(values)
    q1, q3 = np.percentile(values, [25, 75])
    return float(max(1.4826 * np.median(np.abs(values - median)), (q3 - q1) / 1.349))


def find_outliers(frame: pd.DataFrame, columns: list[str]) -> list[ColumnOutliers]:
    """The flagged values of each column of `frame` (index: file row numbers), columns in order."""
    found = []
    for column in columns:
        values, rows = frame[column].to_numpy(dtype=np.float64), frame.index.to_numpy()
        if len(values) == 0:
            continue
        median, scale = float(np.median(values)), robust_sd(values)
        if scale == 0:
            continue  # three quarters of the rows are one value: no spread to measure against
        distance = np.abs(values - median)
        beyond = np.flatnonzero(distance > OUTLIER_SD * scale)
        if len(beyond):
            worst_first = beyond[np.argsort(-distance[beyond], kind="stable")]
            found.append(ColumnOutliers(column, median, scale, rows[worst_first], values[worst_first]))
    return found


def outlier_mode(mode: str) -> str:
    """`mode` if it is one of OUTLIER_MODES; a ValueError naming the setting otherwise."""
    if mode not in OUTLIER_MODES:
        raise ValueError(f"unknown data.outliers={mode!r}; choose one of {OUTLIER_MODES}")
    return mode


def check_outliers(
    frame: pd.DataFrame, columns: list[str], source: str, mode: str = "warn"
) -> list[ColumnOutliers]:
    """Apply `mode` (see the module docstring) to the outliers of `columns` in `frame`, the train rows."""
    if outlier_mode(mode) == "ignore":
        return []
    found = find_outliers(frame, columns)
    if found and mode == "error":
        others = f" (columns flagged too: {[f.column for f in found[1:]]})" if len(found) > 1 else ""
        raise DataValidationError(
            f"{found[0].describe(source)}{others}; correct or remove these rows, or set data.outliers=warn "
            "if the values are real"
        )
    for column in found:
        log.warning(
            "%s; if they are errors, correct or remove these rows (data.outliers=error stops here)",
            column.describe(source),
        )
    return found
