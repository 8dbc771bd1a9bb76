"""A trained model as a self-contained folder, and forecasts of the real future from a new table.

Training writes the folder with `save_model_folder` (train.py does it for every run):
- `tsformer.json`: the task class and its hyperparameters (network sizes, window), the data contract
  (time, series, target, known-future and past-only columns, frequency, calendar features, how the
  training file was written: time format, CSV options) and the scalers fitted on the train rows, as
  plain numbers;
- `weights.pt`: the network's weights, a plain state dict loaded with `torch.load(weights_only=True)`.
Nothing in it is pickled Python and nothing refers to Hydra or to `conf/`: `Forecaster.load(folder)`
needs only the installed package.

`Forecaster.predict(table)` takes what a user has at forecast time, in the layout of the training
data: per series the observed history and, after it, rows for the future steps whose target cells are
empty and whose known-future covariates are filled in (e.g. the weather forecast). The forecast origin
of a series is its last row with every target observed (or `origin=` for all series); the model sees
only the `context_len` rows up to the origin and the known covariates of the `horizon` rows after it.
The result has the columns of training's forecasts CSV (`export.COLUMNS`, and `q<level>` for each of
`model.head.levels` with a distribution head); `y_true` holds the file's target values at the
forecast times when there are any (backtesting), else NaN.

Reconstruction models (horizon 0) rebuild the targets of every row from the inputs of its window:
windows tile each gap-free run of rows; the last one is aligned to the run's end.
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from pandas.tseries.frequencies import to_offset

from tsformer.data.calendar import calendar_features
from tsformer.data.datamodule import static_codes
from tsformer.data.forecast_noise import scaler_affine
from tsformer.data.gaps import fill_gaps
from tsformer.data.schema import DataValidationError, SeriesSchema, find_segments, fixed_step, series_ids
from tsformer.export import COLUMNS, with_quantile_columns

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: spread calibration and median-anchored quantile knots (distribution heads)
CONFIG_FILE = "tsformer.json"
WEIGHTS_FILE = "weights.pt"


@dataclass
class Affine:
    """A fitted per-column scaler as numbers: original = scaled * scale + offset."""

    scale: list[float]
    offset: list[float]

    @classmethod
    def of(cls, scaler, n_columns: int) -> Affine:
        scale, offset = scaler_affine(scaler, n_columns)
        return cls(scale=[float(s) for s in scale], offset=[float(o) for o in offset])

    def transform(self, values: np.ndarray) -> np.ndarray:
        return (values - np.asarray(self.offset)) / np.asarray(self.scale)

    def inverse(self, values: np.ndarray) -> np.ndarray:
        return values * np.asarray(self.scale) + np.asarray(self.offset)


@dataclass
class DataContract:
    """What a table must hold for the model, and how its values were scaled in training."""

    time_col: str
    series_col: str | None
    target_cols: list[str]
    known_cols: list[str]
    observed_cols: list[str]
    calendar: list[str]
    freq: str  # pandas offset alias, e.g. "10min"
    context_len: int
    horizon: int
    target_scaler: Affine
    covariate_scaler: Affine | None  # known then observed columns; None when there are none
    static_cols: list[str] = field(default_factory=list)
    static_categorical_cols: list[str] = field(default_factory=list)
    static_scaler: Affine | None = None
    static_vocabularies: dict[str, list[str]] = field(default_factory=dict)  # categories seen in training
    fill: str | None = None  # data.fill: how short gaps are closed (None: a gap is an error here)
    max_fill_steps: int = 0
    time_format: str | None = None  # data.time_format: strftime format of text times (None: inferred)
    csv: dict = field(default_factory=dict)  # data.csv: pandas.read_csv options of the training file

    @classmethod
    def from_dict(cls, d: dict) -> DataContract:
        d = dict(d)
        for key in ("target_scaler", "covariate_scaler", "static_scaler"):
            d[key] = Affine(**d[key]) if d.get(key) else None
        return cls(**d)

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


@dataclass
class ModelInfo:
    """Where the weights came from (for people; prediction does not depend on it)."""

    family: str
    dataset: str
    run_id: str | None = None
    git_commit: str | None = None
    extra: dict = field(default_factory=dict)


def save_model_folder(folder: str | Path, task, datamodule, info: ModelInfo) -> Path:
    """Write `task`'s network and `datamodule`'s contract to `folder` (see the module docstring)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    schema = datamodule.schema
    n_cov = len(schema.known_cols) + len(schema.observed_cols)
    contract = DataContract(
        time_col=schema.time_col,
        series_col=schema.series_col,
        target_cols=list(schema.target_cols),
        known_cols=list(schema.known_cols),
        observed_cols=list(schema.observed_cols),
        calendar=list(datamodule.calendar),
        freq=datamodule.freq.freqstr,
        context_len=datamodule.context_len,
        horizon=datamodule.horizon,
        target_scaler=Affine.of(datamodule.target_scaler, datamodule.d_target),
        covariate_scaler=Affine.of(datamodule.covariate_scaler, n_cov) if n_cov else None,
        static_cols=list(schema.static_cols),
        static_categorical_cols=list(schema.static_categorical_cols),
        static_scaler=Affine.of(datamodule.static_scaler, datamodule.d_static_num) if schema.static_cols else None,
        static_vocabularies=dict(datamodule.static_vocabularies),
        fill=datamodule.fill,
        max_fill_steps=datamodule.max_fill_steps,
        time_format=datamodule.schema.time_format,
        csv=dict(datamodule.csv),
    )
    task_class = type(task)
    config = {
        "format_version": FORMAT_VERSION,
        "task_class": f"{task_class.__module__}.{task_class.__qualname__}",
        "hparams": _plain(dict(task.hparams)),
        "data": asdict(contract),
        "info": asdict(info),
    }
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    state = {k: v.detach().cpu() for k, v in task.state_dict().items()}  # network + static embeddings
    torch.save(state, folder / WEIGHTS_FILE)
    return folder


