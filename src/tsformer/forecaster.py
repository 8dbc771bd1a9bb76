"""A trained model as a self-contained folder, and forecasts of the real future from a new table.

Training writes the folder with `save_model_folder` (train.py does it for every run):
- `tsformer.json`: the task class and its hyperparameters (network sizes, window), the data contract:
  training's feature pipeline (`data/features.py`: column roles, calendar features, the scalers
  fitted on the train rows as plain numbers, static vocabularies; `predict` builds its batches with
  it, as training did), the series column, frequency, window and how the training file was written
  (time format, CSV options);
- `weights.pt`: the network's weights, a plain state dict loaded with `torch.load(weights_only=True)`.
Nothing in it is pickled Python and nothing refers to Hydra or to `conf/`: `Forecaster.load(folder)`
needs only the installed package. It checks the folder before using it: every key and type of
`tsformer.json` (`ModelConfig`), every list whose length follows from the column roles (scaler
numbers, static vocabularies) and the network's sizes against the data contract, and every weight's
name and shape against the network; a damaged folder is refused with one line naming the file
(`ModelFolderError`).

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

import dataclasses
import importlib
import inspect
import itertools
import json
import logging
import math
import types
import typing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from pandas.tseries.frequencies import to_offset

from tsformer.data.calendar import CALENDAR_FEATURES, calendar_feature_names
from tsformer.data.features import FeaturePipeline
from tsformer.data.gaps import FILL_METHODS, fill_gaps
from tsformer.data.schema import DataValidationError, SeriesSchema, find_segments, fixed_step, series_ids
from tsformer.export import COLUMNS, _write_atomically, with_quantile_columns
from tsformer.tasks.base import WindowTask
from tsformer.tasks.optimisation import task_settings

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: spread calibration and median-anchored quantile knots (distribution heads)
CONFIG_FILE = "tsformer.json"
WEIGHTS_FILE = "weights.pt"


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
    time_format: str | None = None  # data.time_format: strftime format of text times (None: inferred)
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
            time_format=datamodule.schema.time_format,
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


@dataclass
class ModelInfo:
    """Where the weights came from (for people; prediction does not depend on it)."""

    family: str
    dataset: str
    run_id: str | None = None
    git_commit: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class ModelConfig:
    """`tsformer.json`: every key of it and of its parts is written, and required when read."""

    format_version: int
    task_class: str  # module.qualname of a tsformer task (a WindowTask subclass)
    hparams: dict  # the task's constructor arguments
    data: DataContract
    info: ModelInfo


def save_model_folder(folder: str | Path, task, datamodule, info: ModelInfo) -> Path:
    """Write `task`'s network and `datamodule`'s contract to `folder` (see the module docstring)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    contract = DataContract.of(datamodule)
    task_class = type(task)
    config = ModelConfig(
        format_version=FORMAT_VERSION,
        task_class=f"{task_class.__module__}.{task_class.__qualname__}",
        hparams=_plain(dict(task.hparams)),
        data=contract,
        info=info,
    )
    # atomically: a run stopped while writing leaves no half-written file behind
    _write_atomically(folder / CONFIG_FILE, lambda tmp: tmp.write_text(json.dumps(asdict(config), indent=2)))
    state = {k: v.detach().cpu() for k, v in task.state_dict().items()}  # network + static embeddings
    _write_atomically(folder / WEIGHTS_FILE, lambda tmp: torch.save(state, tmp))
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


# -- reading a model folder, checked ----------------------------------------------------------------

RESTORE = (
    "copy the folder again from the training run (its output folder's model/, or model/artifacts/model "
    "in its MLflow run) or train again"
)


class ModelFolderError(ValueError):
    """A model folder that cannot be used as it is; the message names the file and what is wrong."""


def _read_config(path: Path) -> dict:
    """`tsformer.json` parsed and checked against `ModelConfig` (keys, types) and the format version."""
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelFolderError(f"{path}: not readable as JSON ({err}): {RESTORE}") from err
    version = config.get("format_version") if isinstance(config, dict) else None
    if isinstance(version, int) and version != FORMAT_VERSION:  # before the keys: another format's
        raise ModelFolderError(
            f"{path}: model format {version}, this tsformer reads format {FORMAT_VERSION}: train the model "
            "again, or load it with the tsformer that wrote it"
        )
    _check_json(config, ModelConfig, "", path)
    return config


