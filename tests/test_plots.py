"""The figures every run logs, as a plant engineer reads them: each panel says what its y-axis is
(the variable, in original units), one legend serves the whole figure, a reconstruction says
"reconstruction" and "measured" (never "forecast" or "origin"), date tick labels do not run into
each other, and an attention map has a colour bar, one colour scale per layer and times on its axes.

The window figures are drawn from small synthetic frames (no training); the attention figure from
an untrained tiny model on the simulated plant.
"""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
from hydra.utils import instantiate

from conftest import TINY
from tsformer.jobs.forecasting.export import SplitView
from tsformer.jobs.forecasting.plots import (
    _concise_dates,
    attention_figure,
    error_by_step_figure,
    fan_chart_figure,
    forecast_windows_figure,
)
from tsformer.train import build_task, compose_config

VARIABLES = ["OT", "HUFL"]


def frames(context: int, horizon: int, freq: str, reconstruction: bool = False):
    """(forecasts frame, history) of two windows of one series, ETT-like by default (hourly, 96 + 96
    steps: 8 days per panel); a reconstruction's windows start at their `origin_time`, steps from 0."""
    rng = np.random.default_rng(0)
    times = pd.date_range("2017-01-01", periods=4 * (context + horizon), freq=freq)
    walks = {v: rng.normal(size=len(times)).cumsum() for v in VARIABLES}
    history = pd.DataFrame({"series_id": 0, "time": times, **walks})
    rows = []
    for origin in (times[context - 1], times[2 * context + horizon]):
        steps = range(context) if reconstruction else range(1, horizon + 1)
        for step, var in itertools.product(steps, VARIABLES):
            target_time = origin + step * (times[1] - times[0])
            y = float(history.loc[history.time == target_time, var].iloc[0])
            rows.append((0, origin, target_time, step, var, y, y + rng.normal()))
    columns = ["series_id", "origin_time", "target_time", "step", "variable", "y_true", "y_pred"]
    return pd.DataFrame(rows, columns=columns), history


def with_quantiles(forecasts: pd.DataFrame) -> pd.DataFrame:
    offsets = {"q0.1": -1.3, "q0.25": -0.7, "q0.5": 0.0, "q0.75": 0.7, "q0.9": 1.3}
    return forecasts.assign(**{name: forecasts.y_pred + offset for name, offset in offsets.items()})


def panels(fig):
    return [ax for ax in fig.axes if ax.lines]


def legend_texts(fig) -> list[str]:
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes)]
    return [t.get_text() for legend in legends if legend for t in legend.get_texts()]


def overlapping_tick_labels(fig) -> list[tuple[str, str]]:
    """Pairs of neighbouring x tick labels of any panel whose drawn boxes intersect."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in panels(fig):
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        boxes = [t.get_window_extent(renderer) for t in labels]
        order = np.argsort([b.x0 for b in boxes])
        for i, j in itertools.pairwise(order):
            if boxes[i].overlaps(boxes[j]):
                found.append((labels[i].get_text(), labels[j].get_text()))
    return found


@pytest.mark.parametrize("freq", ["h", "15min", "1min"])
def test_forecast_windows_readable(freq):
    forecasts, history = frames(96, 96, freq)
    fig = forecast_windows_figure(forecasts, history, n_windows=2)
    for ax in panels(fig):
        label = ax.get_ylabel()
        assert any(v in label for v in VARIABLES) and "original units" in label, label
    assert not overlapping_tick_labels(fig)
    assert len(fig.legends) == 1 and {"measured", "forecast"} <= set(legend_texts(fig))  # one for all panels
    plt.close(fig)


@pytest.mark.parametrize("span", ["50s", "170s", "170min", "2.5h", "60h", "40D", "800D", "1100D", "30000D"])
def test_date_axes_find_ticks_for_any_span(span, recwarn):
    """The date locator picks an interval for every span (matplotlib warns and falls back otherwise)."""
    fig, ax = plt.subplots()
    times = pd.date_range("2024-01-01", periods=50, end=pd.Timestamp("2024-01-01") + pd.Timedelta(span))
    ax.plot(times, np.arange(50))
    _concise_dates(ax.xaxis)
    fig.canvas.draw()
    plt.close(fig)
    assert not [w for w in recwarn if "AutoDateLocator" in str(w.message)]


def test_fan_chart_readable():
    forecasts, history = frames(96, 96, "h")
    fig = fan_chart_figure(with_quantiles(forecasts), history, n_windows=2)
    assert all("original units" in ax.get_ylabel() for ax in panels(fig))
    assert not overlapping_tick_labels(fig)
    assert len(fig.legends) == 1 and {"measured", "80% band", "50% band"} <= set(legend_texts(fig))
    plt.close(fig)


def test_reconstruction_says_reconstruction_and_measured():
    forecasts, history = frames(100, 0, "min", reconstruction=True)
    fig = forecast_windows_figure(forecasts, history, n_windows=2, reconstruction=True)
    texts = legend_texts(fig)
    assert {"measured", "reconstruction"} <= set(texts)
    words = " ".join([*texts, *(ax.get_title() for ax in fig.axes)]).lower()
    for word in ("forecast", "origin", "context"):
        assert word not in words, (word, words)
    assert not overlapping_tick_labels(fig)
    plt.close(fig)

    errors = forecasts.assign(mae=(forecasts.y_pred - forecasts.y_true).abs())
    mae = errors.groupby(["variable", "step"], as_index=False).mae.mean()
    fig = error_by_step_figure(mae, mae.assign(mae=mae.mae * 2), reconstruction=True)
    (ax,) = fig.axes
    assert "original units" in ax.get_ylabel()
    assert "window" in ax.get_xlabel() and "ahead" not in ax.get_xlabel()
    plt.close(fig)


@pytest.mark.parametrize("family", ["enc_dec", "enc_only", "dec_only"])
def test_attention_has_colour_bars_one_scale_per_layer_and_times(tmp_path, family):
    cfg = compose_config([*TINY, f"model={family}", "model.net.n_layers=2"], tmp_path)
    dm = instantiate(cfg.data)
    dm.setup()
    torch.manual_seed(0)
    fig = attention_figure(build_task(cfg.model, dm).eval(), SplitView.of(dm, "test"), dm.datasets["test"])
    maps = [ax for ax in fig.axes if ax.images]
    bars = [ax for ax in fig.axes if not ax.images and ax.get_ylabel() == "attention weight"]
    rows = {ax.get_title().split(" · ")[0] for ax in maps}  # one row per layer
    assert len(bars) == len(rows) >= 2
    for row in rows:
        limits = {ax.images[0].get_clim() for ax in maps if ax.get_title().startswith(row + " ·")}
        assert len(limits) == 1 and min(limits)[0] == 0.0, (row, limits)  # the heads of a layer compare
    fig.canvas.draw()
    for ax in maps:
        assert "time" in ax.get_xlabel() and "time" in ax.get_ylabel(), (ax.get_xlabel(), ax.get_ylabel())
        ticks = [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
        assert ticks and all(":" in t for t in ticks), ticks  # 11:20, not token numbers
    plt.close(fig)


def legend_inside_figure(fig) -> bool:
    """Every legend of `fig` drawn within the figure's bounds (nothing cut off at its edges)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    assert legends
    bounds = fig.bbox
    return all(
        bounds.x0 <= (box := legend.get_window_extent(renderer)).x0
        and box.x1 <= bounds.x1
        and bounds.y0 <= box.y0
        and box.y1 <= bounds.y1
        for legend in legends
    )


