"""Masked fill-in (model=enc_only_masked): training writes forecasting's files (`jobs/forecasting.py`);
predict.py fills the empty cells of a table with the model: `predict.py MODEL table.csv --impute`.

The model (`tasks/masked.py`, trained with `model=enc_only_masked`) restores the values of its columns
(`data.target_cols` of its training) in windows of `context_len` rows. Per series, the rows are cut
into gap-free runs (consecutive times one frequency step apart, every known and observed input of
the model present); each run is tiled with windows of `context_len` rows (the last one aligned to the
run's end), and an empty cell is filled from the one window that holds it (the first tile that
reaches it). Windows are independent: what a window holds never changes a fill outside it.

Output: the input table, same rows, same columns, same order, with the model's empty cells filled
(original units), its times read as times (predict.py writes them back in the training file's time
format, with its separator, decimal mark and encoding) and one flag column `<col>_imputed` per model column (True where this command
filled the cell). Observed cells are never touched. A cell cannot be filled when its run is shorter
than the window, or its window holds no observed value of the model's columns: it stays empty and its
row is named (`Imputation.unfilled_rows`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from tsformer.data.schema import DataValidationError, describe_row, fixed_step
from tsformer.jobs.base import TIME_FORMAT, Param, Prediction, RunOutputs, predict_usage
from tsformer.jobs.forecasting import job as forecasting
from tsformer.jobs.forecasting.forecaster import Forecaster, example_rows, series_positions
from tsformer.tasks.masked import MaskedFillIn

log = logging.getLogger(__name__)

FLAG_SUFFIX = "_imputed"


@dataclass
class Imputation:
    table: pd.DataFrame  # the input table with the filled cells and the flag columns
    n_filled: int  # cells filled
    unfilled_rows: list[int]  # file rows holding an empty model cell that could not be filled
    reasons: dict[int, str]  # file row -> why it could not be filled

    def unfilled_line(self, source: str, shown: int = 10) -> str:
        """One line naming the rows that could not be filled ('' when there are none)."""
        if not self.unfilled_rows:
            return ""
        rows = self.unfilled_rows
        named = ", ".join(f"{describe_row(source, r)}: {self.reasons[r]}" for r in rows[:shown])
        more = f", and {len(rows) - shown} more" if len(rows) > shown else ""
        return f"{source}: {len(rows)} row(s) with empty cells not filled (too little context): {named}{more}"


def fill_windows(run_length: int, window: int) -> np.ndarray:
    """Start positions of the windows tiling a run of `run_length` rows (the last one aligned to its
    end); `(K,)`, empty when the run is shorter than a window."""
    if run_length < window:
        return np.zeros(0, dtype=np.int64)
    starts = list(range(0, run_length - window + 1, window))
    if starts[-1] + window < run_length:
        starts.append(run_length - window)
    return np.asarray(starts, dtype=np.int64)


def window_of(position: np.ndarray, run_length: int, window: int) -> np.ndarray:
    """The start of the window that fills each position of a run (`fill_windows`'s first to reach it)."""
    start = (position // window) * window
    return np.where(start + window <= run_length, start, run_length - window)


def impute(forecaster: Forecaster, table: pd.DataFrame, source: str = "input table", time_format=None):
    """The `Imputation` of `table` by a masked fill-in model (see the module docstring)."""
    task, c = forecaster.task, forecaster.contract
    if not isinstance(task, MaskedFillIn):  # a user's choice of model: a ValueError, as predict.py reports
        raise ValueError(  # noqa: TRY004
            f"the model is a {type(task).__name__} ({forecaster.info.family}), not a masked fill-in model: "
            "--impute needs one trained with model=enc_only_masked (docs/imputation.md)"
        )
    originals = _original_names(table, c.target_cols)
    flags = [f"{originals[col]}{FLAG_SUFFIX}" for col in c.target_cols]
    taken = sorted(set(flags).intersection(table.columns))
    if taken:
        raise DataValidationError(
            f"{source}: column '{taken[0]}' exists already: rename it, --impute writes it"
        )
    schema = replace(c.schema, time_format=time_format or c.time_format)
    clean = schema.validate(table, source, may_be_empty=set(schema.value_cols)).reset_index(names="file_row")
    clean["_filled"] = False
    values = clean[c.target_cols].to_numpy(np.float64)  # (rows, Dy)
    empty = np.isnan(values)
    filler, reasons = _filling_windows(clean, c)
    needs = empty.any(axis=1)
    filled = np.zeros_like(empty)
    out_values = values.copy()
    starts = np.unique(filler[needs & (filler >= 0)])  # the windows that fill something
    if len(starts):
        pred, observed_any = _restore(forecaster, clean, values, starts)  # (W, N, Dy) original units, (W,)
        position = {int(s): k for k, s in enumerate(starts)}
        for row in np.flatnonzero(needs & (filler >= 0)):
            k = position[int(filler[row])]
            if not observed_any[k]:
                reasons[row] = (
                    f"its window of {c.context_len} rows holds no observed value of {c.target_cols}"
                )
                continue
            cells = empty[row]
            out_values[row, cells] = pred[k, row - starts[k], cells]
            filled[row, cells] = True
    file_rows = clean["file_row"].to_numpy()
    result = _with_fills(table, [originals[col] for col in c.target_cols], file_rows, filled, out_values)
    times = np.empty(len(table), dtype="datetime64[ns]")
    times[file_rows] = clean[c.time_col].to_numpy()
    result[_original_names(table, [c.time_col])[c.time_col]] = times  # read, as the other jobs' answers
    unfilled = sorted(int(file_rows[r]) for r in np.flatnonzero(needs) if not filled[r][empty[r]].all())
    by_file_row = {int(file_rows[r]): why for r, why in reasons.items()}
    return Imputation(result, int(filled.sum()), unfilled, {r: by_file_row[r] for r in unfilled})


def _filling_windows(clean: pd.DataFrame, c) -> tuple[np.ndarray, dict[int, str]]:
    """Per row (position in `clean`), the start row of the window that fills it (-1: none), and why a
    row has none: an empty input, or a gap-free run shorter than the window."""
    n = c.context_len
    step = fixed_step(pd.tseries.frequencies.to_offset(c.freq)).to_timedelta64()
    inputs_complete = ~clean[[*c.known_cols, *c.observed_cols]].isna().any(axis=1).to_numpy()
    times = clean[c.time_col].to_numpy()
    filler = np.full(len(clean), -1, dtype=np.int64)
    reasons: dict[int, str] = {}
    for rows in series_positions(clean, c).values():
        usable = rows[inputs_complete[rows]]
        for row in rows[~inputs_complete[rows]]:
            reasons[row] = "an input column of the model is empty"
        breaks = np.flatnonzero(np.diff(times[usable]) != step) + 1
        for run in np.split(usable, breaks):
            if len(run) < n:
                for row in run:
                    reasons[row] = f"its gap-free run has {len(run)} row(s), the model's window {n}"
                continue
            starts = window_of(np.arange(len(run)), len(run), n)  # (L,) run position of each row's window
            filler[run] = run[starts]
    return filler, reasons


def _restore(forecaster: Forecaster, clean: pd.DataFrame, values: np.ndarray, starts: np.ndarray):
    """The model's values `(W, N, Dy)` (original units) of the windows starting at rows `starts`, their
    empty cells hidden, and whether each window holds an observed value at all `(W,)`."""
    c, n = forecaster.contract, forecaster.contract.context_len
    batch, _ = forecaster.batch(clean, [(None, s, s, s + n) for s in starts])
    idx = starts[:, None] + np.arange(n)  # (W, N) rows of `clean`
    scaled = c.target_scaler.transform(values)  # (rows, Dy), NaN where empty
    batch["hist_target"] = torch.as_tensor(scaled[idx], dtype=torch.float32)  # (W, N, Dy)
    observed_any = ~np.isnan(scaled[idx]).all(axis=(1, 2))  # (W,)
    with torch.inference_mode():
        parts = [forecaster.task.forecast(_slice(batch, i, i + 256)) for i in range(0, len(starts), 256)]
    return c.target_scaler.inverse(torch.cat(parts).double().numpy()), observed_any


def _with_fills(table, names, file_rows, filled, out_values) -> pd.DataFrame:
    """`table` with the `filled` cells `(rows, Dy)` of the columns `names` set, and their flag columns."""
    result = table.copy()
    for j, name in enumerate(names):
        at = file_rows[filled[:, j]]
        column = result[name].astype(np.float64) if filled[:, j].any() else result[name]
        column.iloc[at] = out_values[filled[:, j], j]
        result[name] = column
        flag = np.zeros(len(result), dtype=bool)
        flag[at] = True
        result[f"{name}{FLAG_SUFFIX}"] = flag
    return result


def _original_names(table: pd.DataFrame, columns: list[str]) -> dict[str, str]:
    """Each model column's name as the table writes it (the schema matches names without surrounding
    spaces)."""
    names = {}
    for col in columns:
        names[col] = next((c for c in table.columns if str(c).strip() == col.strip()), col)
    return names


def _slice(batch: dict, lo: int, hi: int) -> dict:
    return {k: v[lo:hi] for k, v in batch.items()}


def write_outputs(cfg, task, datamodule, run_id: str | None) -> RunOutputs:
    """Forecasting's files; the example table (the pyfunc model's signature) is a window of the data
    with every third cell of the model's columns emptied: what a fill-in model fills."""
    outputs = forecasting.write_outputs(cfg, task, datamodule, run_id)
    example = example_rows(datamodule)
    targets = datamodule.schema.target_cols
    example[targets] = example[targets].mask(np.arange(len(example))[:, None] % 3 == np.arange(len(targets)))
    outputs.example = example
    outputs.details["new_data"] = None  # a simulated table has no gaps to fill
    return outputs


IMPUTE = Param(
    "impute",
    "fill the empty cells of the model's columns (a masked fill-in model, model=enc_only_masked): the "
    "table with them filled and a flag column <col>_imputed each (docs/imputation.md)",
    kind=bool,
    required=True,  # a fill-in model does not pretend to forecast: the user asks for a filled table
)


def answer(model: Forecaster, table: pd.DataFrame, params: dict, source: str) -> pd.DataFrame:
    """The table with the model's empty cells filled and flagged, its times read; the rows that could
    not be filled are named in a warning."""
    result = impute(model, table, source=source, time_format=params["time_format"])
    line = result.unfilled_line(source)
    if line:
        log.warning(line)
    return result.table


def report(model: Forecaster, filled: pd.DataFrame, written: list[Path]) -> str:
    n_filled = int(filled.iloc[:, -len(model.contract.target_cols) :].to_numpy().sum())  # the flag columns
    return f"filled {n_filled} empty cell(s) of {model.contract.target_cols}: {written[0]}"


JOB = replace(
    forecasting.JOB,
    name="imputation",
    tasks=(MaskedFillIn,),
    write_outputs=write_outputs,
    prediction=Prediction(answer, report, params=(IMPUTE, TIME_FORMAT), written_as_read=True),
    usage=predict_usage("fill in missing values", "--impute", "--output", "filled.csv"),
)
