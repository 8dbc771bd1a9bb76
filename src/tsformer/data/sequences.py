"""Labelled sequences for classification: one sample per series (or per window of a stream), one class.

Two layouts a user has, two LightningDataModules with one interface (`ClassificationData`):

- `SequenceDataModule`, labelled sequences: a long table, one row per series and step, with a series
  id, a step (or time) column that orders the rows of a series, the channel columns and a label that
  is the same on every row of a series (a label that changes inside a series is an error naming the
  series and the rows). One sample per series; series of unequal length are padded at the end to the
  longest of their batch, and a `valid` mask (True on real steps) keeps the padding out of attention
  and pooling. Train and test come from two files (`test`: the archive's split), or the test series
  are a stratified `test_fraction` of the train file; the validation series are a stratified
  `val_fraction` of the train series (seeded). Every val/test series is a sample: none is dropped.
  The archive's own `.ts` files are read as well (`tsformer.data.ts_format`: `data.train=X_TRAIN.ts`,
  or `archive=<folder>` and `name=<set>` for `<folder>/<set>/<set>_TRAIN.ts` and `_TEST.ts`).
- `StreamDataModule`, a labelled stream: one long series (or several) with a label on every step
  (operating phase, fault code). Each window of `context_len` steps is a sample labelled by its
  LAST step (the state the plant is in when the window is classified). The table is validated, split
  in time and windowed by `TimeSeriesDataModule` (horizon 0: a window belongs to the split holding
  all its steps), which this module wraps.

Both: the classes are the labels of the training samples (sorted, numbers in numeric order, or in
`class_order`); a val or test sample of another class is an error naming it. Each channel is standardised with a scaler fitted
on the training samples' rows only. `label_fraction` < 1 keeps the labels of a seeded, stratified share
of the training samples for the classifier (the others are left out of its training; validation and
test are untouched); `pretraining: true` (`conf/pretrain/masked.yaml`) gives every training sample,
labels ignored, to masked pre-training of the encoder (`tsformer.tasks.pretraining`).
A batch is a dict: `x` (B, T, D) float32, `valid` (B, T) bool,
`label` (B,) int64 class index, `sample` (B,) int64 (the sample's index in its split).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import lightning as L
import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset

from tsformer.data.datamodule import SPLITS, EvalShard, TimeSeriesDataModule
from tsformer.data.features import Affine, check_scaler
from tsformer.data.schema import DataValidationError, describe_row, plain
from tsformer.data.sources import find_first, load_table, shared_data_folders
from tsformer.data.ts_format import archive_ts_file, read_ts
from tsformer.settings import SettingError

log = logging.getLogger(__name__)

LABEL_CODE = "__label_code"  # the label as a number, carried through TimeSeriesDataModule's extra_cols


def archive_file(name: str, split: str, folder=("data/classification",)) -> str:
    """The long-table copy `<name>/<name>_<split>_long.csv` of a UEA/UCR archive set: looked for in
    `folder` (one or a list), then in `$TSFORMER_DATA_DIR/classification` and the shared data folder."""
    folders = [folder] if isinstance(folder, str) else list(folder)
    candidates = [*(f"{f}/{name}" for f in folders), *shared_data_folders(f"classification/{name}")]
    hint = (
        f"the UEA/UCR archive set {name} as a long table (series_id, step, channels, label): convert the "
        "archive's .ts files, or give data.train= and data.test= paths"
    )
    return str(find_first(candidates, hint, file_name=f"{name}_{split}_long.csv"))


def sorted_classes(labels) -> list[str]:
    """Distinct labels as text, in numeric order when all are numbers ('2' before '10'), else text order."""
    distinct = {str(plain(v)) for v in labels}
    try:
        return sorted(distinct, key=float)
    except ValueError:
        return sorted(distinct)


def ordered_classes(classes: list[str], order, source: str) -> list[str]:
    """The training classes in `order` (data.class_order, e.g. low, normal, high for the figures and
    the CSV's p_ columns), or as they are when None; a training class missing from `order` is an error."""
    if order is None:
        return classes
    order = [str(c) for c in order]
    missing = [c for c in classes if c not in order]
    if missing:
        raise DataValidationError(
            f"{source}: class(es) {missing} of the training samples are not in data.class_order={order}; "
            "add them, or set data.class_order=null"
        )
    return [c for c in order if c in classes]


def class_codes(labels, classes: list[str], source: str, where) -> np.ndarray:
    """Class index of each label; a label outside `classes` is a one-line error (`where(i)` names it)."""
    lookup = {c: i for i, c in enumerate(classes)}
    text = [str(plain(v)) for v in labels]
    unseen = [i for i, t in enumerate(text) if t not in lookup]
    if unseen:
        i = unseen[0]
        raise DataValidationError(
            f"{source}: {where(i)} has label {text[i]!r}, a class the training samples do not have "
            f"(classes {classes}); train with samples of that class, or leave such samples out"
        )
    return np.array([lookup[t] for t in text], dtype=np.int64)


def stratified_part(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Bool mask of a seeded `fraction` of the samples of each class (at least one sample overall,
    never every sample of a class that has more than one)."""
    rng = np.random.default_rng(seed)
    chosen = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        n = round(len(members) * fraction)
        chosen[members[: min(n, len(members) - 1)]] = True
    if fraction > 0 and not chosen.any() and len(labels) > 1:
        chosen[rng.integers(len(labels))] = True
    return chosen


def labelled_part(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Bool mask of a seeded `fraction` of the samples of each class, rounded, at least one per class
    (a class with no labelled sample could not be learnt, and `classes` would still name it)."""
    rng = np.random.default_rng(seed)
    chosen = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        chosen[members[: max(1, round(len(members) * fraction))]] = True
    return chosen


def pad_batch(items: list[dict]) -> dict[str, torch.Tensor]:
    """Samples of lengths T_i -> a batch padded at the end to max T_i, with `valid` True on real steps."""
    T = max(len(item["x"]) for item in items)
    D = items[0]["x"].shape[-1]
    x = torch.zeros(len(items), T, D)  # (B, T, D)
    valid = torch.zeros(len(items), T, dtype=torch.bool)  # (B, T)
    for b, item in enumerate(items):
        n = len(item["x"])
        x[b, :n] = item["x"]
        valid[b, :n] = True
    return {
        "x": x,
        "valid": valid,
        "label": torch.stack([item["label"] for item in items]),
        "sample": torch.stack([item["sample"] for item in items]),
    }


@dataclass
class SequenceColumns:
    """The columns of a labelled-sequence table (also kept in a classifier's model folder)."""

    series_col: str
    step_col: str
    label_col: str
    channel_cols: list[str]


def read_sequences(table: pd.DataFrame, source: str, cols: SequenceColumns, labelled: bool = True) -> dict:
    """The table's series: ids, (T_i, D) float64 arrays in step order, one label each (checked; None
    when not `labelled` and the table has no label column), and each series' step values `(T_i,)`."""
    labelled = labelled or cols.label_col in table.columns
    needed = [cols.series_col, cols.step_col, *([cols.label_col] if labelled else []), *cols.channel_cols]
    for col in needed:
        if col not in table.columns:
            raise DataValidationError(
                f"{source}: no column '{col}' (columns: {list(table.columns)}); name the columns with "
                "data.series_col, data.step_col, data.label_col and data.channel_cols"
            )
    if table.empty:
        raise DataValidationError(f"{source}: the table has no rows")
    values = table[cols.channel_cols].apply(pd.to_numeric, errors="coerce")
    _refuse_missing(values, source, "a number")
    _refuse_missing(table[[cols.series_col, *([cols.label_col] if labelled else [])]], source, "a value")
    table = table.assign(**{c: values[c] for c in cols.channel_cols})
    table = table.sort_values([cols.series_col, cols.step_col], kind="stable")
    ids, x, labels, steps = [], [], [], []
    for sid, rows in table.groupby(cols.series_col, sort=False):
        ids.append(plain(sid))
        x.append(rows[cols.channel_cols].to_numpy(dtype=np.float64))  # (T_i, D)
        steps.append(rows[cols.step_col].to_numpy())  # (T_i,)
        if labelled:
            _one_label(rows[cols.label_col], sid, source)
            labels.append(plain(rows[cols.label_col].iloc[0]))
    labels = np.array(labels, dtype=object) if labelled else None
    return {"ids": np.array(ids, dtype=object), "x": x, "labels": labels, "steps": steps}


class SampleDataset(Dataset):
    """Samples as (T_i, D) float32 arrays (views, never copies) with their class index."""

    def __init__(self, samples: Sequence[np.ndarray], labels: np.ndarray):
        self.samples = samples
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "x": torch.as_tensor(self.samples[i]),
            "label": torch.tensor(self.labels[i]),
            "sample": torch.tensor(i),
        }

    def subset(self, keep: np.ndarray) -> SampleDataset:
        """The samples where `keep` `(S,)` is True (views of the same arrays), renumbered from 0."""
        index = np.flatnonzero(keep)
        return SampleDataset([self.samples[i] for i in index], self.labels[index])

    def padded(self) -> tuple[np.ndarray, np.ndarray]:
        """Every sample padded to the longest: x `(S, T, D)`, valid `(S, T)` (for the baselines)."""
        batch = pad_batch([self[i] for i in range(len(self))])
        return batch["x"].numpy(), batch["valid"].numpy()


class ClassificationData(L.LightningDataModule):
    """What the classification task and its outputs read from either layout (set by `setup`)."""

    def __init__(
        self,
        name: str,
        batch_size: int,
        eval_batch_size: int,
        seed: int,
        num_workers: int = 0,
        class_order=None,
        label_fraction: float = 1.0,
        pretraining: bool = False,
    ):
        super().__init__()
        if not 0.0 < float(label_fraction) <= 1.0:
            raise SettingError(
                f"data.label_fraction={label_fraction}: the share of the training samples that keep their "
                "label must be in (0, 1]; e.g. 0.1, or 1.0 for every label"
            )
        self.label_fraction, self.pretraining = float(label_fraction), bool(pretraining)
        self.name = name
        self.class_order = None if class_order is None else [str(c) for c in class_order]
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.seed, self.num_workers = int(seed), int(num_workers)
        self.classes: list[str] = []
        self.channel_names: list[str] = []
        self.channel_scaler = None
        self.datasets: dict[str, SampleDataset] = {}
        self.infos: dict[str, pd.DataFrame] = {}  # per split: series_id [, window_end_time]

    @property
    def job(self) -> str:
        """Which `train.Job` this data feeds: masked pre-training (labels ignored) or classification."""
        return "pretraining" if self.pretraining else "classification"

    @property
    def d_in(self) -> int:
        return len(self.channel_names)

    def keep_labels(self, datasets: dict[str, SampleDataset], source: str) -> dict[str, SampleDataset]:
        """`datasets` with the training samples cut to the labelled share (`label_fraction`, stratified,
        seeded), unless every label is kept or the run pre-trains (every sample's values, no label)."""
        if self.label_fraction == 1.0 or self.pretraining:
            return datasets
        train = datasets["train"]
        keep = labelled_part(train.labels, self.label_fraction, self.seed + 2)
        self.infos["train"] = self.infos["train"][keep].reset_index(drop=True)
        log.info(
            "%s: data.label_fraction=%g: %d of %d training samples keep their label",
            source, self.label_fraction, int(keep.sum()), len(keep),
        )  # fmt: skip
        return datasets | {"train": train.subset(keep)}

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    def sample_info(self, split: str) -> pd.DataFrame:
        """One row per sample of `split`, in sample order: `series_id` (and `window_end_time`)."""
        self.setup()
        return self.infos[split]

    def labels(self, split: str) -> np.ndarray:
        self.setup()
        return self.datasets[split].labels

    def _loader(self, split: str) -> DataLoader:
        self.setup()
        train = split == "train"
        dataset = self.datasets[split]
        # under DDP each val/test sample is evaluated by exactly one process (Lightning's own sampler
        # would repeat some to even out the processes, and count them twice)
        trainer = getattr(self, "trainer", None)
        replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        order = np.arange(len(dataset))
        return DataLoader(
            dataset,
            batch_size=self.batch_size if train else self.eval_batch_size,
            shuffle=train,
            sampler=None if train else EvalShard(dataset, order, replicas, rank),
            drop_last=False,  # every val/test sample is evaluated
            collate_fn=pad_batch,
            num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(self.seed) if train else None,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader | list:
        self.setup()
        if not len(self.datasets["val"]):
            return []  # data.val_fraction=0 (labelled sequences): every series trains, nothing to validate
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")


class SequenceDataModule(ClassificationData):
    """Labelled sequences, one sample per series (see the module docstring)."""

    def __init__(
        self,
        train=None,
        test=None,
        *,
        name: str = "sequences",
        archive=None,
        series_col: str = "series_id",
        step_col: str = "step",
        label_col: str = "label",
        channel_cols: list[str] | None = None,
        val_fraction: float = 0.2,
        test_fraction: float = 0.2,
        scaler: str = "standard",
        batch_size: int = 32,
        eval_batch_size: int = 256,
        seed: int = 0,
        num_workers: int = 0,
        class_order: list[str] | None = None,
        csv: dict | None = None,
        label_fraction: float = 1.0,
        pretraining: bool = False,
    ):
        super().__init__(
            name, batch_size, eval_batch_size, seed, num_workers, class_order, label_fraction, pretraining
        )
        if archive is not None:  # the archive's layout: <archive>/<name>/<name>_TRAIN.ts, _TEST.ts
            train = archive_ts_file(archive, name, "TRAIN") if train is None else train
            test = archive_ts_file(archive, name, "TEST") if test is None else test
        if train is None:
            raise SettingError(
                "data=sequences: no training series; give data.train=<file> (a long CSV/Parquet table or "
                "an archive .ts file), or data.archive=<folder> data.name=<set> for <folder>/<set>/<set>_TRAIN.ts"
            )
        self.train_source, self.test_source = train, test
        self.series_col, self.step_col, self.label_col = series_col, step_col, label_col
        self.channel_cols = None if channel_cols is None else [str(c) for c in channel_cols]
        self.val_fraction, self.test_fraction = float(val_fraction), float(test_fraction)
        self.scaler_kind = check_scaler(scaler)  # fail now on a typo, not after reading the data
        self.csv = {str(k): v for k, v in (csv or {}).items()}

    @property
    def columns(self) -> SequenceColumns:
        return SequenceColumns(self.series_col, self.step_col, self.label_col, self.channel_names)

    def read(self, source_or_table, source: str) -> dict:
        """The series of a file or table; the first one read (train) fixes the channels when
        `channel_cols` is None: its columns without another role (a .ts file's: ch0, ch1, ...)."""
        if _is_ts(source_or_table):
            return self.read_ts(source_or_table, source)
        table = _table(source_or_table, self.csv)
        if not self.channel_names:
            keys = (self.series_col, self.step_col, self.label_col)
            self.channel_names = self.channel_cols or [str(c) for c in table.columns if c not in keys]
        return read_sequences(table, source, self.columns)

    def read_ts(self, path, source: str) -> dict:
        """The series of an archive `.ts` file (`tsformer.data.ts_format`), as `read` gives a table's:
        series ids 0, 1, ... in file order, channels ch0, ch1, ... (the long-table copies' names)."""
        ts = read_ts(path)
        if ts.labels is None:
            raise DataValidationError(
                f"{source}: @classLabel false: the series have no class labels to learn"
            )
        names = [f"ch{d}" for d in range(ts.n_dims)]
        if not self.channel_names:
            self.channel_names = self.channel_cols or names
        unknown = [c for c in self.channel_names if c not in names]
        if unknown:
            raise DataValidationError(
                f"{source}: channel(s) {unknown} not in the file's {ts.n_dims} dimension(s) {names} "
                "(data.channel_cols)"
            )
        keep = [names.index(c) for c in self.channel_names]
        if ts.class_labels:
            log.info("%s: the header's classes %s", source, ts.class_labels)
        return {
            "ids": np.arange(len(ts.x)).astype(object),
            "x": [x[:, keep] for x in ts.x],
            "labels": ts.labels,
            "steps": ts.steps,
        }

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        source = _source_name(self.train_source, self.name)
        train = self.read(self.train_source, source)
        if self.test_source is not None:
            test_source = _source_name(self.test_source, self.name)
            test = self.read(self.test_source, test_source)
        else:
            held = stratified_part(train["labels"], self.test_fraction, self.seed)
            train, test, test_source = _subset(train, ~held), _subset(train, held), source
        self.classes = ordered_classes(sorted_classes(train["labels"]), self.class_order, source)
        held = stratified_part(train["labels"], self.val_fraction, self.seed + 1)
        parts = {"train": _subset(train, ~held), "val": _subset(train, held), "test": test}
        sources = {"train": source, "val": source, "test": test_source}
        self.channel_scaler = Affine.fit(self.scaler_kind, np.concatenate(parts["train"]["x"]))
        datasets = {}
        for split, part in parts.items():
            if not len(part["ids"]) and not (split == "val" and self.val_fraction == 0):
                raise DataValidationError(
                    f"{sources[split]}: no {split} series; give more series or change data.val_fraction "
                    "/ data.test_fraction"
                )
            codes = class_codes(
                part["labels"], self.classes, sources[split], lambda i, part=part: _series(part, i)
            )
            scaled = [self.channel_scaler.transform(x).astype(np.float32) for x in part["x"]]
            datasets[split] = SampleDataset(scaled, codes)
            self.infos[split] = pd.DataFrame({"series_id": part["ids"]})
        self.datasets = self.keep_labels(datasets, source)  # last: a failed setup leaves it un-set-up
        lengths = [len(x) for x in parts["train"]["x"]]
        log.info(
            "%s: %d classes, %d channels, lengths %d..%d; series train %d, val %d, test %d",
            source, self.n_classes, self.d_in, min(lengths), max(lengths),
            *(len(self.datasets[s]) for s in SPLITS),
        )  # fmt: skip


class StreamDataModule(ClassificationData):
    """A labelled stream: windows of `context_len` steps, each labelled by its last step (module docstring).

    `**window_options` go to `TimeSeriesDataModule` (time_col, series_col, val/test fractions or
    starts, train_stride, eval_stride, freq, time_format, csv, fill, outliers).
    """

    def __init__(
        self,
        source,
        *,
        channel_cols: list[str],
        label_col: str,
        context_len: int,
        name: str = "stream",
        scaler: str = "standard",
        batch_size: int = 64,
        eval_batch_size: int = 256,
        seed: int = 0,
        num_workers: int = 0,
        class_order: list[str] | None = None,
        label_fraction: float = 1.0,
        pretraining: bool = False,
        **window_options,
    ):
        super().__init__(
            name, batch_size, eval_batch_size, seed, num_workers, class_order, label_fraction, pretraining
        )
        self.source, self.label_col = source, str(label_col)
        self.channel_names = [str(c) for c in channel_cols]
        self.context_len = int(context_len)
        self.scaler_kind = scaler
        self.window_options = window_options
        self.windows: TimeSeriesDataModule | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        raw = self.source if isinstance(self.source, pd.DataFrame) else None
        csv = self.window_options.get("csv") or {}
        raw = raw if raw is not None else load_table(self.source, **csv)
        source = _source_name(self.source, self.name)
        if self.label_col not in raw.columns:
            raise DataValidationError(f"{source}: no label column '{self.label_col}' (data.label_col)")
        _refuse_missing(raw[[self.label_col]], source, "a label")
        every_class = sorted_classes(raw[self.label_col])  # codes first; the classes come from train
        self.label_names = every_class  # label of code k (LABEL_CODE in `windows.frame`)
        codes = class_codes(raw[self.label_col], every_class, source, lambda i: f"row {i}")
        windows = _LabelledWindows(  # the label as its code (a number the windows carry), not as text
            raw.drop(columns=[self.label_col]).assign(**{LABEL_CODE: codes.astype(np.float64)}),
            source,
            target_cols=self.channel_names,
            context_len=self.context_len,
            horizon=0,
            name=self.name,
            scaler=self.scaler_kind,
            seed=self.seed,
            extra_cols=[LABEL_CODE],
            **{k: v for k, v in self.window_options.items() if k != "csv"},
        )
        windows.setup()
        row_codes = windows.frame[LABEL_CODE].to_numpy().astype(np.int64)  # (rows,) by table position
        last = {s: windows.datasets[s].starts + self.context_len - 1 for s in SPLITS}  # (W,) last rows
        trained = sorted_classes(np.array(every_class, dtype=object)[np.unique(row_codes[last["train"]])])
        self.classes = ordered_classes(trained, self.class_order, source)
        self.channel_scaler = windows.features.target_scaler
        times = windows.frame[windows.schema.time_col].to_numpy()  # (rows,)
        datasets = {}
        for split in SPLITS:
            labels = np.array(every_class, dtype=object)[row_codes[last[split]]]
            info = windows.window_info(split)
            info = pd.DataFrame({"series_id": info.series_id, "window_end_time": times[last[split]]})

            def where(i, info=info, split=split):
                return f"{split} window ending {info.window_end_time[i]} of series {info.series_id[i]!r}"

            codes = class_codes(labels, self.classes, source, where)
            target = windows.datasets[split].target  # (rows, D) scaled, shared by the splits
            samples = _WindowViews(target.numpy(), windows.datasets[split].starts, self.context_len)
            datasets[split] = SampleDataset(samples, codes)
            self.infos[split] = info
        self.windows = windows
        self.datasets = self.keep_labels(datasets, source)  # last: a failed setup leaves it un-set-up
        log.info(
            "%s: %d classes %s; windows train %d, val %d, test %d",
            source, self.n_classes, self.classes, *(len(self.datasets[s]) for s in SPLITS),
        )  # fmt: skip


class _LabelledWindows(TimeSeriesDataModule):
    """The stream's windows, its table given with the label codes but named as the user's source."""

    def __init__(self, frame: pd.DataFrame, source_name: str, **options):
        super().__init__(frame, **options)
        self._source_name = source_name

    @property
    def source_name(self) -> str:
        return self._source_name


class _WindowViews(Sequence):
    """Window i as a view of rows [starts[i], starts[i] + N) of the shared array: nothing copied."""

    def __init__(self, rows: np.ndarray, starts: np.ndarray, context_len: int):
        self.rows, self.starts, self.context_len = rows, starts, context_len

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> np.ndarray:
        start = int(self.starts[i])
        return self.rows[start : start + self.context_len]  # (N, D)


# -- helpers --------------------------------------------------------------------------------------


def _source_name(source, name: str) -> str:
    return f"{name} (in-memory table)" if isinstance(source, pd.DataFrame) else str(source)


def _is_ts(source) -> bool:
    return not isinstance(source, pd.DataFrame) and str(source).lower().endswith(".ts")


def _table(source, csv: dict) -> pd.DataFrame:
    return source if isinstance(source, pd.DataFrame) else load_table(source, **csv)


def _subset(part: dict, keep: np.ndarray) -> dict:
    return {
        "ids": part["ids"][keep],
        "x": [x for x, k in zip(part["x"], keep, strict=True) if k],
        "labels": part["labels"][keep],
    }


def _series(part: dict, i: int) -> str:
    return f"series {part['ids'][i]!r}"


def _refuse_missing(values: pd.DataFrame, source: str, what: str) -> None:
    """The first empty (or, for numbers, unreadable) cell as a one-line error naming column and row."""
    missing = values.isna()
    if missing.to_numpy().any():
        col = missing.any().idxmax()
        row = int(np.flatnonzero(missing[col].to_numpy())[0])
        raise DataValidationError(
            f"{source}: column '{col}', {describe_row(source, row)}: empty or not {what}; fill it in"
        )


def _one_label(labels: pd.Series, sid, source: str) -> None:
    """A series' rows must share one label: the first change is an error naming the series and rows."""
    text = labels.astype(str).to_numpy()
    changes = np.flatnonzero(text[1:] != text[:-1])
    if len(changes):
        k = changes[0]
        before, after = int(labels.index[k]), int(labels.index[k + 1])
        raise DataValidationError(
            f"{source}: series {plain(sid)!r} changes its label from {text[k]!r} "
            f"({describe_row(source, before)}) to {text[k + 1]!r} ({describe_row(source, after)}); a "
            "sequence has one label: split the series there, or use the labelled-stream layout (data=stream)"
        )
