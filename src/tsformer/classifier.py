"""A trained sequence classifier as a self-contained folder, and the classes of new sequences.

The folder has the files of a forecasting model folder (`tsformer.forecaster`): `tsformer.json` (the
task class, its hyperparameters with the class names, the data contract below, the channel scaler
as plain numbers) and `weights.pt` (a plain state dict). `Classifier.load(folder).predict(table)`
needs only the installed package; `predict.py` and the pyfunc model dispatch on the task class
written in `tsformer.json` (`is_classifier_folder`). An encoder pre-trained on such sequences
(`pretrain=masked`, `tasks/pretraining.py`) is saved the same way, for `init_from`; it classifies nothing.

The table is laid out as the training data (`tsformer.data.sequences`):
- labelled sequences: series id, step, channels (the label column may be there or not): one row of
  output per series;
- a labelled stream: time (and series) column and channels: one row per window of `context_len`
  steps inside each gap-free run of rows, at every step (`window_end_time` is its last step).
Output columns: `series_id`, [`window_end_time`], `y_true` (the table's label, empty without one),
`y_pred`, `p_<class>` for every class. A label the model does not know is named in a warning.
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from tsformer.data.features import Affine
from tsformer.data.schema import SeriesSchema, find_segments, resolve_freq
from tsformer.data.sequences import SequenceColumns, pad_batch, read_sequences
from tsformer.data.windows import window_starts
from tsformer.export import _write_atomically
from tsformer.forecaster import (
    CONFIG_FILE,
    RESTORE,
    WEIGHTS_FILE,
    Forecaster,
    ModelFolderError,
    ModelInfo,
    _load_weights,
    _plain,
)

log = logging.getLogger(__name__)

FORMAT = "classifier-1"
BATCH = 256


@dataclass
class SequenceContract:
    """What a table must hold for the classifier, and how its channels were scaled in training."""

    layout: str  # "sequences" | "stream"
    channel_cols: list[str]
    channel_scaler: Affine
    classes: list[str]
    series_col: str | None = None
    step_col: str | None = None  # sequences: orders the rows of a series
    label_col: str | None = None
    time_col: str | None = None  # stream
    context_len: int = 0  # stream: steps per window
    freq: str | None = None  # stream
    time_format: str | None = None
    csv: dict = field(default_factory=dict)


def contract_of(datamodule) -> SequenceContract:
    """The data contract of a set-up `SequenceDataModule` or `StreamDataModule`."""
    common = {"channel_cols": list(datamodule.channel_names), "channel_scaler": datamodule.channel_scaler}
    common["classes"] = list(datamodule.classes)
    windows = getattr(datamodule, "windows", None)
    if windows is None:
        return SequenceContract(
            layout="sequences", series_col=datamodule.series_col, step_col=datamodule.step_col,
            label_col=datamodule.label_col, csv=dict(datamodule.csv), **common,
        )  # fmt: skip
    schema = windows.schema
    return SequenceContract(
        layout="stream", series_col=schema.series_col, label_col=datamodule.label_col,
        time_col=schema.time_col, context_len=datamodule.context_len, freq=windows.freq.freqstr,
        time_format=schema.time_format, csv=dict(windows.csv), **common,
    )  # fmt: skip


def save_classifier_folder(folder: str | Path, task, datamodule, info: ModelInfo) -> Path:
    """Write `task`'s network and `datamodule`'s contract to `folder`, each file atomically."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    task_class = type(task)
    config = {
        "format": FORMAT,
        "task_class": f"{task_class.__module__}.{task_class.__qualname__}",
        "hparams": _plain(dict(task.hparams)),
        "data": asdict(contract_of(datamodule)),
        "info": asdict(info),
    }
    _write_atomically(folder / CONFIG_FILE, lambda tmp: tmp.write_text(json.dumps(config, indent=2)))
    state = {k: v.detach().cpu() for k, v in task.state_dict().items()}
    _write_atomically(folder / WEIGHTS_FILE, lambda tmp: torch.save(state, tmp))
    return folder