def _plain(value):
    """Hyperparameters as JSON values (Hydra may hand over tuples; numpy scalars sneak in)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


class Forecaster:
    """A trained network plus its data contract: tables in, forecasts (original units) out."""

    def __init__(self, task, contract: DataContract, info: ModelInfo):
        self.task = task.eval()
        self.contract = contract
        self.info = info

    @classmethod
    def load(cls, folder: str | Path) -> Forecaster:
        folder = Path(folder)
        config_path = folder / CONFIG_FILE
        if not config_path.is_file():
            raise FileNotFoundError(
                f"{folder} is not a tsformer model folder: {CONFIG_FILE} is missing (a training run writes "
                "one to <run output folder>/model and logs it to MLflow)"
            )
        config = json.loads(config_path.read_text())
        version = config.get("format_version")
        head = (config.get("hparams", {}).get("head") or {}).get("kind", "point")
        if version != FORMAT_VERSION and not (version == 1 and head == "point"):
            # format 1 -> 2: distribution heads gained the spread calibration, and the quantile
            # head's knots are anchored at the median; point-head folders of format 1 are unchanged
            raise ValueError(
                f"{config_path}: model format {version!r} with a {head!r} head, this tsformer reads "
                f"format {FORMAT_VERSION} (and format 1 with a point head): train the model again"
            )
        module, _, name = config["task_class"].rpartition(".")
        task_class = getattr(importlib.import_module(module), name)
        task = task_class(**config["hparams"])
        state = torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True)
        task.load_state_dict(state)
        return cls(task, DataContract.from_dict(config["data"]), ModelInfo(**config["info"]))

    # -- prediction -------------------------------------------------------------------------------

    def predict(self, table: pd.DataFrame, origin=None, source: str = "input table",
                time_format: str | None = None) -> pd.DataFrame:
        """Forecasts of every series in `table` (see the module docstring), original units.

        `time_format`: strftime format of the table's text times, by default the training data's."""
        c = self.contract
        clean = self._validate(table, source, time_format or c.time_format)
        origin = None if origin is None else pd.Timestamp(origin)
        windows = []  # (series id, start row, origin row, stop row) positions in `clean`
        for sid, rows in _series_positions(clean, c).items():
            self._check_frequency(clean, sid, rows, source)
            if c.horizon > 0:
                windows.append(self._forecast_window(clean, sid, rows, origin, source))
            else:
                windows.extend(self._reconstruction_windows(clean, sid, rows, source))
        batch, times = self._batch(clean, windows)
        levels = self.task.head.levels
        with torch.inference_mode():
            parts = [self.task.forecast_with_quantiles(_slice(batch, i, i + 256), levels) for i in range(0, len(windows), 256)]
        pred = c.target_scaler.inverse(torch.cat([p for p, _ in parts]).double().numpy())  # (W, T_out, Dy)
        frame = self._frame(clean, windows, times, pred)
        if parts[0][1] is None:  # a point head
            return frame
        q = torch.cat([q for _, q in parts]).double().numpy()  # (W, T_out, Dy, K) scaled
        q = np.moveaxis(c.target_scaler.inverse(np.moveaxis(q, -1, -2)), -2, -1)  # original units (positive scale)
        return with_quantile_columns(frame, q[self._kept(windows, pred.shape[1])], levels)

    def _validate(self, table: pd.DataFrame, source: str, time_format: str | None) -> pd.DataFrame:
        """The table checked as in training (columns without a role are ignored, as there)."""
        c = self.contract
        if c.horizon == 0:  # reconstruction rebuilds what is not measured: the targets may be left out
            stripped = {str(col).strip() for col in table.columns}
            table = table.assign(**{col: np.nan for col in c.target_cols if col.strip() not in stripped})
        schema = replace(c.schema, time_format=time_format)
        # every value cell may be empty here; which ones must be filled depends on the window (below)
        clean = schema.validate(table, source, may_be_empty=set(schema.value_cols))
        if c.fill is not None:  # as in training; targets are filled only between observed values
            clean, filled = fill_gaps(clean, c.time_col, c.series_col, self._step(), c.fill, c.max_fill_steps, source)
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
                source, sid, n_future - c.horizon, c.horizon,
            )
        self._check_regular(clean, sid, rows[start:stop], source)
        self._require_values(clean, sid, rows[start : at + 1], [*c.target_cols, *c.known_cols, *c.observed_cols],
                           source, "history")
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

    def _batch(self, clean, windows) -> tuple[dict, np.ndarray]:
        """The model's batch dict for the windows (scaled like training), and each window's times."""
        c = self.contract
        n, m = c.context_len, c.horizon
        starts = np.array([w[1] for w in windows])
        idx = starts[:, None] + np.arange(n + m)  # (W, N + M) rows of `clean`
        times = clean[c.time_col].to_numpy()[idx]  # (W, N + M)
        target = c.target_scaler.transform(clean[c.target_cols].to_numpy(np.float64))  # (rows, Dy)
        covariates = clean[[*c.known_cols, *c.observed_cols]].to_numpy(np.float64)  # (rows, Dk + Do)
        if c.covariate_scaler is not None:
            covariates = c.covariate_scaler.transform(covariates)
        known, observed = covariates[:, : len(c.known_cols)], covariates[:, len(c.known_cols) :]
        if c.calendar:
            known = np.hstack([known, calendar_features(clean[c.time_col], c.calendar).to_numpy()])
        static_num = clean[c.static_cols].to_numpy(np.float64)  # (rows, S_num)
        if c.static_scaler is not None:
            static_num = c.static_scaler.transform(static_num)
        static_cat = np.zeros((len(clean), len(c.static_categorical_cols)), dtype=np.int64)  # (rows, S_cat)
        for j, col in enumerate(c.static_categorical_cols):
            static_cat[:, j] = static_codes(clean[col].astype(str), c.static_vocabularies[col])
            unseen = sorted(set(clean[col].astype(str)[static_cat[:, j] == 0]))
            if unseen:  # allowed (a new turbine), but the model knows nothing specific about it
                log.warning(
                    "static column '%s': %s not seen in training; they share the 'unseen' embedding", col, unseen
                )

        def part(values: np.ndarray, lo: int, hi: int) -> torch.Tensor:
            return torch.as_tensor(values[idx[:, lo:hi]], dtype=torch.float32)  # (W, hi - lo, D)

        batch = {  # a reconstruction window (m = 0) is all "history"
            "hist_target": part(target, 0, n),
            "hist_known": part(known, 0, n),
            "hist_observed": part(observed, 0, n),
            # the future targets and past-only covariates are unknown: NaN, so any use would show
            "fut_target": torch.full((len(windows), m, len(c.target_cols)), float("nan")),
            "fut_known": part(known, n, n + m),
            "fut_observed": torch.full((len(windows), m, len(c.observed_cols)), float("nan")),
            "static_num": torch.as_tensor(static_num[starts], dtype=torch.float32),  # (W, S_num)
            "static_cat": torch.as_tensor(static_cat[starts], dtype=torch.int64),  # (W, S_cat)
        }
        if m == 0:  # reconstruction reads only the inputs: blank the targets for the same reason
            batch["hist_target"] = torch.full_like(batch["hist_target"], float("nan"))
        return batch, times

    def _kept(self, windows, T: int) -> np.ndarray:
        """`(W, T)` bool: the (window, step) cells written out. Reconstruction's overlapping tail
        windows give each row once, from the window that reached it first."""
        c = self.contract
        keep = np.ones((len(windows), T), dtype=bool)
        if c.horizon == 0:
            target_rows = np.array([w[1] for w in windows])[:, None] + np.arange(T)  # (W, T)
            keep = ~pd.Series(target_rows.ravel()).duplicated().to_numpy().reshape(len(windows), T)
        return keep

    def _frame(self, clean, windows, times: np.ndarray, pred: np.ndarray) -> pd.DataFrame:
        """Rows as in training's CSV: window -> step -> variable."""
        c = self.contract
        n, m = c.context_len, c.horizon
        W, T, Dy = pred.shape
        first = n if m > 0 else 0
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
                "step": t_idx + (1 if m > 0 else 0),
                "variable": np.asarray(c.target_cols, dtype=object)[v_idx],
                "y_true": truth[w_idx, t_idx, v_idx],
                "y_pred": pred[w_idx, t_idx, v_idx],
            },
            columns=COLUMNS,
        )
        return frame


