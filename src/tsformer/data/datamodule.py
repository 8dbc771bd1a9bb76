"""One LightningDataModule for any tabular time series: table -> checks -> split -> scalers -> windows.

Data flow in `setup`:
1. read the source (CSV/Parquet path, or a DataFrame such as the simulated plant) and validate it
   (`csv`: options for pandas' CSV reader, `time_format`: how text times are written);
2. split chronologically on the shared time axis: cut-off timestamps `val_start` and `test_start`
   (explicit, or from the fractions of distinct timestamps), the same calendar time for every series;
   with `train_start`, the rows before it are in no split (a refit on the newest rows): windows may
   read them as history, nothing else does;
3. look for absurd values in the train rows (`outliers.py`; `outliers`: warn | error | ignore), then
   fit the feature pipeline on the train rows only (`features.py`: scalers for targets, for known +
   observed covariates and for static numbers; the calendar channels, already in [-1, 1], stay
   unscaled; static category codes), transform all rows once;
4. cut windows by index. A window belongs to the split that holds ALL its target steps (forecast:
   the M future steps; reconstruction: the N window steps). A val/test forecast window's history
   may reach back into earlier splits, as in the usual ETT protocol: the past is known at forecast
   time. Windows never span a gap (see `schema.find_segments`).
5. optionally (`future_known_noise`, e.g. `forecast_noise.ForecastNoise`) the FUTURE known
   covariates of every window, in all three splits, become an imperfect forecast: the model learns
   with the forecast it will really get, and the baselines see the same batch.

The train loader shuffles in an order drawn from (seed, epoch) (`EpochShuffle`: a resumed run sees the
same orders). Validation and test loaders neither shuffle nor drop the last batch: every window is
evaluated once, in order of origin time with all series together (`eval_order`). Under DDP (several
processes) each process takes its share of that order (`EpochShuffle`, `EvalShard`): a step of P
processes with batch b / P sees the windows that one process with batch b sees, and each val/test
window is evaluated by exactly one process.
"""

from __future__ import annotations

import logging
from functools import partial

import lightning as L
import numpy as np
import pandas as pd
import torch
from pandas.tseries.frequencies import to_offset
from torch.utils.data import DataLoader, DistributedSampler

from tsformer.data.calendar import calendar_feature_names
from tsformer.data.features import FeaturePipeline, check_scaler
from tsformer.data.gaps import FILL_METHODS, fill_gaps
from tsformer.data.outliers import check_outliers, outlier_mode
from tsformer.data.schema import (
    DataValidationError,
    SeriesSchema,
    describe_row,
    find_segments,
    fixed_step,
    plain,
    resolve_freq,
    series_ids,
)
from tsformer.data.sources import load_table
from tsformer.data.windows import WindowDataset, target_span, window_starts

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


def _step_name(step: np.timedelta64) -> str:
    """A step as a pandas frequency alias: '10min', 'h'."""
    return to_offset(pd.Timedelta(step)).freqstr


class EpochShuffle(DistributedSampler):
    """The train windows in an order drawn from (seed, epoch) only, a new one each epoch.

    Lightning calls `set_epoch` before every epoch, so a run resumed at epoch k sees the same orders
    as one that never stopped (a generator seeded once would start over).

    Under DDP, process `rank` of `num_replicas` takes every num_replicas-th window of that order
    (padded at its end with its first windows, as Lightning's own DistributedSampler pads, so that
    every process has as many batches): the batches of one step, all processes together, are the
    batch one process with num_replicas times the batch size would see. A `DistributedSampler`, so
    Lightning keeps it instead of swapping in its own (whose order would differ from one process's).
    """

    def __init__(self, data_source, seed: int, num_replicas: int = 1, rank: int = 0):
        super().__init__(data_source, num_replicas=num_replicas, rank=rank, shuffle=True, seed=int(seed))

    def __iter__(self):
        n = len(self.dataset)
        order = np.random.default_rng([self.seed, self.epoch]).permutation(n)  # (n,)
        order = np.resize(order, self.total_size)  # padded by repeating from the start
        return iter(order[self.rank :: self.num_replicas].tolist())


