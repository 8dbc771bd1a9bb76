"""A trained forecasting (or reconstruction, masked fill-in) model, and forecasts of the real future
from a new table.

Training writes its model folder with `save_model_folder` (`tsformer.model_folder`: `tsformer.json`
and `weights.pt`, read and checked in one place). This module says what the folder holds for a window
model: the task class and its hyperparameters (network sizes, window) and the data contract
(`DataContract`: training's feature pipeline, `data/features.py`: column roles, calendar features, the
scalers fitted on the train rows as plain numbers, static vocabularies; `predict` builds its batches
with it, as training did; the series column, frequency, window and how the training file was written:
the time format it was read with, given or inferred, and the CSV options), and checks its values
(`_check_contract`: every list whose length follows from the column roles, the network's sizes
against the data contract, scales above 0, a fixed frequency).

`Forecaster.predict(table)` takes what a user has at forecast time, in the layout of the training
data: per series the observed history and, after it, rows for the future steps whose target cells are
empty and whose known-future covariates are filled in (e.g. the weather forecast). The forecast origin
of a series is its last row with every target observed (or `origin=` for all series); the model sees
only the `context_len` rows up to the origin and the known covariates of the `horizon` rows after it.
The result has the columns of training's forecasts CSV (`export.COLUMNS`, and `q<level>` for each of
`model.head.levels` with a distribution head); `y_true` holds the file's target values at the
forecast times when there are any (backtesting), else NaN.

Reconstruction models (`task.reconstructs`) rebuild the targets of every row from the inputs of its window:
windows tile each gap-free run of rows; the last one is aligned to the run's end.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from pandas.tseries.frequencies import to_offset

from tsformer import model_folder
from tsformer.data.calendar import CALENDAR_FEATURES, calendar_feature_names
from tsformer.data.features import FeaturePipeline
from tsformer.data.gaps import FILL_METHODS, fill_gaps
from tsformer.data.schema import DataValidationError, SeriesSchema, find_segments, fixed_step, series_ids
from tsformer.jobs.forecasting.export import COLUMNS, with_quantile_columns
from tsformer.model_folder import (  # noqa: F401 (CONFIG_FILE, WEIGHTS_FILE: where the folder's files are)
    CONFIG_FILE,
    RESTORE,
    WEIGHTS_FILE,
    FolderKind,
    ModelFolderError,
    ModelInfo,
    Upgrade,
    first_line,
)
from tsformer.tasks.base import WindowTask

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class DataContract(FeaturePipeline):
    """What a table must hold for the model: training's feature pipeline (its fields come first in
    the JSON) and the series column, frequency, window and how the training file was read."""

    series_col: str | None
    freq: str  # pandas offset alias, e.g. "10min"
    context_len: int
    horizon: int
    fill: str | None = None  # data.fill: how short gaps are closed (None: a gap is an error here)
    max_fill_steps: int = 0
    time_format: str | None = None  # strftime format training read text times with (given or inferred)
    csv: dict = field(default_factory=dict)  # data.csv: pandas.read_csv options of the training file

    @classmethod
    def of(cls, datamodule) -> DataContract:
        """The contract of a set-up data module: its fitted pipeline, window and reading options."""
        return cls(
            **datamodule.features.pipeline_fields(),
            series_col=datamodule.schema.series_col,
            freq=datamodule.freq.freqstr,
            context_len=datamodule.context_len,
            horizon=datamodule.horizon,
            fill=datamodule.fill,
            max_fill_steps=datamodule.max_fill_steps,
            time_format=datamodule.time_format_used,
            csv=dict(datamodule.csv),
        )

    @property
    def schema(self) -> SeriesSchema:
        return SeriesSchema(
            time_col=self.time_col,
            target_cols=self.target_cols,
            known_cols=self.known_cols,
            observed_cols=self.observed_cols,
            series_col=self.series_col,
            freq=self.freq,
            static_cols=self.static_cols,
            static_categorical_cols=self.static_categorical_cols,
            time_format=self.time_format,
        )

    @property
    def columns(self) -> list[str]:
        return self.schema.columns


def save_model_folder(folder: str | Path, task, datamodule, info: ModelInfo) -> Path:
    """Write `task`'s network and `datamodule`'s contract to `folder` (see the module docstring)."""
    return model_folder.write(folder, FOLDER, task, DataContract.of(datamodule), info)


# -- reading a model folder, checked (`model_folder.read`) ---------------------------------------


def _check_contract(c: DataContract, hparams: dict, path: Path) -> None:
    """Every count that follows from the column roles (the scalers' numbers, the static vocabularies, the
    network's input sizes and window), and the values that `predict` relies on (scales above 0, known
    calendar features, a fixed frequency, a fill method); the first problem found is refused."""
    problems = itertools.chain(
        _role_problems(c), _scaler_problems(c), _value_problems(c), _network_problems(c, hparams)
    )
    problem = next(problems, None)
    if problem is not None:
        raise ModelFolderError(f"{path}: {problem}: {RESTORE}")


def _role_problems(c: DataContract):
    series = [c.series_col] if c.series_col else []
    roles = [c.time_col, *series, *c.target_cols, *c.known_cols, *c.observed_cols, *c.static_cols,
             *c.static_categorical_cols]  # fmt: skip
    if not c.target_cols:
        yield "data.target_cols is empty"
    twice = sorted({col for col in roles if roles.count(col) > 1} - {c.series_col})  # the id may be a static
    if twice:
        yield f"column(s) {twice} named in more than one role of data"


def _scaler_problems(c: DataContract):
    for name, affine, columns in [
        ("data.target_scaler", c.target_scaler, c.target_cols),
        ("data.covariate_scaler", c.covariate_scaler, [*c.known_cols, *c.observed_cols]),
        ("data.static_scaler", c.static_scaler, c.static_cols),
    ]:
        if affine is None:
            if columns:
                yield f"{name} is null, but the columns {columns} need one"
            continue
        for part, numbers in (("scale", affine.scale), ("offset", affine.offset)):
            if len(numbers) != len(columns):
                yield f"{name}.{part} has {len(numbers)} number(s), one per column of {columns} expected"
            if not all(math.isfinite(v) for v in numbers):
                yield f"{name}.{part} is {numbers}, expected finite numbers"
            if part == "scale" and min(numbers, default=1) <= 0:  # the quantiles' order needs scales above 0
                yield f"{name}.scale is {numbers}, expected numbers above 0"


def _value_problems(c: DataContract):
    if set(c.static_vocabularies) != set(c.static_categorical_cols):
        yield (
            f"data.static_vocabularies has categories for {sorted(c.static_vocabularies)}, expected for the "
            f"static categorical columns {c.static_categorical_cols}"
        )
    unknown_features = [f for f in c.calendar if f not in CALENDAR_FEATURES]
    if unknown_features:
        yield f"data.calendar has unknown feature(s) {unknown_features}; known: {list(CALENDAR_FEATURES)}"
    try:
        fixed_step(to_offset(c.freq))
    except (ValueError, TypeError) as err:  # DataValidationError is a ValueError
        yield f"data.freq {c.freq!r} is not a fixed pandas frequency ({first_line(err)})"
    if c.fill not in (None, *FILL_METHODS) or (c.fill is not None and c.max_fill_steps < 1):
        yield (
            f"data.fill {c.fill!r} with max_fill_steps {c.max_fill_steps}, expected one of {FILL_METHODS} "
            "with max_fill_steps >= 1, or null"
        )


def _network_problems(c: DataContract, hparams: dict):
    # the network reads the contract's columns: its sizes must be theirs (its target_names only name
    # its metrics; the forecasts are named by data.target_cols)
    expected = {
        "d_target": len(c.target_cols),
        "d_known": len(c.known_cols) + len(calendar_feature_names(c.calendar)),
        "d_observed": len(c.observed_cols),
        "d_static_num": len(c.static_cols),
        "static_vocab_sizes": [len(c.static_vocabularies[col]) + 1 for col in c.static_categorical_cols],
        "context_len": c.context_len,
        "horizon": c.horizon,
    }
    for key, value in expected.items():
        found = hparams.get(key)
        if found != value and not (key == "static_vocab_sizes" and found is None and not value):
            yield f"hparams.{key} is {found!r}, but data makes it {value!r}"


class Forecaster:
    """A trained network plus its data contract: tables in, forecasts (original units) out."""

    def __init__(self, task, contract: DataContract, info: ModelInfo):
        self.task = task.eval()
        self.contract = contract
        self.info = info

    @classmethod
    def load(cls, folder: str | Path) -> Forecaster:
        """The model in `folder`, checked (`model_folder.read`)."""
        task, contract, info = model_folder.read(folder, FOLDER)
        task.set_target_scaling(contract.target_scaler)
        return cls(task, contract, info)

    # -- prediction -------------------------------------------------------------------------------

    def predict(
        self, table: pd.DataFrame, origin=None, source: str = "input table", time_format: str | None = None
    ) -> pd.DataFrame:
        """Forecasts of every series in `table` (see the module docstring), original units.

        `time_format`: strftime format of the table's text times, by default the training data's."""
        c = self.contract
        clean = self._validate(table, source, time_format or c.time_format)
        origin = None if origin is None else pd.Timestamp(origin)
        windows = []  # (series id, start row, origin row, stop row) positions in `clean`
        for sid, rows in series_positions(clean, c).items():
            self._check_frequency(clean, sid, rows, source)
            if self.task.reconstructs:
                windows.extend(self._reconstruction_windows(clean, sid, rows, source))
            else:
                windows.append(self._forecast_window(clean, sid, rows, origin, source))
        batch, times = self.batch(clean, windows)
        levels = self.task.head.levels
        with torch.inference_mode():
            parts = [
                self.task.forecast_with_quantiles(_slice(batch, i, i + 256), levels)
                for i in range(0, len(windows), 256)
            ]
        pred = c.inverse_target(torch.cat([p for p, _ in parts]).double().numpy())  # (W, T_out, Dy)
        frame = self._frame(clean, windows, times, pred)
        if parts[0][1] is None:  # a point head
            return frame
        q = torch.cat([q for _, q in parts]).double().numpy()  # (W, T_out, Dy, K) scaled
        q = np.moveaxis(c.inverse_target(np.moveaxis(q, -1, -2)), -2, -1)  # original units (positive scale)
        return with_quantile_columns(frame, q[self._kept(windows, pred.shape[1])], levels)

    def _validate(self, table: pd.DataFrame, source: str, time_format: str | None) -> pd.DataFrame:
        """The table checked as in training (columns without a role are ignored, as there)."""
        c = self.contract
        if (
            self.task.reconstructs
        ):  # reconstruction rebuilds what is not measured: the targets may be left out
            stripped = {str(col).strip() for col in table.columns}
            table = table.assign(**{col: np.nan for col in c.target_cols if col.strip() not in stripped})
        schema = replace(c.schema, time_format=time_format)
        # every value cell may be empty here; which ones must be filled depends on the window (below)
        clean = schema.validate(table, source, may_be_empty=set(schema.value_cols))
        if c.fill is not None:  # as in training; targets are filled only between observed values
            clean, filled = fill_gaps(
                clean, c.time_col, c.series_col, self._step(), c.fill, c.max_fill_steps, source
            )
            clean = clean.assign(_filled=filled)
        else:
            clean = clean.assign(_filled=False)
        return clean.reset_index(names="file_row")

    def _step(self) -> pd.Timedelta:
        return fixed_step(to_offset(self.contract.freq))

    def _forecast_window(self, clean, sid, rows: np.ndarray, origin, source) -> tuple:
        """(sid, first history row, origin row, last future row + 1) for one series, checked."""
        c = self.contract
        times = clean[c.time_col].to_numpy()[rows]
        observed = ~clean[c.target_cols].iloc[rows].isna().any(axis=1).to_numpy()
        if origin is not None:
            candidates = np.flatnonzero(times <= origin.to_datetime64())
            if not candidates.size:
                raise DataValidationError(f"{source}: series {sid!r} has no row at or before origin {origin}")
            at = candidates[-1]
        else:
            filled = np.flatnonzero(observed)
            if not filled.size:
                raise DataValidationError(
                    f"{source}: series {sid!r} has no row with every target {c.target_cols} observed, so there "
                    "is no history to forecast from"
                )
            at = filled[-1]
        if at + 1 < c.context_len:
            raise DataValidationError(
                f"{source}: too little history in series {sid!r}: {at + 1} row(s) up to the forecast origin "
                f"{pd.Timestamp(times[at])}, the model needs context_len={c.context_len}"
            )
        start, stop = at + 1 - c.context_len, at + 1 + c.horizon
        n_future = len(rows) - (at + 1)
        if n_future < c.horizon:
            last = pd.Timestamp(times[at]) + c.horizon * self._step()
            raise DataValidationError(
                f"{source}: series {sid!r} has {n_future} row(s) after the forecast origin "
                f"{pd.Timestamp(times[at])}, the model forecasts horizon={c.horizon} steps: add rows up to "
                f"{last} with the known-future covariates {c.known_cols} filled in"
            )
        if n_future > c.horizon:
            log.info(
                "%s: series %r: %d row(s) after the first %d future steps are not used (the model's horizon)",
                source,
                sid,
                n_future - c.horizon,
                c.horizon,
            )
        self._check_regular(clean, sid, rows[start:stop], source)
        self._require_values(
            clean,
            sid,
            rows[start : at + 1],
            [*c.target_cols, *c.known_cols, *c.observed_cols],
            source,
            "history",
        )
        self._require_values(clean, sid, rows[at + 1 : stop], c.known_cols, source, "future")
        return sid, rows[start], rows[at], rows[stop - 1] + 1

    def _reconstruction_windows(self, clean, sid, rows: np.ndarray, source) -> list[tuple]:
        """Windows tiling each gap-free run of the series (the last one aligned to the run's end)."""
        c = self.contract
        n = c.context_len
        self._require_values(clean, sid, rows, [*c.known_cols, *c.observed_cols], source, "input")
        times = clean[c.time_col].to_numpy()[rows]
        breaks = np.flatnonzero(np.diff(times) != self._step().to_timedelta64()) + 1
        windows = []
        for run in np.split(np.arange(len(rows)), breaks):
            if len(run) < n:
                raise DataValidationError(
                    f"{source}: series {sid!r} has a gap-free run of {len(run)} row(s) from "
                    f"{pd.Timestamp(times[run[0]])}, shorter than the model's window context_len={n}"
                )
            starts = list(range(0, len(run) - n + 1, n))
            if starts[-1] + n < len(run):
                starts.append(len(run) - n)
            windows.extend((sid, rows[run[s]], rows[run[s]], rows[run[s]] + n) for s in starts)
        return windows

    def _check_frequency(self, clean, sid, rows: np.ndarray, source) -> None:
        """The series' most common step must be the model's (a gap here and there is checked later)."""
        steps = np.diff(clean[self.contract.time_col].to_numpy()[rows])
        if not steps.size:
            return
        values, counts = np.unique(steps, return_counts=True)
        common = pd.Timedelta(values[np.argmax(counts)])
        if common != self._step():
            first = pd.Timestamp(clean[self.contract.time_col].iloc[rows[0]])
            raise DataValidationError(
                f"{source}: series {sid!r} (from time {first}) has rows {common} apart, but the model was "
                f"trained on steps of {self._step()} (freq {self.contract.freq!r}): resample the data"
            )

    def _check_regular(self, clean, sid, rows: np.ndarray, source) -> None:
        step = self._step().to_timedelta64()
        times = clean[self.contract.time_col].to_numpy()[rows]
        wrong = np.flatnonzero(np.diff(times) != step)
        if wrong.size:
            i = wrong[0]
            raise DataValidationError(
                f"{source}: series {sid!r}: {pd.Timestamp(times[i + 1]) - pd.Timestamp(times[i])} from "
                f"{pd.Timestamp(times[i])} to {pd.Timestamp(times[i + 1])}, inside the rows the forecast needs; "
                f"the model was trained on steps of {self._step()} (freq {self.contract.freq!r}): resample the "
                "data, or fill the gap"
            )

    def _require_values(self, clean, sid, rows: np.ndarray, columns: list[str], source, what: str) -> None:
        part = clean.iloc[rows]
        for col in columns:
            empty = np.flatnonzero(part[col].isna().to_numpy())
            if empty.size:
                row = part.iloc[empty[0]]
                raise DataValidationError(
                    f"{source}: empty cell in column '{col}', series {sid!r}, time "
                    f"{pd.Timestamp(row[self.contract.time_col])} (row {int(row['file_row'])}): the model needs "
                    f"it as {what} ({empty.size} empty cell(s) of '{col}' there)"
                )

    def batch(self, clean, windows) -> tuple[dict, np.ndarray]:
        """The model's batch dict for the windows (scaled like training), and each window's times."""
        c = self.contract
        n, m = c.context_len, c.horizon
        starts = np.array([w[1] for w in windows])
        idx = starts[:, None] + np.arange(n + m)  # (W, N + M) rows of `clean`
        times = clean[c.time_col].to_numpy()[idx]  # (W, N + M)
        rows = c.transform(clean)  # every row's numbers, as training computed them
        for col, unseen in c.unseen_categories(clean).items():
            # allowed (a new turbine), but the model knows nothing specific about it
            log.warning(
                "static column '%s': %s not seen in training; they share the 'unseen' embedding", col, unseen
            )

        def part(values: np.ndarray, lo: int, hi: int) -> torch.Tensor:
            return torch.as_tensor(values[idx[:, lo:hi]], dtype=torch.float32)  # (W, hi - lo, D)

        batch = {  # a reconstruction window (no horizon: m = 0) is all "history"
            "hist_target": part(rows.target, 0, n),
            "hist_known": part(rows.known, 0, n),
            "hist_observed": part(rows.observed, 0, n),
            # the future targets and past-only covariates are unknown: NaN, so any use would show
            "fut_target": torch.full((len(windows), m, len(c.target_cols)), float("nan")),
            "fut_known": part(rows.known, n, n + m),
            "fut_observed": torch.full((len(windows), m, len(c.observed_cols)), float("nan")),
            "static_num": torch.as_tensor(rows.static_num[starts]),  # (W, S_num)
            "static_cat": torch.as_tensor(rows.static_cat[starts]),  # (W, S_cat)
        }
        if self.task.reconstructs:  # it reads only the inputs: blank the targets for the same reason
            batch["hist_target"] = torch.full_like(batch["hist_target"], float("nan"))
        return batch, times

    def _kept(self, windows, T: int) -> np.ndarray:
        """`(W, T)` bool: the (window, step) cells written out. Reconstruction's overlapping tail
        windows give each row once, from the window that reached it first."""
        keep = np.ones((len(windows), T), dtype=bool)
        if self.task.reconstructs:
            target_rows = np.array([w[1] for w in windows])[:, None] + np.arange(T)  # (W, T)
            keep = ~pd.Series(target_rows.ravel()).duplicated().to_numpy().reshape(len(windows), T)
        return keep

    def _frame(self, clean, windows, times: np.ndarray, pred: np.ndarray) -> pd.DataFrame:
        """Rows as in training's CSV: window -> step -> variable."""
        c = self.contract
        W, T, Dy = pred.shape
        first = 0 if self.task.reconstructs else c.context_len  # the first target row of a window
        target_rows = np.array([w[1] for w in windows])[:, None] + first + np.arange(T)  # (W, T)
        truth = clean[c.target_cols].to_numpy(np.float64)[target_rows]  # (W, T, Dy), NaN where empty
        truth[clean["_filled"].to_numpy()[target_rows]] = np.nan  # filled in for a gap: not a measurement
        keep = self._kept(windows, T)
        origin_pos = np.array([w[2] for w in windows])
        sids = np.array([w[0] for w in windows])
        w_idx, t_idx, v_idx = np.meshgrid(np.arange(W), np.arange(T), np.arange(Dy), indexing="ij")
        sel = keep[w_idx, t_idx].ravel()
        w_idx, t_idx, v_idx = w_idx.ravel()[sel], t_idx.ravel()[sel], v_idx.ravel()[sel]
        frame = pd.DataFrame(
            {
                "series_id": sids[w_idx],
                "origin_time": clean[c.time_col].to_numpy()[origin_pos][w_idx],
                "target_time": times[:, first:][w_idx, t_idx],
                "step": t_idx + (0 if self.task.reconstructs else 1),
                "variable": np.asarray(c.target_cols, dtype=object)[v_idx],
                "y_true": truth[w_idx, t_idx, v_idx],
                "y_pred": pred[w_idx, t_idx, v_idx],
            },
            columns=COLUMNS,
        )
        return frame


FOLDER = FolderKind(
    name="forecaster",
    version=3,  # 3: the header `format`; 2: spread calibration and median-anchored quantile knots
    describes="forecasting model",
    contract=DataContract,
    tasks=(WindowTask,),
    load=Forecaster.load,
    check_contract=_check_contract,
    upgrades={2: Upgrade()},  # 2 (`format_version: 2`) holds what 3 holds
)


def series_positions(clean: pd.DataFrame, contract: DataContract) -> dict:
    """Series id -> positions of its rows in `clean` (sorted by time)."""
    ids = series_ids(clean, contract.schema)
    order = pd.Series(np.arange(len(clean))).groupby(ids, sort=False)
    return {sid: positions.to_numpy() for sid, positions in order}


def _slice(batch: dict, lo: int, hi: int) -> dict:
    return {k: v[lo:hi] for k, v in batch.items()}


def example_rows(datamodule) -> pd.DataFrame:
    """The last `context_len + horizon` gap-free rows of the data module's last series, in the layout
    of its table (its columns with a role)."""
    schema = datamodule.schema
    n, m = datamodule.context_len, datamodule.horizon
    frame = datamodule.frame
    segments = find_segments(frame, schema, fixed_step(datamodule.freq), "example")
    last = segments[segments.stop - segments.start >= n + m].iloc[-1]
    return frame.iloc[last.stop - n - m : last.stop][schema.columns].reset_index(drop=True)


def example_table(datamodule, reconstructs: bool) -> pd.DataFrame:
    """A prediction input as a user would lay it out, cut from the data module's table (`example_rows`),
    with the future rows' targets and past-only covariates emptied (a reconstruction model's,
    `reconstructs`: one window, its targets emptied)."""
    schema, n = datamodule.schema, datamodule.context_len
    table = example_rows(datamodule)
    if reconstructs:
        table.loc[:, schema.target_cols] = np.nan
    else:
        table.loc[table.index >= n, [*schema.target_cols, *schema.observed_cols]] = np.nan
    return table
