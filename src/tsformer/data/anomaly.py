"""The data of anomaly detection (`data=plant_anomaly`, `tsformer.jobs.anomaly.job`): a table of channels per
series, the rows before `train_end` assumed normal.

Per series (told apart by a `series_id` column; without one the table is one series):
- the rows before `train_end` (a time, a fraction of each series' rows, or a number of its first rows) are normal: the first
  (1 - `val_fraction`) of them train the model (`train_table`), the rest (`val_table`) are held out:
  the validation loss, each channel's usual error and the alarms' threshold are measured on them
  (`val_blocks` > 1: the held-out share of each of that many blocks, spread over the normal period);
- the rows from `train_end` on are judged (`test_table`); with `judge_context`, the job scores them after
  the series' normal rows (`normal_rows`) as context (`jobs.anomaly.judging.scored_in_context`).
A label column (`label_col`), when the table has one, is checked (0 or 1) and only ever read to
evaluate the judged rows: it is never a model input, nor used for training or the threshold.

Values enter the network standardised by the train rows' mean and sd per channel (`loc`, `scale`),
never per window: a level that drifted away is what a detector must see. A state channel
(`state_channels`: every train value is 0 or 1, a command or a switch) enters as it is: z-scored, a
rare toggle would be a jump of many sd that drowns the measured channels. Known inputs (`known_cols`:
weather, set-points, load) are channels too, after the targets: z-scored, they condition the detector
and are never hidden nor scored (`tasks/anomaly.py`). A constant channel
(`constant_channels`: one value in every train row, whatever it is) is its own kind: it enters the
network at that value (0 once standardised), and the detector scores its departures apart. Windows of `context_len +
horizon` rows (stride 1; the judged rows' windows, which give only the test loss, side by side) never
cross series; the batches are those of the window tasks
(`hist_target`, ..., `window`), without covariates.
"""

from __future__ import annotations

import lightning as L
import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset

from tsformer.data.schema import DataValidationError
from tsformer.data.sources import load_table

SERIES_COL = "series_id"
SEGMENT_COL = "_segment"  # the piece of a series' normal rows a row belongs to (validation blocks)
SPLITS = ("train", "val", "test")
VAL_FRACTION = 0.2  # of each series' normal rows held out when no validation rows are given


def series_rows(table: pd.DataFrame) -> dict:
    """Positions of each series' rows in `table` (one series, key None, without a series_id column); a
    series of normal rows cut into pieces (`SEGMENT_COL`, `split_normal_rows` with blocks) gives one
    entry per piece, keyed (series, piece): windows never cross from one piece to the next."""
    keys = [c for c in (SERIES_COL, SEGMENT_COL) if c in table.columns]
    if not keys:
        return {None: np.arange(len(table))}
    return rows_by_key(table[keys[0]] if len(keys) == 1 else pd.MultiIndex.from_frame(table[keys]))


def rows_by_key(key) -> dict:
    """Positions of the rows of each value of `key` (a column, its array, or an index), in order of
    first appearance; the keys Python values."""
    codes, uniques = pd.factorize(key, sort=False)
    return {sid: np.flatnonzero(codes == i) for i, sid in enumerate(uniques.tolist())}


def check_table(table: pd.DataFrame, channels: list[str], min_rows: int, what: str = "table") -> None:
    """One `DataValidationError` line for what makes `table` unusable: a missing channel column, an
    empty or non-numeric cell (its column and row), a series shorter than one window."""
    missing = [c for c in channels if c not in table.columns]
    if missing:
        raise DataValidationError(f"{what}: column {missing[0]!r} is missing (channels: {channels})")
    for c in channels:
        values = pd.to_numeric(table[c], errors="coerce")
        bad = values.isna() | ~np.isfinite(values.to_numpy(dtype=float, na_value=np.nan))
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            value = table[c].iloc[row]
            shown = "empty" if pd.isna(value) else f"{value!s} is not a number"
            raise DataValidationError(f"{what}: column {c!r}, row {row} (counted from 0): {shown}")
    for sid, rows in series_rows(table).items():
        if len(rows) < min_rows:
            name = f"series {sid!r}" if sid is not None else "the table"
            raise DataValidationError(
                f"{what}: {name} has {len(rows)} rows, fewer than one window of {min_rows} "
                "(model.context_len + model.horizon)"
            )


def check_labels(table: pd.DataFrame, label_col: str | None) -> None:
    """Labels, when the table has them, are 0 or 1: one line naming the column and row otherwise."""
    if label_col is None or label_col not in table.columns:
        return
    values = pd.to_numeric(table[label_col], errors="coerce")
    bad = ~values.isin([0, 1])
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataValidationError(
            f"column {label_col!r} (data.label_col), row {row} (counted from 0): {table[label_col].iloc[row]!s}; "
            "labels must be 0 (normal) or 1 (anomalous)"
        )


