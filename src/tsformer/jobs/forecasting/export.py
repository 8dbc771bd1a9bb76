"""Forecasts -> one tidy long CSV in original units.

Columns: `series_id, origin_time, target_time, step, variable, y_true, y_pred`, one row per
(series, forecast origin, step, target variable). For forecasts `origin_time` is the last observed
step and `step` = 1..M; for state reconstruction `origin_time` is the window start and `step` =
0..N-1 the position in the window. In both, target_time = origin_time + step * freq.

With a distribution head (`model.head`) the CSV gains one column per configured quantile level,
`q0.1, q0.5, q0.9` by default (`model.head.levels`), in original units; `y_pred` stays the point
forecast (the mean or the median, `model.head.point`). The scalers are positive affine maps per
variable, so scaled quantiles map to original units one for one.

Sampled paths (`paths_file`, autoregressive families with a distribution head) go to Parquet:
`series_id, origin_time, target_time, step, variable, path, value`, one row per (window, path,
step, variable), original units, as calibrated (the paths the quantile columns are read from).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tsformer.nn.heads import level_name

COLUMNS = ["series_id", "origin_time", "target_time", "step", "variable", "y_true", "y_pred"]


@dataclass(frozen=True)
class SplitView:
    """What the export and the figures read of one split of the data: where its windows lie and when,
    the targets' names and units, and the way back to original units. Built from a data module
    (`SplitView.of`) or by hand: nothing here needs the data module itself."""

    windows: pd.DataFrame  # one row per window, in dataset order: series_id, origin_time
    target_times: np.ndarray  # (W, T_out) datetime64: the time of each target step
    target_names: tuple[str, ...]
    context_len: int
    horizon: int
    # whether each window's targets are its own rows (reconstruction: steps 0..N-1 of the window) rather
    # than the rows after it (forecasts: steps 1..M); the data's geometry (`data.windows.target_span`)
    targets_are_window: bool
    freq: pd.DateOffset
    inverse_target: Callable[[np.ndarray], np.ndarray]  # (..., Dy) scaled -> original units
    units: Mapping[str, str] = field(default_factory=dict)  # data.units: a column's unit, where given

    @classmethod
    def of(cls, datamodule, split: str) -> SplitView:
        """The view of `split` ("val", "test") of a data module that is set up."""
        return cls(
            windows=datamodule.window_info(split),
            target_times=datamodule.target_times(split),
            target_names=tuple(datamodule.target_names),
            context_len=datamodule.context_len,
            horizon=datamodule.horizon,
            targets_are_window=datamodule.datasets[split].targets_are_window,
            freq=datamodule.freq,
            inverse_target=datamodule.features.inverse_target,
            units=dict(getattr(datamodule, "units", None) or {}),
        )

    @property
    def first_step(self) -> int:
        """How the CSV numbers the first target step: 1 for forecasts, 0 in a reconstructed window."""
        return 0 if self.targets_are_window else 1


def forecasts_frame(
    view: SplitView,
    pred_scaled: np.ndarray,
    true_scaled: np.ndarray,
    valid: np.ndarray | None = None,
    quantiles_scaled: np.ndarray | None = None,
    levels: list[float] | None = None,
    windows: np.ndarray | None = None,
) -> pd.DataFrame:
    """`pred_scaled`, `true_scaled`: `(W, T_out, Dy)` in window order of the view's split; `valid`
    `(W, T_out)` False on steps filled in for a gap (data.fill): their y_true is left empty;
    `quantiles_scaled` `(W, T_out, Dy, K)` at `levels`: the columns `q<level>`.
    `windows`: indices of the windows to keep (e.g. the few a figure shows); None: all of them."""
    info, target_times = view.windows, view.target_times  # (W,) rows, (W, T_out)
    W, T, Dy = pred_scaled.shape
    if len(info) != W or target_times.shape != (W, T):
        raise ValueError(f"{W} predicted windows of {T} steps, but the split has {target_times.shape}")
    if windows is not None:
        info, target_times = info.iloc[windows].reset_index(drop=True), target_times[windows]
        pred_scaled, true_scaled = pred_scaled[windows], true_scaled[windows]
        valid = None if valid is None else np.asarray(valid)[windows]
        quantiles_scaled = None if quantiles_scaled is None else quantiles_scaled[windows]
        W = len(info)
    pred = view.inverse_target(pred_scaled)  # (W, T, Dy) original units
    true = view.inverse_target(true_scaled)
    if valid is not None:
        true = np.where(np.asarray(valid)[..., None], true, np.nan)  # nobody measured a filled step
    # rows ordered window -> step -> variable: index arrays broadcast to (W, T, Dy), then flattened
    w, t, v = (i.ravel() for i in np.meshgrid(np.arange(W), np.arange(T), np.arange(Dy), indexing="ij"))
    keys = _key_columns(view, info, target_times, w, t, v)
    frame = pd.DataFrame({**keys, "y_true": true.reshape(-1), "y_pred": pred.reshape(-1)}, columns=COLUMNS)
    if quantiles_scaled is not None:
        q = view.inverse_target(np.moveaxis(quantiles_scaled, -1, -2))  # (W, T, K, Dy) original
        frame = with_quantile_columns(frame, np.moveaxis(q, -2, -1), levels)
    return frame


def _key_columns(view: SplitView, info: pd.DataFrame, target_times: np.ndarray, w, t, v) -> dict:
    """`series_id, origin_time, target_time, step, variable` of the rows with window, step and
    variable indices `w, t, v` (flat arrays); steps numbered 1..M for forecasts, 0..N-1 for
    reconstruction."""
    return {
        "series_id": info["series_id"].to_numpy()[w],
        "origin_time": info["origin_time"].to_numpy()[w],
        "target_time": target_times[w, t],
        "step": t + view.first_step,
        "variable": np.asarray(view.target_names, dtype=object)[v],
    }


def with_quantile_columns(frame: pd.DataFrame, quantiles: np.ndarray, levels: list[float]) -> pd.DataFrame:
    """`frame` (rows window -> step -> variable) with the columns `q<level>` of `quantiles (W, T, Dy, K)`."""
    if quantiles.shape[-1] != len(levels):
        raise ValueError(f"{quantiles.shape[-1]} quantiles per step for the levels {levels}")
    flat = quantiles.reshape(-1, len(levels))  # rows in the frame's order
    return frame.assign(**{level_name(level): flat[:, k] for k, level in enumerate(levels)})


def select_levels(quantiles: np.ndarray, have: list[float], want: list[float]) -> np.ndarray:
    """The `want` levels out of quantiles `(..., K)` computed at the levels `have`."""
    return quantiles[..., [list(have).index(level) for level in want]]


def paths_frame(view: SplitView, paths_scaled: np.ndarray) -> pd.DataFrame:
    """Sampled paths `(W, S, T, Dy)` (scaled, window order of the view's split) -> the long frame of
    the module docstring, original units; rows window -> path -> step -> variable."""
    info, target_times = view.windows, view.target_times  # (W,) rows, (W, T)
    W, S, T, Dy = paths_scaled.shape
    if len(info) != W or target_times.shape != (W, T):
        raise ValueError(f"{W} windows of {T} steps of paths, but the split has {target_times.shape}")
    values = view.inverse_target(paths_scaled)  # (W, S, T, Dy) original units
    # rows ordered window -> path -> step -> variable
    w, s, t, v = (i.ravel() for i in np.meshgrid(*(np.arange(n) for n in (W, S, T, Dy)), indexing="ij"))
    keys = _key_columns(view, info, target_times, w, t, v)
    return pd.DataFrame({**keys, "path": s, "value": values.reshape(-1)})


def mae_by_step(
    view: SplitView, pred_scaled: np.ndarray, true_scaled: np.ndarray, valid: np.ndarray | None = None
) -> pd.DataFrame:
    """Mean absolute error in original units over all windows, per variable and step: columns
    `variable, step, mae` (steps numbered as in the CSV; filled steps not scored). From the arrays,
    so that it needs no CSV-sized frame (ETTm1 at H=720: 56 million rows)."""
    err = np.abs(view.inverse_target(pred_scaled) - view.inverse_target(true_scaled))  # (W, T, Dy)
    if valid is not None:
        err = np.where(np.asarray(valid)[..., None], err, np.nan)
    mae = np.nanmean(err, axis=0)  # (T, Dy)
    T, Dy = mae.shape
    return pd.DataFrame(
        {
            "variable": np.repeat(np.asarray(view.target_names, dtype=object), T),
            "step": np.tile(np.arange(T) + view.first_step, Dy),
            "mae": mae.T.reshape(-1),  # (Dy, T) -> variable-major rows
        }
    )
