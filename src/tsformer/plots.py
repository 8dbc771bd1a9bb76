"""Figures logged with every run: forecasts against actuals, and error by horizon step; with a
distribution head also a fan chart (median, 50% and 80% bands)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display needed: figures go to files and MLflow
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def forecast_windows_figure(forecasts: pd.DataFrame, history: pd.DataFrame, n_windows: int = 4):
    """A grid: rows = a few test windows spread over the test period, columns = target variables.

    forecasts: the export frame (original units); history: columns series_id, time, <targets>, the
    validated data, from which each window's context is drawn.
    """

    def draw(ax, w):
        ax.plot(w.target_time, w.y_true, color="k", lw=1.2, label="actual")
        ax.plot(w.target_time, w.y_pred, color="tab:red", lw=1.2, label="forecast")

    return _window_grid(forecasts, history, n_windows, draw)


def _window_grid(forecasts: pd.DataFrame, history: pd.DataFrame, n_windows: int, draw):
    """The grid of `forecast_windows_figure`: each panel shows the context before the origin, then
    `draw(ax, rows of that window and variable)`."""
    variables = list(dict.fromkeys(forecasts["variable"]))
    origins = forecasts[["series_id", "origin_time"]].drop_duplicates().reset_index(drop=True)
    picks = origins.iloc[np.linspace(0, len(origins) - 1, min(n_windows, len(origins))).round().astype(int)]
    fig, axes = plt.subplots(len(picks), len(variables), figsize=(5 * len(variables), 2.6 * len(picks)), squeeze=False)
    for row, (_, origin) in enumerate(picks.iterrows()):
        window = forecasts[(forecasts.series_id == origin.series_id) & (forecasts.origin_time == origin.origin_time)]
        span = window.target_time.max() - window.target_time.min()
        for col, var in enumerate(variables):
            ax = axes[row, col]
            series = history[history.series_id == origin.series_id]
            context = series[(series.time <= origin.origin_time) & (series.time >= origin.origin_time - span)]
            ax.plot(context.time, context[var], color="0.6", lw=1, label="context")
            draw(ax, window[window.variable == var])
            ax.set_title(f"series {origin.series_id} · {var} · origin {pd.Timestamp(origin.origin_time):%Y-%m-%d %H:%M}", fontsize=8)
            ax.tick_params(labelsize=7)
            if row == 0 and col == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def error_by_step_figure(forecasts: pd.DataFrame, baseline: pd.DataFrame | None = None):
    """Mean absolute error (original units) against the step, one line per variable (and baseline)."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for var, group in forecasts.groupby("variable", sort=False):
        mae = (group.y_pred - group.y_true).abs().groupby(group.step).mean()
        line = ax.plot(mae.index, mae.values, label=f"{var} model")[0]
        if baseline is not None:
            b = baseline[baseline.variable == var]
            bmae = (b.y_pred - b.y_true).abs().groupby(b.step).mean()
            ax.plot(bmae.index, bmae.values, ls="--", color=line.get_color(), label=f"{var} baseline")
    ax.set_xlabel("step")
    ax.set_ylabel("MAE (original units)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def fan_chart_figure(forecasts: pd.DataFrame, history: pd.DataFrame, n_windows: int = 4):
    """Probabilistic forecasts of a few test windows: the median, the central 50% and 80% bands
    (columns q0.25-q0.75 and q0.1-q0.9 of `forecasts`), the actuals and the context before the origin.

    forecasts: the export frame with those quantile columns (original units); history as for
    `forecast_windows_figure`.
    """
    needed = ["q0.1", "q0.25", "q0.5", "q0.75", "q0.9"]
    missing = [c for c in needed if c not in forecasts.columns]
    if missing:
        raise ValueError(f"a fan chart needs the quantile columns {needed}; missing {missing}")

    def draw(ax, w):
        ax.fill_between(w.target_time, w["q0.1"], w["q0.9"], color="tab:blue", alpha=0.2, lw=0, label="80%")
        ax.fill_between(w.target_time, w["q0.25"], w["q0.75"], color="tab:blue", alpha=0.35, lw=0, label="50%")
        ax.plot(w.target_time, w["q0.5"], color="tab:blue", lw=1.2, label="median")
        ax.plot(w.target_time, w.y_true, color="k", lw=1.2, label="actual")

    return _window_grid(forecasts, history, n_windows, draw)
