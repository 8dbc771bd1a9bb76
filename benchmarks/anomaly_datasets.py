"""Labelled anomaly benchmarks as each one's own protocol reads them (see ../shared/data/anomaly/SOURCE.md).

A `LabelledRun` is one series: its channels (every row of the file), its 0/1 labels, the rows a method
may train on (`[0, train_end)`, assumed normal, labels unused) and the rows that are scored and
evaluated (`[score_start, T)`).
- MSL-14 and the NAB series (TSB-AD's files, `Label` column): `tr_<n>` in the file name is the train
  prefix; every row is scored, the train prefix included (TSB-AD's protocol).
- SKAB (`;`-separated, `datetime` and 8 sensors, labels `anomaly`; `changepoint` is not used): the
  first 400 rows of each run train, the rest are scored (SKAB's protocol). `skab_anomaly_free` reads
  the separate normal run, which a benchmark may add to the train rows (and must say so).
- UCR InternalBleeding16 (aeon's copy, `value`, `is_anomaly`): the TRAIN file is the train prefix of
  the TEST file, which is the whole series, every row scored.
The files are read where they are (never copied); a bad file is a `DataValidationError` naming the
file, column and row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tsformer.data.schema import DataValidationError, describe_row, plain

TSB_NAME = re.compile(r"_tr_(\d+)_1st_(\d+)")
SKAB_TRAIN_ROWS = 400
SKAB_FOLDERS = ("valve1", "valve2", "other")
SKAB_CHANNELS = [
    "Accelerometer1RMS",
    "Accelerometer2RMS",
    "Current",
    "Pressure",
    "Temperature",
    "Thermocouple",
    "Voltage",
    "Volume Flow RateRMS",
]


@dataclass(frozen=True)
class LabelledRun:
    name: str
    table: pd.DataFrame  # (T, C): the channels, every row of the file
    label: np.ndarray  # (T,) 0/1
    train_end: int  # rows [0, train_end) train
    score_start: int  # rows [score_start, T) are scored

    @property
    def channels(self) -> list[str]:
        return list(self.table.columns)

    @property
    def train(self) -> pd.DataFrame:
        return self.table.iloc[: self.train_end]

    @property
    def scored(self) -> pd.DataFrame:
        return self.table.iloc[self.score_start :]

    @property
    def scored_label(self) -> np.ndarray:
        return self.label[self.score_start :]


def _checked(path: Path, frame: pd.DataFrame, channels: list[str], label_col: str) -> tuple:
    """The channels as floats and the labels as 0/1 ints, or an error naming file, column and row."""
    missing = [c for c in [*channels, label_col] if c not in frame.columns]
    if missing:
        raise DataValidationError(f"error: {path}: no column {missing[0]!r} (columns: {list(frame.columns)})")
    values = frame[channels].apply(pd.to_numeric, errors="coerce").astype(float)
    bad = np.argwhere(~np.isfinite(values.to_numpy()))
    if len(bad):
        row, col = bad[0]
        raise DataValidationError(
            f"error: {path}: column {channels[col]!r}, {describe_row(str(path), row)}: "
            f"{plain(frame[channels[col]].iloc[row])!r} is not a finite number"
        )
    label = frame[label_col].to_numpy()
    bad = np.flatnonzero(~np.isin(label, (0, 1)))
    if len(bad):
        raise DataValidationError(
            f"error: {path}: column {label_col!r}, {describe_row(str(path), bad[0])}: "
            f"label {plain(label[bad[0]])!r} is not 0 or 1"
        )
    return values.reset_index(drop=True), label.astype(int)


def _run(name: str, path: Path, frame, channels, label_col, train_end, score_start) -> LabelledRun:
    table, label = _checked(path, frame, channels, label_col)
    if not 0 < train_end <= len(table) or not 0 <= score_start < len(table):
        raise DataValidationError(
            f"error: {path}: {len(table)} rows cannot hold train rows [0, {train_end}) "
            f"and scored rows from {score_start}"
        )
    return LabelledRun(name, table, label, train_end, score_start)


def tsb_ad_file(path: str | Path) -> LabelledRun:
    """One TSB-AD file (`..._tr_<n>_1st_<m>.csv`, channels then `Label`): train on the first n rows,
    score every row."""
    path = Path(path)
    match = TSB_NAME.search(path.name)
    if match is None:
        raise DataValidationError(f"error: {path}: the name has no TSB-AD train length `_tr_<n>_1st_<m>`")
    frame = pd.read_csv(path)
    channels = [c for c in frame.columns if c != "Label"]
    return _run(path.stem, path, frame, channels, "Label", int(match.group(1)), 0)


def _files(folder: Path, pattern: str) -> list[Path]:
    files = sorted(folder.glob(pattern))
    if not files:
        raise DataValidationError(f"error: no {pattern} files in {folder}")
    return files


def msl(root: str | Path) -> list[LabelledRun]:
    """The 14 MSL files of TSB-AD-M in `root`/MSL, in file-name order."""
    return [tsb_ad_file(p) for p in _files(Path(root) / "MSL", "*_MSL_*_tr_*.csv")]


def skab_file(path: str | Path, name: str | None = None) -> LabelledRun:
    """One SKAB run: the 8 sensors, `anomaly` labels; the first 400 rows train, the rest are scored."""
    path = Path(path)
    frame = pd.read_csv(path, sep=";")
    return _run(name or path.stem, path, frame, SKAB_CHANNELS, "anomaly", SKAB_TRAIN_ROWS, SKAB_TRAIN_ROWS)


def skab(root: str | Path) -> list[LabelledRun]:
    """The 34 SKAB runs of `root`/SKAB (valve1, valve2, other; in numeric order within each)."""
    root = Path(root) / "SKAB"
    runs = []
    for folder in SKAB_FOLDERS:
        files = sorted(
            _files(root / folder, "*.csv"), key=lambda p: int(p.stem) if p.stem.isdigit() else p.stem
        )
        runs += [skab_file(p, f"{folder}/{p.stem}") for p in files]
    return runs


def skab_anomaly_free(root: str | Path) -> pd.DataFrame:
    """SKAB's separate normal run (9,405 rows of the 8 sensors), extra normal training rows."""
    path = Path(root) / "SKAB" / "anomaly-free" / "anomaly-free.csv"
    frame = pd.read_csv(path, sep=";")
    frame["anomaly"] = 0  # a normal run: no label column in the file
    table, _ = _checked(path, frame, SKAB_CHANNELS, "anomaly")
    return table