def _check_json(value, hint, where: str, path: Path) -> None:
    """Raise `ModelFolderError` unless the JSON `value` (at key `where` of the file `path`) is a `hint`:
    int, float, str, bool, dict, list[...], dict[str, ...], a union of those with None, or a
    dataclass (a JSON object with its fields as keys)."""
    if not _fits(value, hint, where, path):
        raise ModelFolderError(
            f"{path}: {where or 'the file'} is {_json_kind(value)}, expected {_hint_name(hint)}: {RESTORE}"
        )


def _fits(value, hint, where: str, path: Path) -> bool:
    """Whether `value` itself is a `hint`; what it holds (fields, items) is checked on the way, and a
    wrong part refused with its own key."""
    kind = typing.get_origin(hint) or hint
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict) and _fields_fit(value, hint, where, path)
    if kind in (types.UnionType, typing.Union):
        return any(_fits_quietly(value, option, where, path) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is typing.Any:
        return True
    if hint in (int, float):  # JSON has no int/float distinction for whole floats; bool is no number
        return isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
    if kind in (str, bool, list, dict):
        return isinstance(value, kind) and _items_fit(value, typing.get_args(hint), where, path)
    return False


def _fits_quietly(value, option, where: str, path: Path) -> bool:
    """One option of a union: whether `value`, with all it holds, is one."""
    try:
        _check_json(value, option, where, path)
    except ModelFolderError:
        return False
    return True


def _fields_fit(value: dict, hint, where: str, path: Path) -> bool:
    """The JSON object `value` as the dataclass `hint`: its fields' keys, every one (the writer writes
    them all), and values (refused if not)."""
    required = {f.name for f in dataclasses.fields(hint)}
    _check_keys(value, typing.get_type_hints(hint), required, where, path)
    return True


def _items_fit(value, args: tuple, where: str, path: Path) -> bool:
    """The items of a list (`args`: its item type) or the values of a dict (`args`: key and value
    types) checked; a str or bool, or a list or dict without `args`, holds nothing to check."""
    if args and isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, args[0], f"{where}[{i}]", path)
    elif args and isinstance(value, dict):
        for key, item in value.items():
            _check_json(item, args[1], f"{where}.{key}", path)
    return True


def _check_keys(value: dict, hints: dict, required: set[str], where: str, path: Path) -> None:
    """The JSON object `value` has every key of `required`, no key outside `hints`, and each value fits
    its hint."""
    inside = f" in {where}" if where else ""
    unknown = sorted(set(value) - set(hints))
    if unknown:
        raise ModelFolderError(f"{path}: unknown key(s) {unknown}{inside}: {RESTORE}")
    missing = sorted(required - set(value))
    if missing:
        raise ModelFolderError(f"{path}: key(s) {missing} missing{inside}: {RESTORE}")
    for key, item in value.items():
        _check_json(item, hints[key], f"{where}.{key}" if where else key, path)


def _json_kind(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}  # fmt: skip
    shown = repr(value) if isinstance(value, (str, int, float)) else ""  # bool is an int
    return names.get(type(value), type(value).__name__) + (f" ({shown[:40]})" if shown else "")


def _hint_name(hint) -> str:
    if dataclasses.is_dataclass(hint):
        return "an object"
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return " or ".join(_hint_name(option) for option in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(hint, "__name__", str(hint)) if not typing.get_args(hint) else str(hint)


def task_class_of(task_class_name) -> type | None:
    """The class `module.qualname` names when it is a class of the tsformer package (no other module
    is imported: a model folder never runs code); None otherwise."""
    module, _, name = str(task_class_name).rpartition(".")
    if not module.startswith("tsformer."):
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) else None


def _build_task(task_class_name: str, hparams: dict, path: Path) -> WindowTask:
    """The (untrained) task `tsformer.json` names, built from its hparams, which must fit its constructor."""
    name = str(task_class_name).rpartition(".")[2]
    task_class = task_class_of(task_class_name)
    if not (task_class is not None and issubclass(task_class, WindowTask)):
        raise ModelFolderError(
            f"{path}: task_class {task_class_name!r} is not a task of this tsformer (such as "
            f"'tsformer.tasks.forecasting.EncoderDecoderForecaster'): {RESTORE}"
        )
    parameters = task_settings(task_class)
    required = {name for name, p in parameters.items() if p.default is inspect.Parameter.empty}
    hints = {name: p.annotation for name, p in parameters.items()}
    _check_keys(hparams, hints, required, "hparams", path)
    try:
        return task_class(**hparams)
    except Exception as err:  # the code is known good: what fails here is the file's hparams
        raise ModelFolderError(
            f"{path}: hparams do not build a network of {name} ({type(err).__name__}: {_first_line(err)}): "
            f"{RESTORE}"
        ) from err


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
        yield f"data.freq {c.freq!r} is not a fixed pandas frequency ({_first_line(err)})"
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


