"""Figures logged with every run: forecasts against actuals, and error by horizon step."""

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
    variables = list(dict.fromkeys(forecasts["variable"]))
    origins = forecasts[["series_id", "origin_time"]].drop_duplicates().reset_index(drop=True)
    picks = origins.iloc[np.linspace(0, len(origins) - 1, min(n_windows, len(origins))).round().astype(int)]
    fig, axes = plt.subplots(len(picks), len(variables), figsize=(5 * len(variables), 2.6 * len(picks)), squeeze=False)
    for row, (_, origin) in enumerate(picks.iterrows()):
        window = forecasts[(forecasts.series_id == origin.series_id) & (forecasts.origin_time == origin.origin_time)]
        span = window.target_time.max() - window.target_time.min()
        for col, var in enumerate(variables):
            ax = axes[row, col]
            w = window[window.variable == var]
            series = history[history.series_id == origin.series_id]
            context = series[(series.time <= origin.origin_time) & (series.time >= origin.origin_time - span)]
            ax.plot(context.time, context[var], color="0.6", lw=1, label="context")
            ax.plot(w.target_time, w.y_true, color="k", lw=1.2, label="actual")
            ax.plot(w.target_time, w.y_pred, color="tab:red", lw=1.2, label="forecast")
            ax.set_title(f"series {origin.series_id} · {var} · origin {pd.Timestamp(origin.origin_time):%Y-%m-%d %H:%M}", fontsize=8)
            ax.tick_params(labelsize=7)
            if row == 0 and col == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def error_by_step_figure(model: pd.DataFrame, baseline: pd.DataFrame | None = None):
    """Mean absolute error (original units) against the step, one line per variable (and baseline).

    model, baseline: `export.mae_by_step` tables (columns variable, step, mae)."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for var, group in model.groupby("variable", sort=False):
        line = ax.plot(group.step, group.mae, label=f"{var} model")[0]
        if baseline is not None:
            b = baseline[baseline.variable == var]
            ax.plot(b.step, b.mae, ls="--", color=line.get_color(), label=f"{var} baseline")
    ax.set_xlabel("step")
    ax.set_ylabel("MAE (original units)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
