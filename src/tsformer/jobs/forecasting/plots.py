"""Figures logged with every run: forecasts (or reconstructions) against the measured values, error
by step, attention maps; with a distribution head also a fan chart (median, 50% and 80% bands).

Each is meant to be read at a glance by someone who knows the plant, not the model: values in the
variable's unit (`data.units`; without one, "original units"), times on the axes (steps ahead in time
too), one legend per figure, inside it at any width, colour bars on maps. The figures read a
`SplitView` of the data (names, times, window positions), never the data module."""

from __future__ import annotations

import re
from collections.abc import Mapping

import matplotlib

matplotlib.use("Agg")  # no display needed: figures go to files and MLflow
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from matplotlib.ticker import FuncFormatter, MaxNLocator
from torch.utils.data import default_collate

from tsformer.jobs.forecasting.export import SplitView
from tsformer.nn.patching import n_patches

LAYER_NAME = re.compile(r"(?P<stack>\w+)\.blocks\.(?P<index>\d+)\.(?P<kind>self|cross)_attn")


def forecast_windows_figure(
    forecasts: pd.DataFrame,
    history: pd.DataFrame,
    n_windows: int = 4,
    reconstruction: bool = False,
    units: Mapping[str, str] | None = None,
):
    """A grid: rows = a few test windows spread over the test period, columns = target variables.

    forecasts: the export frame (original units); history: columns series_id, time, <targets>, the
    validated data, from which each forecast's history is drawn. `reconstruction`: the frame holds
    state reconstructions (windows from `origin_time` on), not forecasts after it. `units`: a
    variable's unit for its y axis (`data.units`).
    """

    def draw(ax, w):
        ax.plot(w.target_time, w.y_true, color="k", lw=1.2, label="measured")
        predicted = "reconstruction" if reconstruction else "forecast"
        ax.plot(w.target_time, w.y_pred, color="tab:red", lw=1.2, label=predicted)

    return _window_grid(forecasts, history, n_windows, draw, reconstruction, units)


def unit_of(variable: str, units: Mapping[str, str] | None) -> str:
    """How an axis names a variable's unit: `data.units`' entry, else "original units"."""
    return (units or {}).get(variable) or "original units"


def figure_legend(fig, handles, labels, fontsize: float = 8):
    """One legend for the figure, above its panels (room made by the constrained layout), in as many
    columns as fit the figure's width: never cut off at its edges, however narrow the figure."""
    renderer = fig.canvas.get_renderer()
    for ncol in range(len(labels), 0, -1):
        legend = fig.legend(
            handles, labels, loc="outside upper center", ncol=ncol, fontsize=fontsize, frameon=False
        )
        if ncol == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            return legend
        legend.remove()
    return None  # no labels


def _window_grid(
    forecasts: pd.DataFrame,
    history: pd.DataFrame,
    n_windows: int,
    draw,
    reconstruction: bool = False,
    units: Mapping[str, str] | None = None,
):
    """The grid of `forecast_windows_figure`: in each panel `draw(ax, rows of that window and variable)`,
    after a forecast's history up to its origin (a reconstruction has none: its window is all inputs).
    One legend for the figure; y-axes in the variable's unit; dates written concisely."""
    variables = list(dict.fromkeys(forecasts["variable"]))
    origins = forecasts[["series_id", "origin_time"]].drop_duplicates().reset_index(drop=True)
    picks = origins.iloc[np.linspace(0, len(origins) - 1, min(n_windows, len(origins))).round().astype(int)]
    fig, axes = plt.subplots(
        len(picks),
        len(variables),
        figsize=(5 * len(variables), 2.6 * len(picks) + 0.4),
        squeeze=False,
        layout="constrained",  # makes room for the legend above the panels
    )
    for row, (_, origin) in enumerate(picks.iterrows()):
        window = forecasts[
            (forecasts.series_id == origin.series_id) & (forecasts.origin_time == origin.origin_time)
        ]
        span = window.target_time.max() - window.target_time.min()
        start = pd.Timestamp(origin.origin_time)
        for col, var in enumerate(variables):
            ax = axes[row, col]
            if not reconstruction:
                series = history[history.series_id == origin.series_id]
                context = series[(series.time <= start) & (series.time >= start - span)]
                ax.plot(context.time, context[var], color="0.6", lw=1, label="measured before the origin")
                ax.axvline(start, color="0.3", lw=0.8, ls=":", label="forecast origin")
            draw(ax, window[window.variable == var])
            ax.set_title(f"series {origin.series_id} · {_window_start(start, reconstruction)}", fontsize=8)
            ax.set_ylabel(f"{var}\n({unit_of(var, units)})", fontsize=7)
            _concise_dates(ax.xaxis)
            ax.tick_params(labelsize=7)
            ax.xaxis.get_offset_text().set_fontsize(7)
            ax.grid(alpha=0.3)
    figure_legend(fig, *axes[0, 0].get_legend_handles_labels())
    return fig


