"""A trained sequence classifier as a self-contained folder, and the classes of new sequences.

The folder (`tsformer.model_folder`, format `classifier-3`: `FOLDER`) holds `tsformer.json` (the task
class, its hyperparameters with the class names, the data contract below, the channel scaler as plain
numbers, the probabilities' calibration: `calibration.py`) and `weights.pt` (a plain state dict). `Classifier.load(folder).predict(table)` needs only
the installed package; `predict.py` and the pyfunc model find its job by the task class written in
`tsformer.json` (`jobs.job_of_folder`); an ensemble's folder is a kind of its own (`ensemble.py`). An encoder pre-trained on such sequences
(`pretrain=masked`, `tasks/pretraining.py`) is saved the same way, for `init_from`; it classifies nothing.

The table is laid out as the training data (`tsformer.data.sequences`):
- labelled sequences: series id, step, channels (the label column may be there or not): one row of
  output per series;
- a labelled stream: time (and series) column and channels: one row per window of `context_len`
  steps inside each gap-free run of rows, at every step (`window_end_time` is its last step).
Output columns: `series_id`, [`window_end_time`], `y_true` (the table's label, empty without one),
`y_pred`, `p_<class>` for every class (calibrated: softmax(logits / T)); with `explain`, each sample's
top time ranges (`explain.range_columns`). A label the model does not know is named in a warning.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from pandas.tseries.frequencies import to_offset

from tsformer import model_folder
from tsformer.data.features import Affine
from tsformer.data.schema import SeriesSchema, find_segments, fixed_step, resolve_freq
from tsformer.data.sequences import SequenceColumns, pad_batch, read_sequences
from tsformer.data.windows import window_starts
from tsformer.jobs.classification.calibration import NONE, Calibration
from tsformer.jobs.classification.explain import occlusion, range_columns
from tsformer.model_folder import RESTORE, FolderKind, ModelFolderError, ModelInfo, Upgrade, first_line
from tsformer.tasks.classification import ClassificationTask
from tsformer.tasks.pretraining import MaskedPretraining

log = logging.getLogger(__name__)

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


@dataclass
class ClassifierContract(SequenceContract):
    """A classifier's folder's `data`: the table's contract, and the temperature its probabilities are
    divided by (an ensemble's members each have their own; the ensemble's `data` is the shared
    `SequenceContract`)."""

    calibration: Calibration = field(default_factory=lambda: NONE)


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
        time_format=getattr(windows, "time_format_used", schema.time_format), csv=dict(windows.csv), **common,
    )  # fmt: skip


def save_classifier_folder(folder: str | Path, task, datamodule, info: ModelInfo) -> Path:
    """Write `task`'s network, `datamodule`'s contract and the task's calibration (none fitted: T = 1)
    to `folder`, each file atomically."""
    calibration = getattr(task, "calibration", NONE)
    contract = ClassifierContract(**vars(contract_of(datamodule)), calibration=calibration)
    return model_folder.write(folder, FOLDER, task, contract, info)


# -- reading a classifier's folder, checked (`model_folder.read`) --------------------------------


def _contract_problems(c: ClassifierContract, hparams: dict):
    """What `predict` would trip over: counts that follow from the channels and classes, ranges."""
    n = len(c.channel_cols)
    if not c.channel_cols or len(set(c.channel_cols)) != n:
        yield f"data.channel_cols is {c.channel_cols}, expected distinct column names"
    for part in ("scale", "offset"):
        numbers = getattr(c.channel_scaler, part)
        if len(numbers) != n:
            yield f"data.channel_scaler.{part} has {len(numbers)} number(s), one per channel of {c.channel_cols} expected"
        if not all(math.isfinite(v) for v in numbers):
            yield f"data.channel_scaler.{part} is {numbers}, expected finite numbers"
    if min(c.channel_scaler.scale, default=1) <= 0:
        yield f"data.channel_scaler.scale is {c.channel_scaler.scale}, expected numbers above 0"
    if len(c.classes) < 2 or len(set(c.classes)) != len(c.classes):
        yield f"data.classes is {c.classes}, expected two or more distinct classes"
    if hparams.get("classes") is not None and hparams["classes"] != c.classes:
        yield f"hparams.classes is {hparams['classes']!r}, but data makes it {c.classes!r}"
    if hparams.get("d_in") != n:
        yield f"hparams.d_in is {hparams.get('d_in')!r}, but data makes it {n} (its channel_cols)"
    yield from _layout_problems(c)
    yield from (f"data.{problem}" for problem in c.calibration.problems())


def _layout_problems(c: SequenceContract):
    least = 1 if c.layout == "stream" else 0  # sequences: each its own length (0)
    if c.context_len < least:
        yield f"data.context_len is {c.context_len}, expected a whole number of at least {least}"
    if c.layout == "sequences":
        if not (c.series_col and c.step_col):
            yield "data.series_col and data.step_col must name the columns of labelled sequences"
    elif c.layout == "stream":
        if not c.time_col:
            yield "data.time_col must name the time column of a stream"
        try:
            fixed_step(to_offset(c.freq))
        except (ValueError, TypeError) as err:  # DataValidationError is a ValueError
            yield f"data.freq {c.freq!r} is not a fixed pandas frequency ({first_line(err)})"
    else:
        yield f"data.layout is {c.layout!r}, expected 'sequences' or 'stream'"


def _check_contract(c: ClassifierContract, hparams: dict, path: Path) -> None:
    problem = next(_contract_problems(c, hparams), None)
    if problem is not None:
        raise ModelFolderError(f"{path}: {problem}: {RESTORE}")


def not_a_classifier(info: ModelInfo) -> str:
    """The one line refusing to classify with a pre-trained encoder."""
    return (
        f"model of run {info.run_id} is an encoder pre-trained by masked fill-in: it classifies nothing; "
        "fine-tune a classifier from it: python train.py experiment=... init_from=<its run id>"
    )


class Classifier:
    """A trained classification network plus its data contract: tables in, classes out."""

    def __init__(self, task, contract: SequenceContract, info: ModelInfo):
        self.task = task.eval()
        self.contract = contract
        self.info = info

    @classmethod
    def load(cls, folder: str | Path) -> Classifier:
        """The model in `folder`, checked (`model_folder.read`), its probabilities divided by the
        temperature the folder keeps."""
        task, contract, info = model_folder.read(folder, FOLDER)
        task.temperature, task.calibration = contract.calibration.temperature, contract.calibration
        return cls(task, contract, info)

    @property
    def classes(self) -> list[str]:
        return list(self.contract.classes)

    @property
    def class_shares(self) -> np.ndarray | None:
        """`(C,)` the training samples' class shares (the majority class baseline's probabilities);
        None where the folder does not say (an ensemble's: its first member's)."""
        task = self.task.members[0] if hasattr(self.task, "members") else self.task
        counts = (getattr(task, "hparams", None) or {}).get("class_counts")
        if not counts or len(counts) != len(self.classes) or sum(counts) <= 0:
            return None
        return np.asarray(counts, dtype=np.float64) / sum(counts)

    def predict(
        self,
        table: pd.DataFrame,
        source: str = "input table",
        time_format: str | None = None,
        explain: bool = False,
    ) -> pd.DataFrame:
        """The class and probabilities of every sequence (or stream window) of `table`; `time_format`:
        a stream's text times (default: the training data's). With `explain`, each sample's top time
        ranges by occlusion (`explain.range_columns`) too."""
        if not hasattr(self.task, "predict_proba"):
            raise ValueError(not_a_classifier(self.info))
        c = self.contract
        if c.layout == "stream":
            info, samples, labels, steps = self.stream_windows(table, source, time_format or c.time_format)
        else:
            cols = SequenceColumns(c.series_col, c.step_col, c.label_col, c.channel_cols)
            found = read_sequences(table, source, cols, labelled=False)
            info, samples, labels = pd.DataFrame({"series_id": found["ids"]}), found["x"], found["labels"]
            steps = found["steps"]
        samples = [c.channel_scaler.transform(x).astype(np.float32) for x in samples]
        proba = self.predict_proba(samples)
        if labels is not None:
            self._warn_unknown(labels, source)
        frame = classes_frame(info, proba, self.classes, labels)
        if explain:
            found = occlusion(self.predict_proba, samples, targets=proba.argmax(axis=1))
            frame = frame.assign(**range_columns(found, steps))
        return frame

    def predict_proba(self, samples: list[np.ndarray]) -> np.ndarray:
        """Scaled samples `(T_i, D)` -> probabilities `(S, C)`, in batches padded to their longest."""
        return probabilities(self.task, samples, len(self.classes))

    def stream_windows(self, table: pd.DataFrame, source: str, time_format: str | None = None):
        """A stream's windows as `predict` classifies them, before scaling: (info: `series_id`,
        `window_end_time` per window; windows `(context_len, D)` of the channels; the label of each
        window's last step, None without a label column; each window's times). `time_format`: the
        table's text times (default: the training data's)."""
        c = self.contract
        time_format = time_format or c.time_format
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
        times = clean[c.time_col].to_numpy()  # (rows,)
        return info, [values[s : s + N] for s in starts], labels, [times[s : s + N] for s in starts]

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


def probabilities(task, samples: list[np.ndarray], n_classes: int) -> np.ndarray:
    """`task.predict_proba` of scaled samples `(T_i, D)` -> `(S, C)`, in batches padded to their longest."""
    out = []
    with torch.no_grad():
        for lo in range(0, len(samples), BATCH):
            items = [
                {"x": torch.as_tensor(x), "label": torch.tensor(0), "sample": torch.tensor(i)}
                for i, x in enumerate(samples[lo : lo + BATCH])
            ]
            out.append(task.predict_proba(pad_batch(items)).double().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, n_classes))


def _uncalibrated(config: dict) -> dict:
    """A classifier-2 folder as classifier-3: its probabilities were softmax(logits), temperature 1."""
    return {**config, "data": {**config["data"], "calibration": asdict(NONE)}}


FOLDER = FolderKind(
    name="classifier",
    version=3,  # 2: ensembles are a kind of their own; 3: the calibration (data.calibration)
    describes="classifier",
    contract=ClassifierContract,
    tasks=(ClassificationTask, MaskedPretraining),
    load=Classifier.load,
    check_contract=_check_contract,
    upgrades={1: Upgrade(), 2: Upgrade(config=_uncalibrated)},  # 1 holds what 2 holds
)


def classes_frame(info: pd.DataFrame, proba: np.ndarray, classes: list[str], labels=None) -> pd.DataFrame:
    """`series_id`, [`window_end_time`], `y_true`, `y_pred`, `p_<class>`... (one row per sample)."""
    frame = info.reset_index(drop=True).copy()
    frame["y_true"] = [str(v) for v in labels] if labels is not None else None
    frame["y_pred"] = np.asarray(classes, dtype=object)[proba.argmax(axis=1)] if len(proba) else []
    for j, name in enumerate(classes):
        frame[f"p_{name}"] = proba[:, j]
    return frame
