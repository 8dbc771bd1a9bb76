"""Figures logged with every run: forecasts against actuals, error by horizon step, attention maps;
with a distribution head also a fan chart (median, 50% and 80% bands)."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")  # no display needed: figures go to files and MLflow
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from matplotlib.colors import PowerNorm
from torch.utils.data import default_collate

LAYER_NAME = re.compile(r"(?P<stack>\w+)\.blocks\.(?P<index>\d+)\.(?P<kind>self|cross)_attn")


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


def attention_figure(task, datamodule, window: int | None = None):
    """The attention maps of every layer and head while `task` forecasts one test window (default:
    the middle one), as in evaluation (`WindowTask.attention_maps`); see `attention_maps_figure`.

    With channel independence the network sees one series per target channel: the maps shown are
    those of the first target's series.
    """
    dataset = datamodule.datasets["test"]
    index = len(dataset) // 2 if window is None else int(window)
    batch = {k: v.to(task.device) for k, v in default_collate([dataset[index]]).items()}
    maps = {name: weights[0] for name, weights in task.attention_maps(batch).items()}  # (H, Tq, Tk) each
    info = datamodule.window_info("test").iloc[index]
    title = (
        f"{task.family}: attention in test window {index} (series {info.series_id}, "
        f"origin {pd.Timestamp(info.origin_time):%Y-%m-%d %H:%M})"
    )
    if task.options.channel_independent:
        title += f"\nthe series of {task.target_names[0]} (channel-independent: one series per target)"
    return attention_maps_figure(maps, title)


def attention_maps_figure(maps: dict, title: str = ""):
    """A grid of attention maps: one row per layer, one column per head.

    maps: `{layer name: (H, Tq, Tk)}` weights, names as `WindowTask.attention_maps` gives them
    (`encoder.blocks.0.self_attn`, `decoder.blocks.1.cross_attn`, ...). Rows of a map are queries,
    columns keys (in cross-attention, the encoder's memory tokens). Each panel has its own colour
    scale from 0, square-root (a causal map's first rows hold weights near 1, the later ones spread
    thin), so that the structure of every row and of weak heads shows.
    """
    if not maps:
        raise ValueError("no attention maps: the model has no attention layer that ran")
    n_heads = max(w.shape[0] for w in maps.values())
    fig, axes = plt.subplots(
        len(maps), n_heads, figsize=(2.3 * n_heads + 0.5, 2.3 * len(maps) + 0.6), squeeze=False
    )
    for row, (name, weights) in enumerate(maps.items()):
        weights = weights.detach().float().cpu().numpy() if torch.is_tensor(weights) else np.asarray(weights)
        label, keys = _layer_label(name)
        for head in range(n_heads):
            ax = axes[row, head]
            if head >= weights.shape[0]:
                ax.axis("off")
                continue
            norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=max(float(weights[head].max()), 1e-12))
            ax.imshow(weights[head], norm=norm, cmap="viridis", aspect="auto", interpolation="nearest")
            ax.set_title(f"{label} · head {head + 1}", fontsize=7)
            ax.set_xlabel(keys, fontsize=6)
            ax.set_ylabel("query token", fontsize=6)
            ax.tick_params(labelsize=6)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def _layer_label(name: str) -> tuple[str, str]:
    """`decoder.blocks.1.cross_attn` -> ("decoder 2 cross", "memory token"): a short panel title and
    what the keys are."""
    match = LAYER_NAME.search(name)
    if match is None:
        return name, "key token"
    label = f"{match['stack']} {int(match['index']) + 1} {match['kind']}"
    return label, "memory token" if match["kind"] == "cross" else "key token"
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