def ucr_file(test: str | Path, train: str | Path) -> LabelledRun:
    """A UCR anomaly-archive series as aeon ships it: TEST is the whole series, TRAIN its train prefix."""
    test, train = Path(test), Path(train)
    whole, prefix = pd.read_csv(test), pd.read_csv(train)
    run = _run(test.stem.removesuffix("_TEST"), test, whole, ["value"], "is_anomaly", len(prefix), 0)
    if not np.array_equal(prefix["value"].to_numpy(float), run.table["value"].to_numpy()[: len(prefix)]):
        raise DataValidationError(
            f"error: {train}: its values are not the first {len(prefix)} rows of {test}"
        )
    return run


def univariate(root: str | Path) -> list[LabelledRun]:
    """The two single-sensor quick checks in `root`/univariate: TSB-AD-U's NAB file and UCR 135."""
    folder = Path(root) / "univariate"
    nab = [tsb_ad_file(p) for p in _files(folder, "*_NAB_*_tr_*.csv")]
    ucr = [
        ucr_file(p, p.with_name(p.name.replace("_TEST", "_TRAIN")))
        for p in _files(folder, "*_UCR_*_TEST.csv")
    ]
    return nab + ucr


def msl_tuning(root: str | Path) -> list[LabelledRun]:
    """TSB-AD's 2 MSL tuning files in `root`/MSL_tuning (disjoint from the 14): settings are chosen here."""
    return [tsb_ad_file(p) for p in _files(Path(root) / "MSL_tuning", "*_MSL_*_tr_*.csv")]


def pool(root: str | Path) -> list[LabelledRun]:
    """The tuning pool in `root`/pool (SOURCE.md there): 6 MSL channels in no evaluation file, TSB-AD-M's
    Genesis and Daphnet files, in TSB-AD's layout (train on the `tr_<n>` prefix, score every row)."""
    return [tsb_ad_file(p) for p in _files(Path(root) / "pool", "*_tr_*_1st_*.csv")]


TUNING_FAULTS = {"spike": 3, "stuck": 300, "drift": 400, "relation": 300}  # the plant's faults, their lengths
SKAB_TUNING_RUNS = 8


def skab_tuning(root: str | Path, seed: int = 0) -> list[LabelledRun]:
    """SKAB's anomaly-free run cut into 8 runs of SKAB's shape (the first 400 rows train, the rest scored),
    each with one of the plant's faults (`data.plant_anomaly.inject_fault`, in turn spike, stuck, drift,
    changed relation: the sensor's rise over its train mean cut to a quarter) on a sensor drawn at random,
    at a random row of its scored part: SKAB's settings are chosen here, never on its 34 labelled runs."""
    from tsformer.data.plant_anomaly import inject_fault

    free = skab_anomaly_free(root)
    rng = np.random.default_rng(seed)
    length = len(free) // SKAB_TUNING_RUNS
    runs = []
    for i in range(SKAB_TUNING_RUNS):
        table = free.iloc[i * length : (i + 1) * length].reset_index(drop=True)
        fault = list(TUNING_FAULTS)[i % len(TUNING_FAULTS)]
        n = TUNING_FAULTS[fault]
        channel = SKAB_CHANNELS[int(rng.integers(len(SKAB_CHANNELS)))]
        start = SKAB_TRAIN_ROWS + int(rng.integers(50, length - SKAB_TRAIN_ROWS - n - 50))
        hit = np.arange(start, start + n)
        train = table[channel].to_numpy()[:SKAB_TRAIN_ROWS]
        reference = np.full(length, train.mean())
        table[channel] = inject_fault(table[channel].to_numpy(), hit, fault, train.std(), reference)
        label = np.zeros(length, dtype=int)
        label[hit] = 1
        runs.append(LabelledRun(f"free{i}-{fault}-{channel}", table, label, SKAB_TRAIN_ROWS, SKAB_TRAIN_ROWS))
    return runs


DATASETS = {"msl": msl, "skab": skab, "univariate": univariate}
TUNING = {"msl_tuning": msl_tuning, "pool": pool, "skab_tuning": skab_tuning}  # where settings are chosen