def _series_positions(clean: pd.DataFrame, contract: DataContract) -> dict:
    """Series id -> positions of its rows in `clean` (sorted by time)."""
    ids = series_ids(clean, contract.schema)
    order = pd.Series(np.arange(len(clean))).groupby(ids, sort=False)
    return {sid: positions.to_numpy() for sid, positions in order}


def _slice(batch: dict, lo: int, hi: int) -> dict:
    return {k: v[lo:hi] for k, v in batch.items()}


def example_table(datamodule) -> pd.DataFrame:
    """A prediction input as a user would lay it out, cut from the data module's table: the last
    `context_len + horizon` gap-free rows of the last series, with the future rows' targets and
    past-only covariates emptied (for reconstruction: one window, its targets emptied)."""
    schema = datamodule.schema
    n, m = datamodule.context_len, datamodule.horizon
    columns = schema.columns
    frame = datamodule.frame
    segments = find_segments(frame, schema, fixed_step(datamodule.freq), "example")
    last = segments[segments.stop - segments.start >= n + m].iloc[-1]
    table = frame.iloc[last.stop - n - m : last.stop][columns].reset_index(drop=True)
    if m > 0:
        table.loc[table.index >= n, [*schema.target_cols, *schema.observed_cols]] = np.nan
    else:
        table.loc[:, schema.target_cols] = np.nan
    return table