def is_classifier_folder(folder: str | Path) -> bool:
    """Whether the model folder's `tsformer.json` holds a classifier (else: a forecasting model)."""
    try:
        return json.loads((Path(folder) / CONFIG_FILE).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False  # the forecaster's loader names what is wrong with the file


class Classifier:
    """A trained classification network plus its data contract: tables in, classes out."""

    def __init__(self, task, contract: SequenceContract, info: ModelInfo):
        self.task = task.eval()
        self.contract = contract
        self.info = info

    @classmethod
    def load(cls, folder: str | Path) -> Classifier:
        folder = Path(folder)
        path = folder / CONFIG_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{folder} is not a tsformer model folder: {CONFIG_FILE} is missing")
        try:
            config = json.loads(path.read_text())
            contract = SequenceContract(**config["data"])
            contract.channel_scaler = Affine(**config["data"]["channel_scaler"])
            info = ModelInfo(**config["info"])
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise ModelFolderError(f"{path}: not a classifier's {CONFIG_FILE} ({err}): {RESTORE}") from err
        if config.get("members") is not None:  # an ensemble (tsformer.ensemble): its members' mean
            return cls(_ensemble_task(folder, config["members"], path), contract, info)
        task = _build_classifier(config.get("task_class"), config.get("hparams"), path)
        _load_weights(task, folder / WEIGHTS_FILE)
        return cls(task, contract, info)

    @property
    def classes(self) -> list[str]:
        return list(self.contract.classes)

    def predict(
        self, table: pd.DataFrame, origin=None, source: str = "input table", time_format: str | None = None
    ) -> pd.DataFrame:
        """The class and probabilities of every sequence (or stream window) of `table`; `origin` is
        the forecasters' (refused: a classifier takes every sample), `time_format` a stream's."""
        if not hasattr(self.task, "predict_proba"):
            raise ValueError(
                f"model of run {self.info.run_id} is an encoder pre-trained by masked fill-in: it classifies "
                "nothing; fine-tune a classifier from it: python train.py experiment=... "
                "init_from=<its run id>"
            )
        if origin is not None:
            raise ValueError(f"origin={origin}: a classifier classifies every sample; give no origin")
        c = self.contract
        if c.layout == "stream":
            info, samples, labels = self._stream_windows(table, source, time_format or c.time_format)
        else:
            cols = SequenceColumns(c.series_col, c.step_col, c.label_col, c.channel_cols)
            found = read_sequences(table, source, cols, labelled=False)
            info, samples, labels = pd.DataFrame({"series_id": found["ids"]}), found["x"], found["labels"]
        samples = [c.channel_scaler.transform(x).astype(np.float32) for x in samples]
        proba = self.predict_proba(samples)
        if labels is not None:
            self._warn_unknown(labels, source)
        return classes_frame(info, proba, self.classes, labels)

    def predict_proba(self, samples: list[np.ndarray]) -> np.ndarray:
        """Scaled samples `(T_i, D)` -> probabilities `(S, C)`, in batches padded to their longest."""
        out = []
        with torch.no_grad():
            for lo in range(0, len(samples), BATCH):
                items = [
                    {"x": torch.as_tensor(x), "label": torch.tensor(0), "sample": torch.tensor(i)}
                    for i, x in enumerate(samples[lo : lo + BATCH])
                ]
                out.append(self.task.predict_proba(pad_batch(items)).double().numpy())
        return np.concatenate(out) if out else np.zeros((0, len(self.classes)))

    def _stream_windows(self, table: pd.DataFrame, source: str, time_format: str | None):
        c = self.contract
        schema = SeriesSchema(
            time_col=c.time_col, target_cols=c.channel_cols, series_col=c.series_col, freq=c.freq,
            time_format=time_format,
        )  # fmt: skip
        keep = [c.label_col] if c.label_col in table.columns else []
        clean = schema.validate(table, source, extra_cols=keep)
        step = pd.Timedelta(resolve_freq(clean, schema, source))
        segments = find_segments(clean, schema, step, source)
        N = c.context_len
        starts = np.concatenate(
            [window_starts((s.start, s.stop), (s.start, s.stop), N, 0) for s in segments.itertuples()]
        )
        values = clean[c.channel_cols].to_numpy(dtype=np.float64)  # (rows, D)
        last = starts + N - 1
        series = clean[c.series_col].to_numpy()[last] if c.series_col else np.zeros(len(last), dtype=int)
        info = pd.DataFrame({"series_id": series, "window_end_time": clean[c.time_col].to_numpy()[last]})
        labels = clean[c.label_col].to_numpy()[last] if keep else None
        return info, [values[s : s + N] for s in starts], labels

    def _warn_unknown(self, labels, source: str) -> None:
        unknown = sorted({str(v) for v in labels} - set(self.classes))
        if unknown:
            log.warning(
                "%s: label(s) %s are no class of the model (classes %s): y_true keeps them, y_pred never "
                "is one",
                source,
                unknown,
                self.classes,
            )


def load_model(folder: str | Path) -> Forecaster | Classifier:
    """The model of a model folder, by the task its `tsformer.json` names: predict.py and the pyfunc
    model take either, through the same `predict(table, origin=, source=, time_format=)`."""
    if is_classifier_folder(folder):
        return Classifier.load(folder)
    return Forecaster.load(folder)


def _ensemble_task(folder: Path, members, path: Path):
    """The members' tasks (subfolders of `folder`, named in its `tsformer.json`) as one mean."""
    from tsformer.ensemble import MeanOfMembers

    if not members or not all(isinstance(m, str) and m and Path(m).name == m != ".." for m in members):
        raise ModelFolderError(f"{path}: 'members' must name the member folders inside {folder}: {RESTORE}")
    return MeanOfMembers([Classifier.load(folder / m).task for m in members])


def _build_classifier(task_class_name, hparams, path: Path):
    """The (untrained) classification task `tsformer.json` names, from its hparams."""
    from tsformer.tasks.classification import ClassificationTask
    from tsformer.tasks.pretraining import MaskedPretraining

    module, _, name = str(task_class_name).rpartition(".")
    task_class = None
    if module.startswith("tsformer."):
        try:
            task_class = getattr(importlib.import_module(module), name, None)
        except ImportError:
            pass
    if not (isinstance(task_class, type) and issubclass(task_class, (ClassificationTask, MaskedPretraining))):
        raise ModelFolderError(f"{path}: task_class {task_class_name!r} is no classifier of this tsformer")
    try:
        return task_class(**hparams)
    except Exception as err:  # the code is known good: what fails here is the file's hparams
        raise ModelFolderError(
            f"{path}: hparams do not build a {name} ({type(err).__name__}: {err}): {RESTORE}"
        ) from err


def classes_frame(info: pd.DataFrame, proba: np.ndarray, classes: list[str], labels=None) -> pd.DataFrame:
    """`series_id`, [`window_end_time`], `y_true`, `y_pred`, `p_<class>`... (one row per sample)."""
    frame = info.reset_index(drop=True).copy()
    frame["y_true"] = [str(v) for v in labels] if labels is not None else None
    frame["y_pred"] = np.asarray(classes, dtype=object)[proba.argmax(axis=1)] if len(proba) else []
    for j, name in enumerate(classes):
        frame[f"p_{name}"] = proba[:, j]
    return frame
