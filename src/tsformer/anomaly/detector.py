"""Anomaly scores per time step and per channel, from a Transformer trained on normal rows only.

`fit_detector(train, val, channels, method=...)` trains on the `train` rows (assumed normal; no label
is read) and measures on the held-out normal `val` rows how large each channel's error normally is.
`detector.score(table)` gives every row a score and its per-channel contributions (`Scores`):

- `masked` (the encoder-only family, `tasks.masked.MaskedFillIn`, trained the BERT way): windows of
  `context_len` steps every `stride` steps; in each window every value is hidden once in a run of
  `run_length` steps (`n_masks` interleaved masks: value (t, c) is hidden by mask ((t // run_length) + c)
  mod n_masks) and, with `channel_out`, each channel is hidden over the first half of the window and
  then over the second half, restored from the other channels and its own other half (a stuck or
  drifting sensor that its own neighbours would "explain", or a changed relation between two
  sensors, shows against what the rest of the window says it should read). Training hides geometric
  runs (`mask_ratio`, `mask_mean_length`) and, in half of the windows, one channel over a block of
  N/4 to N steps: what scoring asks of the model. A value's error is the mean over every window
  covering it, per kind of mask.
- `forecast` (the decoder-only family with a Gaussian head, one step ahead): step t is predicted from
  the `context_len` - 1 rows before it alone (the first rows of a series from the rows they have), and
  its surprise is the squared standardised residual ((y - mean) / sd)^2 of each channel, the part of
  the negative log likelihood that does not depend on how noisy the sensor is. A score never uses a
  later row (streaming). The first row of a series has no past: its score is 0.

Each kind of error (masked: the runs and the channel halves; forecast: the surprise) of each channel
is divided by its 99th percentile on the validation rows (so 1 is a channel's 1-in-100 error of that
kind on normal rows, whatever its units, noise and tails); the larger kind is the channel's
contribution, and the score of a row is the mean of its channels' contributions. Values enter the network standardised by the train rows' mean and sd per channel;
never per window: a level that drifted away is what a detector must see.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from tsformer.data.schema import DataValidationError
from tsformer.models import DecoderOnly, DecoderOnlyConfig
from tsformer.nn.heads import GaussianHead
from tsformer.nn.masking import MaskConfig, draw_mask
from tsformer.settings import SettingError
from tsformer.tasks.masked import MaskedFillIn

METHODS = ("masked", "forecast")
SERIES_COL = "series_id"
ERROR_QUANTILE = 0.99  # a channel's error is measured in its validation rows' 99th percentile
# floor of a channel's validation error (squared, in train sd): smaller errors count as none
MIN_SPREAD = 1e-2
VAL_FRACTION = 0.2  # of each series' train rows held out when no validation rows are given


@dataclass
class Scores:
    """`score (T,)` per row of the scored table (in its order), `contributions (T, C)` per channel."""

    score: np.ndarray
    contributions: np.ndarray
    channels: list[str]

    def top_channels(self, n: int = 3) -> list[list[str]]:
        """The `n` channels contributing most to each row, largest first."""
        order = np.argsort(-self.contributions, axis=1)[:, :n]  # (T, n)
        names = np.asarray(self.channels)
        return [list(names[row]) for row in order]


@dataclass
class DetectorSettings:
    context_len: int = 64
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    lr: float = 1e-3
    batch_size: int = 64
    steps: int = 1500  # optimiser steps
    # masked
    mask_ratio: float = 0.2
    mask_mean_length: float = 4.0
    channel_out: bool = True
    n_masks: int = 5
    run_length: int = 4
    stride: int = 8
    # forecast: nothing more

    @classmethod
    def of(cls, settings: dict) -> DetectorSettings:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(settings) - known)
        if unknown:
            raise SettingError(f"anomaly.settings: unknown setting(s) {unknown}; known: {sorted(known)}")
        out = cls(**settings)
        if out.steps < 20:  # the learning-rate schedule's warmup needs a few steps
            raise SettingError(f"anomaly.settings.steps={out.steps}: at least 20 optimiser steps")
        if out.context_len < 2:
            raise SettingError(f"anomaly.context_len={out.context_len}: a window needs at least 2 steps")
        return out


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
                f"{what}: {name} has {len(rows)} rows, fewer than one window (anomaly.context_len={min_rows})"
            )


def series_rows(table: pd.DataFrame) -> dict:
    """Positions of each series' rows in `table` (one series, key None, without a series_id column)."""
    if SERIES_COL not in table.columns:
        return {None: np.arange(len(table))}
    codes, uniques = pd.factorize(table[SERIES_COL], sort=False)
    return {sid: np.flatnonzero(codes == i) for i, sid in enumerate(uniques)}