@pytest.mark.parametrize("n_variables", [1, 2])
def test_legends_lie_inside_the_figure_at_every_width(n_variables):
    """One target makes the narrowest figure: its legend was cut off on both sides ("foreca")."""
    forecasts, history = frames(96, 96, "h")
    forecasts = forecasts[forecasts.variable.isin(VARIABLES[:n_variables])]
    errors = forecasts.assign(mae=(forecasts.y_pred - forecasts.y_true).abs())
    mae = errors.groupby(["variable", "step"], as_index=False).mae.mean()
    for fig in (
        forecast_windows_figure(forecasts, history, n_windows=2),
        fan_chart_figure(with_quantiles(forecasts), history, n_windows=2),
        error_by_step_figure(mae, mae.assign(mae=mae.mae * 2), freq="h"),
    ):
        assert legend_inside_figure(fig)
        plt.close(fig)


def test_units_name_the_y_axes_where_data_units_gives_them():
    forecasts, history = frames(96, 96, "h")
    units = {"OT": "°C"}  # HUFL has none
    fig = forecast_windows_figure(forecasts, history, n_windows=2, units=units)
    labels = {ax.get_ylabel() for ax in panels(fig)}
    assert labels == {"OT\n(°C)", "HUFL\n(original units)"}
    plt.close(fig)
    errors = forecasts.assign(mae=(forecasts.y_pred - forecasts.y_true).abs())
    mae = errors.groupby(["variable", "step"], as_index=False).mae.mean()
    fig = error_by_step_figure(mae, units={"OT": "°C", "HUFL": "°C"})
    assert "(°C)" in fig.axes[0].get_ylabel()
    plt.close(fig)


@pytest.mark.parametrize(
    ("freq", "unit", "last"),
    [("h", "days", 4.0), ("5min", "hours", 8.0), ("1min", "minutes", 96.0), ("10s", "minutes", 16.0)],
)
def test_error_by_step_says_the_steps_in_time_too(freq, unit, last):
    """96 steps of an hour: 4 days; of 5 minutes: 8 hours; of a minute: 96 minutes (under two hours);
    of 10 s: 16 minutes."""
    mae = pd.DataFrame({"variable": "OT", "step": np.arange(1, 97), "mae": np.linspace(0.1, 1.0, 96)})
    fig = error_by_step_figure(mae, freq=pd.tseries.frequencies.to_offset(freq))
    (ax,) = fig.axes
    (top,) = ax.child_axes  # the second x axis, above
    assert top.get_xlabel() == f"time ahead of the origin ({unit})"
    fig.canvas.draw()
    step_to_time = top._functions[0]  # the axis' transform from steps to time
    assert step_to_time(96) == pytest.approx(last)
    plt.close(fig)


def test_data_units_reach_the_figures_view_and_a_unit_for_no_column_is_refused(tmp_path):
    cfg = compose_config([*TINY, 'data.units={dynamic_temperature:"°C",supply_voltage:V}'], tmp_path)
    dm = instantiate(cfg.data)
    dm.setup()
    assert SplitView.of(dm, "test").units == {"dynamic_temperature": "°C", "supply_voltage": "V"}
    with pytest.raises(Exception, match=r"data.units names \[.power.\]"):  # Hydra wraps the ValueError
        instantiate(compose_config([*TINY, "data.units={power:kW}"], tmp_path).data)