def constant_channels(values: np.ndarray) -> np.ndarray:
    """`(C,)` bool: the channels of `values` `(T, C)` (train rows) that hold one value in every row: not
    a measurement (no spread to scale by) nor a state (no switching seen), their own kind: any
    departure from that value is the anomaly."""
    values = np.asarray(values, dtype=float)
    return (values == values[:1]).all(axis=0) if len(values) else np.zeros(values.shape[1], dtype=bool)


def state_channels(values: np.ndarray) -> np.ndarray:
    """`(C,)` bool: the channels of `values` `(T, C)` (train rows) whose every value is 0 or 1 and that
    take both: states (a command, a switch, a valve open or shut), not measurements. A channel at one
    value throughout (0 or 1 included) is a constant (`constant_channels`)."""
    values = np.asarray(values, dtype=float)
    return ((values == 0.0) | (values == 1.0)).all(axis=0) & ~constant_channels(values)


def split_at(table: pd.DataFrame, train_end, time_col: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(normal rows, judged rows): before `train_end` (a time, a fraction of each series' rows, or a
    whole number of each series' first rows)."""
    if isinstance(train_end, float) and 0.0 < train_end < 1.0:
        before = np.zeros(len(table), dtype=bool)
        for rows in series_rows(table).values():
            before[rows[: round(train_end * len(rows))]] = True
    elif isinstance(train_end, int | np.integer) and not isinstance(train_end, bool):
        before = np.zeros(len(table), dtype=bool)
        for rows in series_rows(table).values():
            before[rows[: int(train_end)]] = True
    else:
        if time_col not in table.columns:
            raise DataValidationError(
                f"data.train_end={train_end!r} is a time, but there is no column {time_col!r}"
            )
        before = (pd.to_datetime(table[time_col]) < pd.Timestamp(train_end)).to_numpy()
    if not before.any() or before.all():
        raise DataValidationError(f"data.train_end={train_end!r} leaves no rows to train on or none to judge")
    return table[before], table[~before]


def split_normal_rows(
    train: pd.DataFrame, fraction: float = VAL_FRACTION, blocks: int = 1
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each series' rows cut into `blocks` equal blocks; the first (1 - fraction) of each block to train
    on, the rest held out (one block: the last share of the series). With several blocks the held-out
    rows are spread over the normal period, and each piece is marked (`SEGMENT_COL`) so that no window
    crosses from one piece to another."""
    keep, held = [], []
    for rows in series_rows(train).values():
        for block in np.array_split(rows, blocks):
            cut = len(block) - max(1, round(fraction * len(block)))
            keep.append(block[:cut])
            held.append(block[cut:])
    if blocks == 1:
        return train.iloc[np.concatenate(keep)], train.iloc[np.concatenate(held)]
    pieces = [train.iloc[part].assign(**{SEGMENT_COL: i}) for i, part in enumerate(keep + held)]
    return pd.concat(pieces[: len(keep)]), pd.concat(pieces[len(keep) :])


class AnomalyWindows(Dataset):
    """The windows of `length` = N + M rows of each series, every `stride` rows (1: every window), as a
    window task's batch item: `hist_target (N, C)`, `fut_target (M, C)` (M = 0: the window is the
    target), no covariates."""

    def __init__(self, series: list[np.ndarray], context_len: int, horizon: int, stride: int = 1):
        self.values = torch.from_numpy(np.concatenate(series).astype(np.float32))  # (rows, C)
        self.context_len, self.horizon = context_len, horizon
        length, offset, starts = context_len + horizon, 0, []
        for values in series:
            starts.append(offset + np.arange(0, max(0, len(values) - length + 1), stride))
            offset += len(values)
        self.starts = np.concatenate(starts)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict:
        a, N, M = int(self.starts[i]), self.context_len, self.horizon
        window = self.values[a : a + N + M]  # (N + M, C)
        empty = window[:, :0]
        return {
            "hist_target": window[:N], "fut_target": window[N:], "hist_known": empty[:N], "fut_known": empty[N:],
            "hist_observed": empty[:N], "fut_observed": empty[N:], "window": i,
        }  # fmt: skip


class AnomalyData(L.LightningDataModule):
    """The normal rows' windows to train and validate on, and the rows to judge (module docstring)."""

    def __init__(
        self,
        source,
        *,
        target_cols: list[str],
        known_cols: list[str] | None = None,
        context_len: int,
        horizon: int = 0,
        name: str = "data",
        time_col: str = "time",
        label_col: str | None = None,
        train_end=0.7,
        val_fraction: float = VAL_FRACTION,
        val_blocks: int = 1,
        batch_size: int = 64,
        eval_batch_size: int = 256,
        num_workers: int = 0,
        seed: int = 0,
        csv: dict | None = None,
        judge_context: bool = False,
    ):
        super().__init__()
        if not 0.0 < float(val_fraction) < 1.0:
            raise ValueError(f"val_fraction={val_fraction}: a share of the normal rows, between 0 and 1")
        if int(val_blocks) < 1:
            raise ValueError(f"val_blocks={val_blocks}: at least 1 (1: the last share of each series)")
        self.val_blocks = int(val_blocks)
        self.source, self.name = source, name
        known = [str(c) for c in (known_cols or [])]
        both = sorted(set(known) & {str(c) for c in target_cols})
        if both:
            raise ValueError(
                f"data.known_cols: {both} are in data.target_cols too; a column is one or the other"
            )
        self.channels = [str(c) for c in target_cols] + known  # the known inputs last
        self.known_names = known
        self.context_len, self.horizon = int(context_len), int(horizon)
        self.time_col, self.label_col = time_col, label_col
        self.train_end, self.val_fraction = train_end, float(val_fraction)
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.num_workers, self.seed = int(num_workers), int(seed)
        self.csv = {
            str(k): v for k, v in (csv or {}).items()
        }  # a CSV source's read options, kept for predict.py
        self.tables: dict[str, pd.DataFrame] = {}
        self.normal_rows: pd.DataFrame | None = None
        self.judge_context = bool(judge_context)
        self.datasets: dict[str, AnomalyWindows] = {}

    @property
    def window(self) -> int:
        return self.context_len + self.horizon

    @property
    def state_names(self) -> list[str]:
        """The channels read as states (`state_channels`) from the train rows."""
        return [c for c, state in zip(self.channels, self.states, strict=True) if state]

    @property
    def constant_names(self) -> list[str]:
        """The channels constant in the train rows (`constant_channels`)."""
        return [c for c, constant in zip(self.channels, self.constants, strict=True) if constant]

    def setup(self, stage: str | None = None) -> None:
        """Read, check and split the table, standardise, window. Idempotent."""
        if self.datasets:
            return
        table = self.source if isinstance(self.source, pd.DataFrame) else load_table(self.source, **self.csv)
        check_labels(table, self.label_col)
        normal, judged = split_at(table, self.train_end, self.time_col)
        self.normal_rows = normal  # every normal row in its order (`model.threshold_rows=normal`)
        self.set_tables(*split_normal_rows(normal, self.val_fraction, self.val_blocks), judged)

    def set_tables(self, train: pd.DataFrame, val: pd.DataFrame, test: pd.DataFrame) -> None:
        check_table(train, self.channels, self.window, "train rows")
        check_table(val, self.channels, self.window, "validation rows")
        check_table(test, self.channels, self.window, "judged rows")
        values = train[self.channels].to_numpy(dtype=float)
        known = np.isin(self.channels, self.known_names)  # (C,): conditions, z-scored whatever they hold
        self.states = state_channels(values) & ~known  # (C,) bool: entered as they are
        self.constants = (
            constant_channels(values) & ~known
        )  # (C,) bool: entered at their value, 0 standardised
        self.loc = np.where(self.states, 0.0, values.mean(axis=0))  # (C,): a constant's value
        sd = values.std(axis=0)
        self.scale = np.where((sd > 1e-8) & ~self.states, sd, 1.0)  # a constant channel: 1
        self.tables = dict(zip(SPLITS, (train, val, test), strict=True))
        # the judged rows' windows only give the test loss (they are scored by the detector, `score`):
        # side by side, not every one of them (a fraction of scoring's passes, not its equal)
        strides = {"train": 1, "val": 1, "test": self.window}
        self.datasets = {
            split: AnomalyWindows(self.standardised(table), self.context_len, self.horizon, strides[split])
            for split, table in self.tables.items()
        }

    def standardised(self, table: pd.DataFrame) -> list[np.ndarray]:
        """Each series' values `(T_s, C)` standardised by the train rows' mean and sd (a constant
        channel at its train value: 0)."""
        values = (table[self.channels].to_numpy(dtype=float) - self.loc) / self.scale
        values[:, self.constants] = 0.0
        return [values[rows] for rows in series_rows(table).values()]

    def n_windows(self, split: str) -> int:
        return len(self.datasets[split])

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        return DataLoader(
            self.datasets[split],
            batch_size=self.batch_size if shuffle else self.eval_batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(self.seed) if shuffle else None,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
