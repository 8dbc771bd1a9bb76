"""What an engineer reads of a judged table (the run's summary, predict.py, the figures) and its
evaluation against labels.

- `report_lines`: rows judged, alarms and events at the threshold (what it was calibrated on); the
  channels read as states and those constant in the train rows; each event (series, its first alarm -
  end time, rows, how long after its first alarm it was paged, top sensors, peak over the threshold);
  with labels, each labelled incident found (an event holds its first row), late (an event overlaps it
  later: by how many rows and how long after its first row) or missed (its peak score over the
  threshold), with how long after its first row its event was paged, and the normal rows' alarm rate beside its target
  (`model.false_alarm_rate`).
- `evaluate`: the same figures as numbers (`test/...` metrics of the run).
- `score_figures`: per series, the score over time with the threshold, each event as a band named in the
  legend (a short one widened to stay visible) and the labelled incidents drawn above the bands; and
  the channel-by-time map of the contributions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tsformer.data.anomaly import series_rows
from tsformer.jobs.anomaly.judging import duration_text, elapsed
from tsformer.tasks.alarms import true_runs
from tsformer.tasks.anomaly import Scores

MAX_LISTED = 20  # events and incidents listed in the summary (all of them are in the CSVs)
# a judged table is unlike the threshold's normal rows when more than this many times its target rate of
# rows are alarmed, and at least UNLIKE_LEAST rows (a few alarms on a short table are chance)
UNLIKE_FACTOR, UNLIKE_LEAST = 10.0, 10


def labelled_incidents(rows: pd.DataFrame) -> list[np.ndarray]:
    """Row positions of each labelled incident (a run of label 1 within a series)."""
    incidents = []
    for at in series_rows(rows).values():
        label = rows["label"].to_numpy()[at].astype(bool)
        padded = np.concatenate([[False], label, [False]])
        edges = np.flatnonzero(np.diff(padded.astype(int)))
        incidents += [at[a:b] for a, b in zip(edges[::2], edges[1::2], strict=True)]
    return incidents


def incidents_table(rows: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """Per labelled incident: `series_id, start, end, n_rows, status` (found: an event holds its first
    row | late: an event overlaps it later | missed), `delay_rows` and `delay` (from its first row to its
    first row inside an event), `page_delay_rows` and `page_delay` (from its first row to the page of its
    first event; 0 when that event was paged before the incident began), `event_ids`, `top_channels` (of
    its first event) and `peak_over_threshold` (its largest score / the threshold)."""
    event = rows["event_id"].to_numpy(dtype=float, na_value=-1)
    times = rows["time"]
    page_rows = dict(zip(events["event_id"].astype(int), events["page_delay_rows"].astype(int), strict=True))
    records = []
    for series in series_rows(rows).values():
        in_series = event[series]
        page_of = {int(e): int(np.flatnonzero(in_series == e)[0]) + page_rows[int(e)]
                   for e in np.unique(in_series[in_series >= 0])}  # each event's page, in the series  # fmt: skip
        for a, b in true_runs(rows["label"].to_numpy()[series].astype(bool)):
            at = series[a:b]
            ids = [int(e) for e in dict.fromkeys(event[at][event[at] >= 0])]
            delay = int(np.flatnonzero(event[at] >= 0)[0]) if ids else 0  # rows before the first in an event
            page = max(page_of[ids[0]], a) if ids else a  # an event paged before the incident: at its start
            status = "missed" if not ids else ("found" if delay == 0 else "late")
            records.append(
                {
                    "series_id": rows["series_id"].iloc[at[0]],
                    "start": times.iloc[at[0]],
                    "end": times.iloc[at[-1]],
                    "n_rows": len(at),
                    "status": status,
                    "delay_rows": delay if ids else None,
                    "delay": elapsed(times.iloc[at[0]], times.iloc[at[delay]]) if ids else None,
                    "page_delay_rows": page - a if ids else None,
                    "page_delay": elapsed(times.iloc[at[0]], times.iloc[series[page]]) if ids else None,
                    "event_ids": ";".join(map(str, ids)),
                    "top_channels": events.loc[events["event_id"] == ids[0], "top_channels"].iloc[0]
                    if ids
                    else "",
                    "peak_over_threshold": float((rows["score"].iloc[at] / rows["threshold"].iloc[at]).max()),
                }
            )
    columns = ["series_id", "start", "end", "n_rows", "status", "delay_rows", "delay", "page_delay_rows",
               "page_delay", "event_ids", "top_channels", "peak_over_threshold"]  # fmt: skip
    table = pd.DataFrame(records, columns=columns)
    return table.astype({"delay_rows": "Int64", "page_delay_rows": "Int64"})


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _after(duration: str | None, n_rows: int) -> str:
    """`0 rows after`, `2 rows (10 min) after`: how long after its start an event or incident was paged."""
    return f"{_rows(int(n_rows))}{f' ({duration})' if duration and n_rows else ''} after"


def plant_days(rows: pd.DataFrame) -> float | None:
    """The time the judged rows span, summed over the series, in days (one row's step added to each
    series' span); None when the rows have no times."""
    times = rows["time"]
    if pd.api.types.is_numeric_dtype(times):
        return None
    try:
        times = pd.to_datetime(times)
    except (TypeError, ValueError):
        return None
    total = pd.Timedelta(0)
    for at in series_rows(rows).values():
        span = times.iloc[at]
        step = span.diff().median() if len(span) > 1 else pd.Timedelta(0)
        total += span.iloc[-1] - span.iloc[0] + (step if pd.notna(step) else pd.Timedelta(0))
    return total / pd.Timedelta(days=1)


def false_event_ids(rows: pd.DataFrame, events: pd.DataFrame) -> set[int]:
    """The events that overlap no labelled row (the rows carry labels)."""
    label = rows["label"].to_numpy().astype(bool)
    event = rows["event_id"].to_numpy(dtype=float, na_value=-1)
    return {int(e) for e in events["event_id"] if not label[event == e].any()}


def evaluate(rows: pd.DataFrame, events: pd.DataFrame) -> dict[str, float]:
    """Alarm figures against the labels: the normal rows' alarm rate (and per 1,000), the incidents
    found (event recall), late and their mean and median delay in rows (to the first row in an event,
    and to its page), false events (and per day of
    the judged rows, when they have times), AUC-PR."""
    from sklearn.metrics import average_precision_score

    label = rows["label"].to_numpy().astype(bool)
    alarm = rows["alarm"].to_numpy().astype(bool)
    incidents = incidents_table(rows, events)
    hit = incidents["status"] != "missed"
    false_events = false_event_ids(rows, events)
    rate = float(alarm[~label].mean()) if (~label).any() else float("nan")
    days = plant_days(rows)
    metrics = {
        "normal_alarm_rate": rate,
        "false_alarms_per_1000": 1000.0 * rate,
        "event_recall": float(hit.mean()) if len(incidents) else float("nan"),
        "n_incidents": float(len(incidents)),
        "incidents_late": float((incidents["status"] == "late").sum()),
        "mean_delay_rows": float(incidents.loc[hit, "delay_rows"].mean()) if hit.any() else float("nan"),
        "n_events": float(len(events)),
        "false_events": float(len(false_events)),
        "false_events_per_day": float(len(false_events) / days) if days else float("nan"),
        "median_delay_rows": float(incidents.loc[hit, "delay_rows"].median()) if hit.any() else float("nan"),
        "mean_page_delay_rows": float(incidents.loc[hit, "page_delay_rows"].mean())
        if hit.any()
        else float("nan"),
        "median_page_delay_rows": float(incidents.loc[hit, "page_delay_rows"].median())
        if hit.any()
        else float("nan"),
    }
    if label.any() and (~label).any():
        metrics["auc_pr"] = float(average_precision_score(label, rows["score"].to_numpy()))
    return metrics


def report_lines(
    rows: pd.DataFrame,
    events: pd.DataFrame,
    target_rate: float,
    states: list[str],
    constants: list[str] = (),
    recalibrated_on: str | None = None,
    known: list[str] = (),
    threshold_rows: str = "validation",
) -> list[str]:
    """The lines an engineer reads of a judged table (module docstring); `threshold_rows` the rows the
    threshold was read from (`model.threshold_rows`)."""
    threshold = float(rows["threshold"].iloc[0]) if len(rows) else float("nan")
    alarms = int(rows["alarm"].sum())
    head = f"anomaly: {len(rows)} rows judged, {alarms} alarms in {len(events)} events"
    read_from = (
        "normal rows (the training rows too)" if threshold_rows == "normal" else "held-out normal rows"
    )
    lines = [
        f"{head} (threshold {threshold:.4g}: {target_rate:g} of the {read_from} score above it)",
        "state channels (0/1 in the train rows: entered as they are, not restored nor forecast): "
        + (", ".join(states) if states else "none"),
    ]
    if recalibrated_on:
        lines.append(
            f"threshold recalibrated on the rows declared normal (normal_rows={recalibrated_on}), "
            "not on the training's held-out rows"
        )
    if known:
        lines.append("known inputs (condition the detector, never hidden nor scored): " + ", ".join(known))
    if constants:
        lines.append(
            "constant channels (one value in the train rows: entered at it, any departure from it scores): "
            + ", ".join(constants)
        )
    false = false_event_ids(rows, events) if "label" in rows.columns else set()
    if len(events):
        lines.append(
            "events (series, first alarm - end, rows, when paged, top sensors, peak score / threshold at its time):"
        )
    for e in events.head(MAX_LISTED).itertuples():
        lines.append(
            f"  #{e.event_id} series {e.series_id}: {e.start} - {e.end} ({_rows(e.n_rows)}), "
            f"paged {_after(e.page_delay, e.page_delay_rows)} its first alarm, "
            f"{e.top_channels.replace(';', ', ')}; peak {e.peak_score / threshold:.3g}x at {e.peak_time}"
            + (": FALSE EVENT (overlaps no labelled incident)" if e.event_id in false else "")
        )
    if len(events) > MAX_LISTED:
        lines.append(f"  ... and {len(events) - MAX_LISTED} more (the events CSV)")
    if "label" not in rows.columns:
        rate = alarms / max(1, len(rows))
        return lines + [
            f"rows alarmed: {alarms} of {len(rows)} = {rate:.4f} (normal rows' target {target_rate:g})",
            *unlike_line(alarms, len(rows), target_rate, recalibrated_on),
        ]
    incidents = incidents_table(rows, events)
    counts = incidents["status"].value_counts()
    lines.append(
        f"labelled incidents: {len(incidents)}: {counts.get('found', 0)} found, {counts.get('late', 0)} late, "
        f"{counts.get('missed', 0)} missed"
    )
    for i in incidents.head(MAX_LISTED).itertuples():
        where = f"  series {i.series_id}: {i.start} - {i.end} ({_rows(i.n_rows)}): {i.status}"
        if i.status == "missed":
            lines.append(f"{where} (its peak score {i.peak_over_threshold:.3g}x the threshold)")
            continue
        late = ""
        if i.status == "late":
            late = f" by {i.delay} ({_rows(i.delay_rows)})" if i.delay else f" by {_rows(i.delay_rows)}"
        top = i.top_channels.replace(";", ", ")
        paged = f"paged {_after(i.page_delay, i.page_delay_rows)} its start"
        lines.append(f"{where}{late}, event #{i.event_ids.replace(';', ', #')} ({paged}), top sensors {top}")
    if len(incidents) > MAX_LISTED:
        lines.append(f"  ... and {len(incidents) - MAX_LISTED} more")
    normal = rows["label"].to_numpy() == 0
    n_alarmed = int(rows["alarm"].to_numpy()[normal].sum())
    rate = n_alarmed / max(1, int(normal.sum()))
    lines.append(
        f"normal rows alarmed: {n_alarmed} of {int(normal.sum())} = {rate:.4f} (target {target_rate:g}, "
        "model.false_alarm_rate)"
    )
    days, hit = plant_days(rows), incidents[incidents["status"] != "missed"]
    per_day = f" = {len(false) / days:.2f} per day over {days:.1f} days judged" if days else ""
    delays = ""
    if len(hit):
        median = hit["delay_rows"].median()
        times = pd.to_datetime(rows["time"]) if days else None
        step = times.diff().median() if times is not None else None

        def rows_text(n) -> str:
            return f"{n:g} rows" + (
                f" ({duration_text(n * step)})" if step is not None and pd.notna(step) else ""
            )

        delays = f"; median detection delay {rows_text(median)}, to the page {rows_text(hit['page_delay_rows'].median())}"
    lines.append(f"false events: {len(false)}{per_day}{delays}")
    return lines + unlike_line(n_alarmed, int(normal.sum()), target_rate, recalibrated_on)


def unlike_line(alarms: int, n_rows: int, target_rate: float, recalibrated_on: str | None) -> list[str]:
    """One line when `alarms` of `n_rows` (normal rows, or all rows without labels) are far more than
    the threshold's target lets normal rows reach (`UNLIKE_FACTOR` times, and `UNLIKE_LEAST` alarms at
    least): the table is unlike the normal rows the threshold came from, with the ways out."""
    if n_rows == 0 or alarms < UNLIKE_LEAST or alarms / n_rows <= UNLIKE_FACTOR * target_rate:
        return []
    rate = alarms / n_rows
    measured = (
        f"{rate:.4f} of the rows alarmed against the target {target_rate:g} ({rate / target_rate:.0f}x)"
    )
    if recalibrated_on:
        line = (
            f"still unlike its declared normal rows: {measured}; declare a longer normal stretch or "
            "fine-tune (train.py init_from=<this model> on its rows)"
        )
    else:
        line = (
            f"unlike the normal rows the threshold came from: {measured}, a new asset or a changed sensor? "
            "Recalibrate on a stretch of its rows known normal (predict.py --normal-rows A:B, or params "
            '{"normal_rows": "A:B"}) or fine-tune on them (train.py init_from=<this model>)'
        )
    return [line]


# -- figures ----------------------------------------------------------------------------------------


def _time_axis(rows: pd.DataFrame, at: np.ndarray):
    """The rows' times as the x axis (datetimes where they parse), and its label."""
    times = rows["time"].iloc[at]
    if pd.api.types.is_numeric_dtype(times):
        return times.to_numpy(), "time (the table's time column; its row where it has none)"
    try:
        return pd.to_datetime(times).to_numpy(), "time"
    except (TypeError, ValueError):
        return np.arange(len(at)), "row of the judged series"


def _spans(flags: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) positions of every run of True in `flags`."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(int), [0]])))
    return [(a, b - 1) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def score_figures(rows: pd.DataFrame, scores: Scores, max_series: int = 4) -> dict[str, object]:
    """`plots/anomaly_scores.png` (score over time, threshold, events, labelled incidents) and
    `plots/anomaly_contributions.png` (channel-by-time map of contributions), per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(series_rows(rows).items())[:max_series]
    fig_s, axes_s = plt.subplots(len(groups), 1, figsize=(11, 3.0 * len(groups)), squeeze=False)
    fig_c, axes_c = plt.subplots(len(groups), 1, figsize=(11, 0.8 + 0.35 * len(scores.channels) * len(groups)),
                                 squeeze=False)  # fmt: skip
    colours = plt.get_cmap("tab10")
    for (sid, at), ax, axc in zip(groups, axes_s[:, 0], axes_c[:, 0], strict=True):
        x, xlabel = _time_axis(rows, at)
        span = (x[-1] - x[0]) if len(x) > 1 else 1
        least = span / 200  # an event of one row stays visible: at least 0.5 % of the axis wide
        threshold = float(rows["threshold"].iloc[0])
        floor = 1e-3 * threshold if threshold > 0 else 1e-6  # a log axis: a score of 0 drawn at its foot
        ax.plot(x, np.maximum(rows["score"].to_numpy()[at], floor), lw=0.8, color="tab:blue", label="score",
                zorder=3)  # fmt: skip
        ax.axhline(threshold, color="k", ls="--", lw=0.8, label="threshold", zorder=4)
        event = rows["event_id"].to_numpy(dtype=float, na_value=-1)[at]
        for n, e in enumerate(np.unique(event[event >= 0]).astype(int)):
            inside = np.flatnonzero(event == e)
            a, b = x[inside[0]], x[inside[-1]]
            middle = a + (b - a) / 2
            half = max((b - a) / 2, least / 2)
            ax.axvspan(middle - half, middle + half, ymin=0.0, ymax=0.9, color=colours(n % 10), alpha=0.3, lw=0,
                       label=f"event #{e}" if n < 8 else None, zorder=1)  # fmt: skip
        if "label" in rows.columns:  # a strip above the event bands, never under them
            label = rows["label"].to_numpy()[at] == 1
            for k, (a, b) in enumerate(_spans(label)):
                middle, half = x[a] + (x[b] - x[a]) / 2, max((x[b] - x[a]) / 2, least / 2)
                ax.axvspan(middle - half, middle + half, ymin=0.92, ymax=1.0, color="red", lw=0, zorder=5,
                           label="labelled incident" if k == 0 else None)  # fmt: skip
        ax.set_yscale("log")
        ax.set_ylabel("anomaly score")
        ax.set_xlabel(xlabel)
        ax.set_title(f"series {sid}", fontsize=9, loc="right")
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=7, ncol=6, frameon=False)
        image = axc.imshow(np.log1p(scores.contributions[at].T), aspect="auto", interpolation="nearest",
                           cmap="magma", extent=(0, len(at), len(scores.channels) - 0.5, -0.5))  # fmt: skip
        axc.set_yticks(range(len(scores.channels)), scores.channels, fontsize=7)
        ticks = np.linspace(0, len(at) - 1, 6).astype(int)
        axc.set_xticks(ticks + 0.5, [str(v)[:16].replace("T", " ") for v in np.asarray(x)[ticks]], fontsize=7)
        axc.set_xlabel(xlabel)
        axc.set_title(f"series {sid}: each channel's share of the score, log(1 + contribution)", fontsize=9)
        fig_c.colorbar(image, ax=axc)
    for fig in (fig_s, fig_c):
        fig.tight_layout()
    return {"plots/anomaly_scores.png": fig_s, "plots/anomaly_contributions.png": fig_c}