def _load_weights(task: WindowTask, path: Path) -> None:
    """`weights.pt` into `task`, once every name and shape is known to fit and every value is finite."""
    state = _read_weights(path)
    mismatch = state_mismatch(state, task.state_dict())
    if mismatch:
        raise ModelFolderError(
            f"{path} does not fit the network {CONFIG_FILE} describes: {mismatch};"
            f" the two files come from different models: {RESTORE}"
        )
    broken = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if broken:
        raise ModelFolderError(
            f"{path}: {len(broken)} weight(s) hold NaN or infinite values (e.g. {broken[0]!r}): {RESTORE}"
        )
    task.load_state_dict(state)


def _read_weights(path: Path) -> dict:
    """The state dict in `weights.pt`: a file torch reads, holding named tensors only."""
    if not path.is_file():
        raise ModelFolderError(f"{path} is missing: {RESTORE}")
    if path.stat().st_size == 0:
        raise ModelFolderError(f"{path} is empty: {RESTORE}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # whatever torch cannot read here is a damaged file
        reason = _first_line(err).split(". ")[0][:120]  # torch's first sentence (the rest: advice on pickles)
        raise ModelFolderError(f"{path}: not a weights file torch can read ({reason}): {RESTORE}") from err
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()
    ):
        raise ModelFolderError(f"{path}: holds other things than named tensors (a state dict): {RESTORE}")
    return state


def state_mismatch(state: dict, own: dict, wanted=None, offered=None) -> str:
    """How the weights `state` do not fit the network's own state dict `own` ("" when they fit): the
    names of `wanted` (default: all of `own`) it lacks or holds in another shape, and the names of
    `offered` (default: all of `state`) that `own` has not."""
    wanted = list(own) if wanted is None else wanted
    offered = list(state) if offered is None else offered
    missing = [k for k in wanted if k not in state]
    unknown = [k for k in offered if k not in own]
    reshaped = [k for k in wanted if k in state and state[k].shape != own[k].shape]
    problems = []
    if missing:
        problems.append(f"{len(missing)} weight(s) missing (e.g. {missing[0]!r})")
    if unknown:
        problems.append(f"{len(unknown)} unknown (e.g. {unknown[0]!r})")
    if reshaped:
        k = reshaped[0]
        problems.append(
            f"{len(reshaped)} of another shape (e.g. {k!r}: {list(state[k].shape)}, the network has "
            f"{list(own[k].shape)})"
        )
    return ", ".join(problems)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


class Forecaster:
    """A trained network plus its data contract: tables in, forecasts (original units) out."""

    def __init__(self, task, contract: DataContract, info: ModelInfo):
        self.task = task.eval()
        self.contract = contract
        self.info = info

    @classmethod
    def load(cls, folder: str | Path) -> Forecaster:
        """The model in `folder`, checked (see the module docstring)."""
        folder = Path(folder)
        config_path = folder / CONFIG_FILE
        if not config_path.is_file():
            raise FileNotFoundError(
                f"{folder} is not a tsformer model folder: {CONFIG_FILE} is missing (a training run writes "
                "one to <run output folder>/model and logs it to MLflow)"
            )
        config = _read_config(config_path)
        task = _build_task(config["task_class"], config["hparams"], config_path)
        contract = DataContract.from_dict(config["data"])
        _check_contract(contract, dict(task.hparams), config_path)
        _load_weights(task, folder / WEIGHTS_FILE)
        task.set_target_scaling(contract.target_scaler)
        return cls(task, contract, ModelInfo(**config["info"]))

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
        for sid, rows in _series_positions(clean, c).items():
            self._check_frequency(clean, sid, rows, source)
            if self.task.reconstructs:
                windows.extend(self._reconstruction_windows(clean, sid, rows, source))
            else:
                windows.append(self._forecast_window(clean, sid, rows, origin, source))
        batch, times = self._batch(clean, windows)
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

    def _batch(self, clean, windows) -> tuple[dict, np.ndarray]:
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

        batch = {  # a reconstruction window (m = 0) is all "history"
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
        if m == 0:  # reconstruction reads only the inputs: blank the targets for the same reason
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