def _window_start(origin: pd.Timestamp, reconstruction: bool) -> str:
    """How a panel or figure title names its window: by the forecast origin, or where it starts."""
    return f"window from {origin:%Y-%m-%d %H:%M}" if reconstruction else f"origin {origin:%Y-%m-%d %H:%M}"


def _concise_dates(axis) -> None:
    """Date ticks that fit: a few per axis, each label only what changes (`10:30`, with the date once
    in the offset text), as matplotlib's ConciseDateFormatter writes them."""
    # 7: at 6 a span of 2.5-3 hours, days or years fits no interval, and matplotlib warns and guesses
    locator = mdates.AutoDateLocator(minticks=3, maxticks=7)
    axis.set_major_locator(locator)
    axis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def error_by_step_figure(
    model: pd.DataFrame,
    baseline: pd.DataFrame | None = None,
    reconstruction: bool = False,
    freq=None,
    units: Mapping[str, str] | None = None,
    others: Mapping[str, pd.DataFrame] | None = None,
):
    """Mean absolute error (each variable's unit) against the step, one line per variable (and baseline).

    model, baseline and each of `others` (named baselines: the linear forecaster): `export.mae_by_step`
    tables (columns variable, step, mae); `reconstruction`: the
    steps are positions in a reconstructed window (from 0), not steps ahead of a forecast origin.
    `freq` (the data's step): a second axis, on top, says the steps in time; `units`: `data.units`."""
    fig, ax = plt.subplots(figsize=(7, 3.8), layout="constrained")
    shown = {var: unit_of(var, units) for var in dict.fromkeys(model.variable)}
    one_unit = len(set(shown.values())) == 1
    for var, group in model.groupby("variable", sort=False):
        name = var if one_unit else f"{var} ({shown[var]})"
        line = ax.plot(group.step, group.mae, label=f"{name}: model")[0]
        if baseline is not None:
            b = baseline[baseline.variable == var]
            ax.plot(b.step, b.mae, ls="--", color=line.get_color(), label=f"{name}: naive baseline")
        for (other, table), style in zip((others or {}).items(), (":", "-.", (0, (1, 3)))):
            b = table[table.variable == var]
            ax.plot(b.step, b.mae, ls=style, color=line.get_color(), label=f"{name}: {other}")
    steps = "position in the window (steps from its start)" if reconstruction else "steps ahead of the origin"
    ax.set_xlabel(steps)
    ax.set_ylabel(
        f"mean absolute error\n({next(iter(shown.values())) if one_unit else 'each variable’s unit'})"
    )
    _time_axis(
        ax, freq, model.step.max(), "from the window start" if reconstruction else "ahead of the origin"
    )
    ax.set_title("Error of the test windows by step", fontsize=9)
    figure_legend(fig, *ax.get_legend_handles_labels(), fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def _time_axis(ax, freq, last_step: int, what: str) -> None:
    """A second x axis on top of a steps axis: the same steps as a time (minutes, hours or days, as
    suits the span), for data sampled every `freq`. None, or a calendar frequency such as months,
    whose steps have no one duration: no second axis."""
    try:
        step = pd.Timedelta(freq) if freq is not None else None
    except (TypeError, ValueError):
        step = None
    if step is None or step <= pd.Timedelta(0):
        return
    span = step * max(int(last_step), 1)
    for unit, size in (("days", "1D"), ("hours", "1h"), ("minutes", "1min"), ("seconds", "1s")):
        if span >= 2 * pd.Timedelta(size) or unit == "seconds":
            break
    per_step = step / pd.Timedelta(size)  # the time of one step in `unit`
    top = ax.secondary_xaxis("top", functions=(lambda x: x * per_step, lambda x: x / per_step))
    top.set_xlabel(f"time {what} ({unit})", fontsize=8)
    top.tick_params(labelsize=7)


def attention_figure(task, view: SplitView, dataset, window: int | None = None):
    """The attention maps of every layer and head while `task` forecasts one window of `dataset`
    (default: the middle one), as in evaluation (`WindowTask.attention_maps`); see
    `attention_maps_figure`. `view`: the same split's windows; the tokens are labelled with the times
    they stand for (`_token_times`).

    With channel independence the network sees one series per target channel: the maps shown are
    those of the first target's series.
    """
    index = len(dataset) // 2 if window is None else int(window)
    batch = {k: v.to(task.device) for k, v in default_collate([dataset[index]]).items()}
    maps = {name: weights[0] for name, weights in task.attention_maps(batch).items()}  # (H, Tq, Tk) each
    info = view.windows.iloc[index]
    origin = pd.Timestamp(info.origin_time)
    when = _window_start(origin, reconstruction=view.targets_are_window)
    title = f"{task.family}: attention in test window {index} (series {info.series_id}, {when})"
    if task.options.channel_independent:
        title += f"\nthe series of {task.target_names[0]} (channel-independent: one series per target)"
    times = {name: _token_times(task, view, name, w.shape[-2:], origin) for name, w in maps.items()}
    return attention_maps_figure(maps, title, times)


def _token_times(task, view: SplitView, name: str, shape: tuple[int, int], origin: pd.Timestamp):
    """(query times, key times) of the layer `name`'s map of `shape` (Tq, Tk): the time of the step
    each token stands for (a patch: its first step), None for an axis whose tokens are not recognised.

    Tokens lie on the window's steps (0 .. N-1 the history, N .. N+M-1 the future; a reconstruction's
    window is its N steps): the encoder's are the history (with future known covariates: then the
    future), the encoder-decoder's decoder's the future, the decoder-only's the N+M-1 steps it is fed.
    """
    N, M = view.context_len, view.horizon
    first = origin if view.targets_are_window else origin - (N - 1) * view.freq  # the window's first step
    match = LAYER_NAME.search(name)
    by_count = {N: np.arange(N), N + M: np.arange(N + M), N + M - 1: np.arange(N + M - 1)}
    dec_patch = task.hparams.get("net", {}).get("decoder_patch_len") or 1  # enc_dec's future steps a token
    patch_len = task.hparams.get("patch_len")
    if patch_len and (match is None or match["stack"] == "encoder" or match["kind"] == "cross"):
        stride = task.hparams.get("patch_stride") or patch_len
        by_count = {n_patches(N, patch_len, stride): np.arange(n_patches(N, patch_len, stride)) * stride}

    def steps(n: int, is_query: bool):
        in_decoder = (
            match is not None and match["stack"] == "decoder" and (is_query or match["kind"] == "self")
        )
        if task.family == "enc_dec" and in_decoder and n == -(-M // dec_patch):
            return N + np.arange(n) * dec_patch  # the decoder's tokens: one per future step (or per patch)
        return by_count.get(n)

    return tuple(
        None if (s := steps(n, is_query)) is None else first + s * view.freq
        for n, is_query in ((shape[0], True), (shape[1], False))
    )


def attention_maps_figure(maps: dict, title: str = "", token_times: dict | None = None):
    """A grid of attention maps: one row per layer, one column per head.

    maps: `{layer name: (H, Tq, Tk)}` weights, names as `WindowTask.attention_maps` gives them
    (`encoder.blocks.0.self_attn`, `decoder.blocks.1.cross_attn`, ...). Rows of a map are queries,
    columns keys (in cross-attention, the encoder's memory tokens). token_times: `{layer name:
    (query times, key times)}`, either None where the tokens are only numbered.

    The heads of a layer share one linear colour scale, with its colour bar: from 0 to the 99th
    percentile of the layer's weights (the few above it, such as a causal map's first query, which
    can only attend to itself, show in the top colour), so that heads compare and the rows that
    spread their weight thin still show their structure.
    """
    if not maps:
        raise ValueError("no attention maps: the model has no attention layer that ran")
    n_heads = max(w.shape[0] for w in maps.values())
    fig, axes = plt.subplots(
        len(maps),
        n_heads,
        figsize=(2.6 * n_heads + 1.2, 2.5 * len(maps) + 0.7),
        squeeze=False,
        layout="constrained",  # leaves room for the colour bars
    )
    for row, (name, weights) in enumerate(maps.items()):
        weights = weights.detach().float().cpu().numpy() if torch.is_tensor(weights) else np.asarray(weights)
        label, keys = _layer_label(name)
        query_times, key_times = (token_times or {}).get(name) or (None, None)
        vmax = max(float(np.percentile(weights, 99)), 1e-12)
        image = None
        for head in range(n_heads):
            ax = axes[row, head]
            if head >= weights.shape[0]:
                ax.axis("off")
                continue
            image = ax.imshow(
                weights[head], vmin=0.0, vmax=vmax, cmap="viridis", aspect="auto", interpolation="nearest"
            )
            ax.set_title(f"{label} · head {head + 1}", fontsize=7)
            _token_axis(ax.xaxis, key_times, keys)
            _token_axis(ax.yaxis, query_times, "query token")
            ax.tick_params(labelsize=6)
        clipped = "max" if weights.max() > vmax else "neither"  # an arrow on the bar: some weights lie above
        bar = fig.colorbar(image, ax=axes[row, :].tolist(), extend=clipped)
        bar.set_label("attention weight", fontsize=7)
        bar.ax.tick_params(labelsize=6)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def _token_axis(axis, times, tokens: str) -> None:
    """A few ticks on a map's token axis, written as the tokens' times (`times`, one per token) or numbers."""
    axis.set_major_locator(MaxNLocator(nbins=3, integer=True))
    label = f"{tokens} number"
    if times is not None:
        label = f"{tokens} time"
        times = pd.DatetimeIndex(times)
        same_day = times[0].normalize() == times[-1].normalize()
        fmt = "%H:%M" if same_day else "%m-%d %H:%M"

        def at(x, _):
            i = round(x)
            return times[i].strftime(fmt) if 0 <= i < len(times) else ""

        axis.set_major_formatter(FuncFormatter(at))
        if same_day:
            label += f" ({times[0]:%Y-%m-%d})"
    axis.set_label_text(label, fontsize=6)


def _layer_label(name: str) -> tuple[str, str]:
    """`decoder.blocks.1.cross_attn` -> ("decoder 2 cross", "memory token"): a short panel title and
    what the keys are."""
    match = LAYER_NAME.search(name)
    if match is None:
        return name, "key token"
    label = f"{match['stack']} {int(match['index']) + 1} {match['kind']}"
    return label, "memory token" if match["kind"] == "cross" else "key token"


def fan_chart_figure(
    forecasts: pd.DataFrame, history: pd.DataFrame, n_windows: int = 4, units: Mapping[str, str] | None = None
):
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
        band = {"color": "tab:blue", "lw": 0}
        ax.fill_between(w.target_time, w["q0.1"], w["q0.9"], alpha=0.2, label="80% band", **band)
        ax.fill_between(w.target_time, w["q0.25"], w["q0.75"], alpha=0.35, label="50% band", **band)
        ax.plot(w.target_time, w["q0.5"], color="tab:blue", lw=1.2, label="forecast median")
        ax.plot(w.target_time, w.y_true, color="k", lw=1.2, label="measured")

    return _window_grid(forecasts, history, n_windows, draw, units=units)