def window_starts(n_rows: int, length: int, stride: int) -> np.ndarray:
    """Starts of windows every `stride` steps, the last one ending at the last row (every row covered)."""
    starts = np.arange(0, n_rows - length + 1, stride)
    if starts[-1] != n_rows - length:
        starts = np.append(starts, n_rows - length)
    return starts


class AnomalyDetector:
    """What both methods share: standardising, training windows, per-channel normalisation."""

    method = "base"

    def __init__(self, channels: list[str], settings: DetectorSettings, seed: int):
        self.channels = list(channels)
        self.settings = settings
        self.seed = seed
        self.loc = np.zeros(len(channels))
        self.scale = np.ones(len(channels))
        # each channel's 99th percentile raw error on the validation rows
        self.error_scale = np.ones((1, len(channels)))  # (K, C)
        self.val_scores = np.zeros(0)  # validation rows' scores: what alarms are calibrated on
        self.val_loss = float("nan")  # the training loss on the validation rows: to choose settings
        self.net: torch.nn.Module

    # -- data -------------------------------------------------------------------------------------

    def standardised(self, table: pd.DataFrame) -> list[np.ndarray]:
        """Each series' values `(T_s, C)` standardised by the train rows' mean and sd."""
        values = table[self.channels].to_numpy(dtype=np.float32)
        scaled = (values - self.loc) / self.scale
        return [scaled[rows].astype(np.float32) for rows in series_rows(table).values()]

    def train_windows(self, series: list[np.ndarray]) -> torch.Tensor:
        """Every window `(W, N, C)` of the training series (stride 1)."""
        N = self.settings.context_len
        windows = [
            np.lib.stride_tricks.sliding_window_view(s, N, axis=0).transpose(0, 2, 1) for s in series
        ]  # each (T_s - N + 1, N, C)
        return torch.from_numpy(np.concatenate(windows))

    # -- fit --------------------------------------------------------------------------------------

    def fit(self, train: pd.DataFrame, val: pd.DataFrame) -> AnomalyDetector:
        values = train[self.channels].to_numpy(dtype=float)
        self.loc = values.mean(axis=0)
        self.scale = np.where(values.std(axis=0) > 1e-8, values.std(axis=0), 1.0)  # a constant channel: 1
        torch.manual_seed(self.seed)
        generator = torch.Generator().manual_seed(self.seed)
        windows = self.train_windows(self.standardised(train))
        val_windows = self.train_windows(self.standardised(val))
        s = self.settings
        optimiser = torch.optim.AdamW(self.net.parameters(), lr=s.lr, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimiser, max_lr=s.lr, total_steps=s.steps, pct_start=0.1
        )
        best_loss, best_state = math.inf, None
        check_every = max(1, s.steps // 10)
        self.net.train()
        for step in range(s.steps):
            batch = windows[torch.randint(len(windows), (s.batch_size,), generator=generator)]  # (B, N, C)
            loss = self.loss(batch, generator)
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
            optimiser.step()
            schedule.step()
            if (step + 1) % check_every == 0 or step + 1 == s.steps:
                val_loss = self.validation_loss(val_windows)
                if val_loss < best_loss:  # keep the weights of the best validation loss
                    best_loss, best_state = val_loss, copy.deepcopy(self.net.state_dict())
        self.net.load_state_dict(best_state)
        self.net.eval()
        self.val_loss = best_loss
        raw = self.raw_errors(val)  # (K, T_val, C): the channels' usual errors on normal rows
        self.error_scale = np.maximum(np.quantile(raw, ERROR_QUANTILE, axis=1), MIN_SPREAD)  # (K, C)
        self.val_scores = self.score(val).score
        return self

    @torch.no_grad()
    def validation_loss(self, windows: torch.Tensor) -> float:
        """The training loss on (at most 512 of) the validation windows, with fixed masks."""
        self.net.eval()
        generator = torch.Generator().manual_seed(12345)
        pick = torch.randperm(len(windows), generator=generator)[:512]
        loss = float(self.loss(windows[pick], generator))
        self.net.train()
        return loss

    def loss(self, batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    # -- score ------------------------------------------------------------------------------------

    def raw_errors(self, table: pd.DataFrame) -> np.ndarray:
        """Each row's raw error per kind of error and channel `(K, T, C)`, in the table's row order."""
        out = np.zeros((self.n_kinds, len(table), len(self.channels)))
        series = self.standardised(table)
        for values, rows in zip(series, series_rows(table).values(), strict=True):
            out[:, rows] = self.series_errors(values)
        return out

    @property
    def n_kinds(self) -> int:
        return 1

    def series_errors(self, values: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def score(self, table: pd.DataFrame) -> Scores:
        check_table(table, self.channels, self.settings.context_len)
        # (T, C): each kind of error in its 1-in-100 validation error, the largest kind counts
        contributions = (self.raw_errors(table) / self.error_scale[:, None, :]).max(axis=0)
        return Scores(contributions.mean(axis=1), contributions, self.channels)


class MaskedDetector(AnomalyDetector):
    method = "masked"

    def __init__(self, channels, settings, seed):
        super().__init__(channels, settings, seed)
        torch.manual_seed(seed)
        self.task = MaskedFillIn(
            net={"d_model": settings.d_model, "n_heads": settings.n_heads, "n_layers": settings.n_layers},
            d_target=len(channels), d_known=0, d_observed=0, context_len=settings.context_len, horizon=0,
            mask_ratio=settings.mask_ratio, mask_mean_length=settings.mask_mean_length,
            window_norm=False,  # a level or spread changed within a window is what must show
            interpolate_hidden=True,
        )  # fmt: skip
        self.net = self.task.net
        self.mask = MaskConfig("geometric", settings.mask_ratio, settings.mask_mean_length)

    @staticmethod
    def batch(values: torch.Tensor) -> dict:
        empty = values[..., :0]
        return {"hist_target": values, "hist_known": empty, "hist_observed": empty}

    def loss(self, batch, generator):
        B, N, C = batch.shape
        hidden = draw_mask((B, N, C), self.mask, generator)  # (B, N, C)
        if self.settings.channel_out:  # half the windows: one channel hidden over a block of N/4..N steps too
            channel = torch.randint(C, (B,), generator=generator)
            length = torch.randint(N // 4, N + 1, (B,), generator=generator)
            start = (torch.rand(B, generator=generator) * (N - length + 1)).long()
            steps = torch.arange(N).unsqueeze(0)  # (1, N)
            in_block = (steps >= start.unsqueeze(1)) & (steps < (start + length).unsqueeze(1))  # (B, N)
            picked = torch.rand(B, generator=generator) < 0.5
            block = (in_block & picked.unsqueeze(1)).unsqueeze(2) & (
                torch.arange(C) == channel.unsqueeze(1)
            ).unsqueeze(1)
            hidden = hidden | block  # (B, N, C)
        return self.task.masked_loss_of(self.batch(batch), hidden, hidden)

    def scoring_masks(self) -> list[torch.Tensor]:
        """The masks `(N, C)` each window is restored under: interleaved runs, then each channel alone."""
        s = self.settings
        N, C = s.context_len, len(self.channels)
        phase = (torch.arange(N).unsqueeze(1) // s.run_length + torch.arange(C).unsqueeze(0)) % s.n_masks
        masks = [phase == k for k in range(s.n_masks)]
        if s.channel_out:  # each channel's first half, then its second half, restored from the rest
            first = (torch.arange(N) < N // 2).unsqueeze(1)  # (N, 1)
            for c in range(C):
                channel = (torch.arange(C) == c).unsqueeze(0)  # (1, C)
                masks += [first & channel, ~first & channel]
        return masks

    @torch.no_grad()
    def series_errors(self, values):
        s = self.settings
        T, C = values.shape
        N = s.context_len
        starts = window_starts(T, N, s.stride)
        windows = torch.from_numpy(np.stack([values[a : a + N] for a in starts]))  # (W, N, C)
        masks = self.scoring_masks()
        kinds = [masks[: s.n_masks], masks[s.n_masks :]] if s.channel_out else [masks]
        total = np.zeros((len(kinds), T, C))
        for k, kind in enumerate(kinds):  # runs, channels out: each value hidden once per kind and window
            err = torch.zeros_like(windows)  # (W, N, C)
            for chunk in torch.split(torch.arange(len(windows)), 256):
                x = windows[chunk]
                for mask in kind:
                    hidden = mask.expand_as(x)
                    restored = self.task.restore(self.batch(x), hidden)  # (b, N, C)
                    err[chunk] += torch.where(hidden, (restored - x) ** 2, 0.0)
            summed, count = np.zeros((T, C)), np.zeros((T, 1))
            for w, a in enumerate(starts):  # every window covering a step: the mean
                summed[a : a + N] += err[w].numpy()
                count[a : a + N] += 1
            total[k] = summed / count
        return total  # (K, T, C)

    @property
    def n_kinds(self) -> int:
        return 2 if self.settings.channel_out else 1


class ForecastDetector(AnomalyDetector):
    method = "forecast"

    def __init__(self, channels, settings, seed):
        super().__init__(channels, settings, seed)
        torch.manual_seed(seed)
        self.head = GaussianHead()
        self.net = DecoderOnly(
            DecoderOnlyConfig(
                d_model=settings.d_model, n_heads=settings.n_heads, n_layers=settings.n_layers,
                d_target=len(channels), d_known=0, n_params=self.head.n_params, dropout=0.0,
            )
        )  # fmt: skip

    def params(self, values: torch.Tensor) -> torch.Tensor:
        """One-step-ahead Gaussian `(B, N - 1, C, 2)` of steps 1..N-1 of windows `(B, N, C)`."""
        return self.head.params(self.net(values[:, :-1]))

    def loss(self, batch, generator):
        return self.head.loss(self.params(batch), batch[:, 1:])

    @torch.no_grad()
    def series_errors(self, values):
        T, C = values.shape
        N = self.settings.context_len
        x = torch.from_numpy(values)
        out = np.zeros((T, C))
        first = x[None, :N]  # (1, N, C): steps 1..N-1 from the rows before them
        out[1:N] = self.surprise(self.params(first), first[:, 1:])[0]
        ends = np.arange(N, T)  # every later step: the window of the N - 1 rows before it, and it
        for chunk in np.array_split(ends, max(1, math.ceil(len(ends) / 256))):
            if len(chunk) == 0:
                continue
            windows = torch.stack([x[e - N + 1 : e + 1] for e in chunk])  # (b, N, C)
            params = self.params(windows)[:, -1:]  # (b, 1, C, 2): the last step only
            out[chunk] = self.surprise(params, windows[:, -1:])[:, 0]
        return out[None]  # (1, T, C): one kind of error

    @staticmethod
    def surprise(params: torch.Tensor, target: torch.Tensor) -> np.ndarray:
        """Squared standardised residual `(B, L, C)` of `target (B, L, C)` under the Gaussians."""
        return (((target - params[..., 0]) / params[..., 1]) ** 2).numpy()


DETECTORS = {cls.method: cls for cls in (MaskedDetector, ForecastDetector)}


def split_normal_rows(
    train: pd.DataFrame, fraction: float = VAL_FRACTION
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The first (1 - fraction) of each series' rows to train on, the rest held out."""
    keep, held = [], []
    for rows in series_rows(train).values():
        cut = len(rows) - max(1, round(fraction * len(rows)))
        keep.append(rows[:cut])
        held.append(rows[cut:])
    return train.iloc[np.concatenate(keep)], train.iloc[np.concatenate(held)]


def fit_detector(
    train: pd.DataFrame,
    val: pd.DataFrame | None,
    channels: list[str],
    *,
    method: str = "masked",
    seed: int = 0,
    **settings,
) -> AnomalyDetector:
    """A detector trained on the normal `train` rows; `val`: held-out normal rows (None: the last 20 %
    of each series of `train`) that set each channel's usual error and the alarms' threshold."""
    if method not in DETECTORS:
        raise SettingError(f"anomaly.method={method!r}: choose one of {METHODS}")
    s = DetectorSettings.of(settings)
    if val is None:
        train, val = split_normal_rows(train)
    check_table(train, channels, s.context_len, "train rows")
    check_table(val, channels, s.context_len, "validation rows")
    return DETECTORS[method](channels, s, seed).fit(train, val)


__all__ = ["METHODS", "AnomalyDetector", "DetectorSettings", "Scores", "check_table", "fit_detector"]