class EvalShard(DistributedSampler):
    """Validation/test windows in a given order (`order`: window indices); under DDP process `rank`
    takes the windows at places rank, rank + P, ... of that order.

    Unlike Lightning's DistributedSampler (which repeats windows so that every process has as many),
    each window is evaluated by exactly one process; the metrics (torchmetrics) are summed over the
    processes, so every window counts once. Processes may then run one batch more or less than each
    other, which is safe here: validation has no per-batch collective, only the metrics' sync at the
    end of the epoch.
    """

    def __init__(self, dataset, order: np.ndarray, num_replicas: int = 1, rank: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        self.order = np.asarray(order)[rank::num_replicas]
        self.total_size = len(dataset)
        self.num_samples = len(self.order)

    def __iter__(self):
        return iter(self.order.tolist())


class TimeSeriesDataModule(L.LightningDataModule):
    """Windows of a tabular time series for the three model families (see the module docstring).

    `horizon` = 0 gives reconstruction windows (the N steps are the target), `horizon` > 0 forecast
    windows (N history steps, M future steps).
    """

    def __init__(
        self,
        source,
        *,
        target_cols: list[str],
        context_len: int,
        horizon: int,
        name: str = "data",
        time_col: str = "time",
        known_cols: list[str] = (),
        observed_cols: list[str] = (),
        series_col: str | None = None,
        freq: str | None = None,
        calendar_features: list[str] = (),
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        val_start=None,
        test_start=None,
        train_start=None,
        scaler: str = "standard",
        batch_size: int = 64,
        eval_batch_size: int = 256,
        train_stride: int = 1,
        eval_stride: int = 1,
        num_workers: int = 0,
        seed: int = 0,
        future_known_noise=None,
        extra_cols: list[str] = (),
        static_cols: list[str] = (),
        static_categorical_cols: list[str] = (),
        fill: str | None = None,
        max_fill_steps: int = 3,
        outliers: str = "warn",
        time_format: str | None = None,
        csv: dict | None = None,
        allow_empty_targets: bool = False,
        units: dict | None = None,
    ):
        super().__init__()
        self.source = source
        self.name = name
        self.schema = SeriesSchema(
            time_col=time_col,
            target_cols=target_cols,
            known_cols=known_cols,
            observed_cols=observed_cols,
            series_col=series_col,
            freq=freq,
            static_cols=static_cols,
            static_categorical_cols=static_categorical_cols,
            time_format=time_format,
        )
        # pandas.read_csv options for a CSV source (sep, decimal, encoding): kept for prediction too
        self.csv = {str(k): v for k, v in (csv or {}).items()}
        # missing values of the target columns, for a model that learns around them (masked fill-in)
        self.allow_empty_targets = bool(allow_empty_targets)
        self.time_format_used = time_format  # given, else the one `setup` infers
        self.calendar = [str(f) for f in calendar_features]
        self.context_len, self.horizon = int(context_len), int(horizon)
        if self.context_len < 1 or self.horizon < 0:
            raise ValueError(f"need context_len >= 1 and horizon >= 0, got {context_len} and {horizon}")
        self.val_fraction, self.test_fraction = float(val_fraction), float(test_fraction)
        self.val_start, self.test_start, self.train_start = val_start, test_start, train_start
        self.scaler_kind = check_scaler(scaler)  # fail now on a typo, not after reading the data
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.train_stride, self.eval_stride = int(train_stride), int(eval_stride)
        self.num_workers, self.seed = int(num_workers), int(seed)
        self.future_known_noise = future_known_noise  # None: the future known covariates as measured
        if fill is not None and fill not in FILL_METHODS:
            raise ValueError(
                f"unknown fill {fill!r}; choose one of {FILL_METHODS} or null (gaps split series)"
            )
        self.fill, self.max_fill_steps = fill, int(max_fill_steps)
        self.outliers = outlier_mode(outliers)  # fail now on a typo, not after reading the data
        # carried along in `frame` for baselines (e.g. a manufacturer's power curve): never scaled,
        # never windowed, never a model input
        self.extra_cols = [extra_cols] if isinstance(extra_cols, str) else [str(c) for c in extra_cols]
        overlap = sorted(set(self.extra_cols) & {self.schema.time_col, *self.schema.value_cols})
        if overlap:
            raise ValueError(f"extra_cols {overlap} already have a role in the model's columns")
        # a column's unit for the figures' axes ("kW", "°C"); a column without one: "original units"
        self.units = {str(k): str(v) for k, v in (units or {}).items() if v is not None}
        if unknown := sorted(set(self.units) - set(self.schema.value_cols)):
            raise ValueError(
                f"data.units names {unknown}, not columns of the model (its columns: {self.schema.value_cols})"
            )

        self.features: FeaturePipeline | None = None  # fitted on the train rows by setup()
        self.kept_features: FeaturePipeline | None = None  # a refit's: its model's own (keep_features)
        self.frame: pd.DataFrame | None = None  # validated table + extra_cols, sorted by (series, time)
        self.datasets: dict[str, WindowDataset] = {}
        self._freq = None

    # -- names and sizes (available before setup) ---------------------------------------------------

    @property
    def target_names(self) -> list[str]:
        return list(self.schema.target_cols)

    @property
    def known_names(self) -> list[str]:
        """Known-future channels: known_cols, then the calendar sin/cos columns."""
        return [*self.schema.known_cols, *calendar_feature_names(self.calendar)]

    @property
    def observed_names(self) -> list[str]:
        return list(self.schema.observed_cols)

    @property
    def d_target(self) -> int:
        return len(self.target_names)

    @property
    def d_known(self) -> int:
        return len(self.known_names)

    @property
    def d_observed(self) -> int:
        return len(self.observed_names)

    @property
    def d_static_num(self) -> int:
        return len(self.schema.static_cols)

    @property
    def static_vocab_sizes(self) -> list[int]:
        """Embedding table sizes of the static categorical columns: categories + 1 (unseen)."""
        self.setup()
        return self.features.static_vocab_sizes

    @property
    def freq(self) -> pd.DateOffset:
        """Sampling frequency as a pandas offset (inferred at setup when not given)."""
        if self._freq is None:
            if self.schema.freq is None:
                raise RuntimeError("freq is inferred from the data: call setup() first")
            return to_offset(self.schema.freq)
        return self._freq

    @property
    def source_name(self) -> str:
        """How error messages refer to the data: the file path, or the data set name for a DataFrame."""
        if isinstance(self.source, pd.DataFrame):
            return f"{self.name} (in-memory table)"
        return str(self.source)

    # -- setup -----------------------------------------------------------------------------------

    def keep_features(self, features: FeaturePipeline) -> None:
        """Scale with a saved model's fitted pipeline instead of fitting one on the train rows: a refit
        (`init_from` of the same task) keeps the scalers its weights were trained with, and a few weeks
        of newer rows would give other ones. Its columns must be this data's, in their roles."""
        if self.datasets:
            raise RuntimeError("keep_features must come before setup()")
        theirs = features.pipeline_fields()
        differ = [
            f"data.{k}={v} here, {theirs[k]} in the model"
            for k, v in self._column_roles().items()
            if theirs[k] != v
        ]
        if differ:
            raise ValueError(f"the model's columns are not this data's: {'; '.join(differ)}")
        self.kept_features = FeaturePipeline(**theirs)

    def _column_roles(self) -> dict[str, list[str]]:
        """The feature pipeline's columns by role, as it is fitted with them (and a kept one must have)."""
        schema = self.schema
        return {
            "target_cols": list(schema.target_cols),
            "known_cols": list(schema.known_cols),
            "observed_cols": list(schema.observed_cols),
            "calendar": list(self.calendar),
            "static_cols": list(schema.static_cols),
            "static_categorical_cols": list(schema.static_categorical_cols),
        }

    def setup(self, stage: str | None = None) -> None:
        """Validate, split, fit the feature pipeline on train rows (or keep a refit's: `keep_features`),
        build the three window datasets. Idempotent."""
        if self.datasets:
            return
        source = self.source_name
        raw = self.source if isinstance(self.source, pd.DataFrame) else load_table(self.source, **self.csv)
        may_be_empty = self.schema.target_cols if self.allow_empty_targets else ()
        clean = self.schema.validate(raw, source, may_be_empty=may_be_empty, extra_cols=self.extra_cols)
        self.time_format_used = self.schema.time_format_of(raw, source)  # kept in the model folder
        if self.extra_cols:
            clean[self.extra_cols] = clean[self.extra_cols].apply(pd.to_numeric, errors="coerce")
        self._freq = resolve_freq(clean, self.schema, source)
        step = fixed_step(self._freq, source)
        filled = np.zeros(len(clean), dtype=bool)
        if self.fill is not None:
            clean, filled = fill_gaps(
                clean,
                self.schema.time_col,
                self.schema.series_col,
                step,
                self.fill,
                self.max_fill_steps,
                source,
            )
        segments = find_segments(clean, self.schema, step, source)

        times = clean[self.schema.time_col].to_numpy()  # (rows,) datetime64[ns]
        cutoffs = self._cutoffs(times, step)
        split_of_row = np.searchsorted(cutoffs[1:3], times, side="right")  # 0 train, 1 val, 2 test
        split_of_row[times < cutoffs[0]] = -1  # before train_start: history of windows only
        rows_per_split = {s: int((split_of_row == i).sum()) for i, s in enumerate(SPLITS)}
        if rows_per_split["train"] == 0:
            raise DataValidationError(
                f"{source}: the train split is empty (no {self.schema.time_col} from "
                f"{pd.Timestamp(cutoffs[0])} to before val_start={pd.Timestamp(cutoffs[1])}); move "
                "val_start (or train_start) or lower the fractions"
            )

        profiled = [*self.schema.value_cols, *self.schema.static_cols]  # the columns the scalers see
        check_outliers(clean[(split_of_row == 0) & ~filled], profiled, source, self.outliers)
        schema = self.schema
        features = self.kept_features or FeaturePipeline.fit(
            clean,
            split_of_row == 0,
            scaler=self.scaler_kind,
            time_col=schema.time_col,
            **self._column_roles(),
        )
        arrays = features.transform(clean)
        if self.future_known_noise is not None:
            self.future_known_noise.bind(schema.known_cols, features.covariate_scaler)
        self.frame = clean
        self._times = times
        self._series = series_ids(clean, self.schema)
        series_codes = np.unique(self._series, return_inverse=True)[1]  # (rows,) 0.. per series

        datasets = {}
        for i, split in enumerate(SPLITS):
            stride = self.train_stride if split == "train" else self.eval_stride
            starts = self._split_window_starts(segments, times, cutoffs[i], cutoffs[i + 1], stride)
            if len(starts) == 0:
                raise self._no_window_error(source, split, split_of_row == i, clean)
            noise = self.future_known_noise  # each split's windows get their own forecast errors
            transform = partial(noise, split=i) if noise is not None else None
            datasets[split] = WindowDataset(
                arrays.target,
                arrays.known,
                arrays.observed,
                starts,
                self.context_len,
                self.horizon,
                fut_known_transform=transform,
                static_num=arrays.static_num,
                static_cat=arrays.static_cat,
                valid=~filled,
                series=series_codes,
            )
        self.features = features
        self.datasets = datasets  # assigned last: a failed setup leaves the module un-set-up

        log.info(
            "%s: %d series, freq %s, cut-offs val_start=%s test_start=%s",
            source,
            len(np.unique(self._series)),
            self._freq.freqstr,
            pd.Timestamp(cutoffs[1]),
            pd.Timestamp(cutoffs[2]),
        )
        for split in SPLITS:
            log.info(
                "%s: %-5s %8d rows %8d windows", source, split, rows_per_split[split], self.n_windows(split)
            )

    def _split_window_starts(self, segments, times, cut_lo, cut_hi, stride) -> np.ndarray:
        """Start rows of the windows whose targets lie in [cut_lo, cut_hi), segment after segment."""
        starts = []
        for seg in segments.itertuples():
            # rows of this segment inside the split (times are sorted within a segment)
            split_rows = seg.start + np.searchsorted(times[seg.start : seg.stop], [cut_lo, cut_hi])
            starts.append(
                window_starts(
                    (seg.start, seg.stop), tuple(split_rows), self.context_len, self.horizon, stride
                )
            )
        return np.concatenate(starts)

    def _cutoffs(self, times: np.ndarray, step: pd.Timedelta) -> np.ndarray:
        """[first time or train_start, val_start, test_start, after the last time] as datetime64[ns].

        Split k holds the times in [cutoffs[k], cutoffs[k + 1]); explicit timestamps win over fractions.
        """
        distinct = np.unique(times)
        after_end = distinct[-1] + step.to_timedelta64()

        def from_fraction(fraction_after: float):
            i = round(len(distinct) * (1.0 - fraction_after))
            return distinct[i] if i < len(distinct) else after_end

        val = (
            self.val_start
            if self.val_start is not None
            else from_fraction(self.val_fraction + self.test_fraction)
        )
        test = self.test_start if self.test_start is not None else from_fraction(self.test_fraction)
        val, test = np.datetime64(pd.Timestamp(val), "ns"), np.datetime64(pd.Timestamp(test), "ns")
        if test < val:
            raise ValueError(f"test_start {pd.Timestamp(test)} is before val_start {pd.Timestamp(val)}")
        first = (
            distinct[0] if self.train_start is None else np.datetime64(pd.Timestamp(self.train_start), "ns")
        )
        if first > val:
            raise ValueError(f"train_start {pd.Timestamp(first)} is after val_start {pd.Timestamp(val)}")
        return np.array([first, val, test, after_end], dtype="datetime64[ns]")

    def _no_window_error(self, source, split, in_split: np.ndarray, clean) -> DataValidationError:
        offset, n_target = target_span(self.context_len, self.horizon)
        n_rows = int(in_split.sum())
        where = ""
        if n_rows:
            rows = clean.index[in_split]  # row numbers in the file
            most = np.unique(self._series[in_split], return_counts=True)[1].max()
            where = f" (at most {most} in one series), from {describe_row(source, int(rows[0]))}"
        need = (
            f"{n_target} target rows inside the split plus {offset} history rows before them"
            if offset
            else f"{n_target} rows inside the split"
        )
        return DataValidationError(
            f"{source}: split '{split}' (column '{self.schema.time_col}') has no complete window: "
            f"it has {n_rows} row(s){where}, and one window (context_len={self.context_len}, "
            f"horizon={self.horizon}) needs {need}, all in one gap-free run of a series"
            f"{self._step_change(source, in_split, clean)}"
        )

    def _step_change(self, source, in_split: np.ndarray, clean) -> str:
        """Where a split's rows are mostly not one frequency step apart (so that each step is a gap):
        the row at which the step between rows changes, from what to what. '' otherwise."""
        times, ids = self._times, self._series
        steps = times[1:] - times[:-1]  # steps[k]: from row k to row k + 1 (positions in `clean`)
        within = ids[1:] == ids[:-1]
        in_split_steps = within & in_split[1:]
        if not in_split_steps.any():
            return ""
        values, counts = np.unique(steps[in_split_steps], return_counts=True)
        common = values[np.argmax(counts)]
        if common == fixed_step(self._freq).to_timedelta64():
            return ""

        def same_run(k: int) -> bool:
            return 0 <= k < len(steps) and within[k] and steps[k] == common

        # the run of `common` steps that holds the split's first one; the change is at one of its ends
        first = last = int(np.flatnonzero(in_split_steps & (steps == common))[0])
        while same_run(first - 1):
            first -= 1
        while same_run(last + 1):
            last += 1
        if first > 0 and within[first - 1]:
            before, after, at = steps[first - 1], common, first + 1
        elif last + 1 < len(steps) and within[last + 1]:
            before, after, at = common, steps[last + 1], last + 2
        else:
            return f"; its rows are {_step_name(common)} apart, not {self._freq.freqstr} (the frequency)"
        series = f", series {plain(ids[at])!r}" if self.schema.series_col else ""
        return (
            f"; the step between rows changes from {_step_name(before)} to {_step_name(after)} at "
            f"{describe_row(source, int(clean.index[at]))}, time {pd.Timestamp(times[at])}{series}, "
            f"and the frequency is {self._freq.freqstr}: resample the data to one step"
        )

    # -- loaders ----------------------------------------------------------------------------------

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        self.setup()
        dataset = self.datasets[split]
        replicas, rank = self._processes()
        if shuffle:
            sampler = EpochShuffle(dataset, self.seed, replicas, rank)
        else:
            sampler = EvalShard(dataset, self.eval_order(split), replicas, rank)
        return DataLoader(
            dataset,
            batch_size=self.batch_size if split == "train" else self.eval_batch_size,
            sampler=sampler,
            drop_last=False,  # every val/test window is evaluated
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            # the loader's own generator (worker seeds), not the global RNG that dropout draws from
            generator=torch.Generator().manual_seed(self.seed) if shuffle else None,
        )

    def eval_order(self, split: str) -> np.ndarray:
        """`(W,)` window indices by origin time, all series together (by series within one time).

        Evaluation goes forward in time as a forecaster in operation does: the test's rolling spread
        calibration (`tasks/probabilistic.py`) pools each series' truths as they come in, so a window
        of one series is calibrated with the other series' truths known by its origin too. One series:
        the dataset's own order. Outputs are put back in dataset order (`window`) wherever they are kept.
        """
        dataset = self.datasets[split]
        return np.argsort(self._times[dataset.origin_rows()], kind="stable")

    def _processes(self) -> tuple[int, int]:
        """(processes, this one's rank) of the Trainer this module is attached to; (1, 0) without one."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    # -- windows and units, for the task and the CSV export -----------------------------------------

    def _dataset(self, split: str) -> WindowDataset:
        if split not in SPLITS:
            raise KeyError(f"unknown split {split!r}; choose from {SPLITS}")
        self.setup()
        return self.datasets[split]

    def n_windows(self, split: str) -> int:
        return len(self._dataset(split))

    def window_info(self, split: str) -> pd.DataFrame:
        """One row per window in dataset order: `window`, `series_id`, `origin_time`.

        origin_time is the last history step for forecasts, the window start for reconstruction.
        """
        dataset = self._dataset(split)
        origins = dataset.origin_rows()
        return pd.DataFrame(
            {
                "window": np.arange(len(dataset)),
                "series_id": self._series[origins],
                "origin_time": self._times[origins],
            }
        )

    def target_times(self, split: str) -> np.ndarray:
        """Timestamps of the target steps, (W, T_out) datetime64[ns]; = origin_time + step * freq with
        step 1..M (forecast) or 0..N-1 (reconstruction), since windows never span a gap."""
        return self._times[self._dataset(split).target_rows()]  # (W, T_out)
