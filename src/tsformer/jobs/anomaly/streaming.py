"""An anomaly model's answer to rows as they arrive (tsformer-serve's `params: {"stream": "<key>"}`): each
new row scored once, with the causal row score (from the windows that end at or before it, never a
later row), as scoring the whole table so far causally scores it (`AnomalyModel.judge(causal=True)`).

The state of a stream (`StreamState`, opaque to the server) keeps per series only what the next rows
need: its last `history_rows` rows (the window that ends at a new row, and what it reads: a forecast
detector's surprise of a row reads the `context_len` rows before it), with the `window` row score the
last windows' scores (a row's score averages the windows ending in the `L` rows up to it: each window is
scored once), the last `n - 1` alarms of the event rule's k-of-n, and the event being built. A series' first rows, fewer than one window, are kept
and answered once the window is complete (`pending_rows`). At most `MAX_SERIES` series per stream.

Events follow `tasks.alarms.events_of`: an event opens when its rows (from its first active row, gaps
merged) reach `min_duration`, and closes once `merge_gap` + 1 rows without an active row follow it (no
later row could merge into it then). Each new row's `event_id` is the open event it belongs to when it
is answered (null before its event opened, or in a gap not yet merged); the events table
(`attrs["beside"]["events"]`) holds each event that opened or closed in the request, its `status` then
(`open` or `closed`), with the columns of the whole table's events: a closed event equals the whole
table's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from tsformer.data.anomaly import SERIES_COL, check_labels, check_table, series_rows
from tsformer.data.schema import read_times
from tsformer.data.window_scores import causal_rows_of_windows
from tsformer.jobs.anomaly.judging import N_TOP, AnomalyModel

MAX_SERIES = 1000  # series per stream


@dataclass(frozen=True)
class Event:
    """The active run being built in a series (gaps merged), and its figures so far."""

    start: int  # series position of its first row
    end: int  # after its last active row
    start_time: object
    end_time: object
    peak_score: float
    peak_time: object
    contributions: np.ndarray  # (C,) summed over its rows
    event_id: int | None = None  # set when it opens (min_duration rows)
    gap: tuple = ()  # rows after `end` not yet merged: (score, time, contributions) each


@dataclass(frozen=True)
class SeriesState:
    kept: pd.DataFrame  # the last rows (the pending ones among them)
    offset: int  # series position of kept's first row
    answered: int  # rows of the series answered
    alarms: np.ndarray  # the last n - 1 alarms (bool)
    event: Event | None = None
    # the `window` row score: the last L - 1 windows' mean contributions per part (W, C), and their last
    # rows' series positions (W,): a new row's score averages them with the windows ending at new rows
    window_means: dict = field(default_factory=dict)
    window_ends: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    active: bool = False  # whether the last row answered was active (hysteresis holds a run from it)


@dataclass(frozen=True)
class StreamState:
    series: dict = field(default_factory=dict)  # series id -> SeriesState
    n_events: int = 0  # events opened in this stream: the next event's id


def history_rows(model: AnomalyModel) -> int:
    """Rows of a series the next causal rows need: the `L - 1` rows before a new row (the window that
    ends at it), and before those, for a forecast detector, the `context_len` rows its surprise of a row
    reads. (The `window` row score's earlier windows are kept as their scores: `SeriesState`.)"""
    detector = model.detector
    return _context(detector) + detector.window_length - 1


def _context(detector) -> int:
    """Rows before a window's row that its contribution reads (the forecast detector's context)."""
    return detector.window - 1 if detector.method == "forecast" else 0


def answer_stream(
    model: AnomalyModel, state: StreamState | None, table: pd.DataFrame, params: dict, source: str
) -> tuple[pd.DataFrame, StreamState]:
    """(the judged new rows, the next state) of `table`'s rows (after those of `state`); the rows the
    whole table's `judge` gives, but for `event_id` (module docstring), the events in attrs["beside"],
    the series still short of one window in attrs["stream"]["pending_rows"]. `state` is left as it was."""
    state = state or StreamState()
    detector = model.detector
    if detector.hparams.get("threshold_drift"):  # its threshold reads the rows `delay` back: not kept here
        raise ValueError(
            "this model's threshold follows slow drift (model.threshold_drift): it answers whole tables, "
            "not streams; send the table without params.stream"
        )
    check_table(table, detector.channels, 1, source)
    check_labels(table, model.label_col)
    time_col = model.time_col
    if time_col in table.columns and not pd.api.types.is_numeric_dtype(table[time_col]):
        table = table.assign(**{time_col: read_times(table[time_col], params["time_format"], source)})
    keep = [
        c for c in (SERIES_COL, time_col, *detector.channels, model.label_col) if c and c in table.columns
    ]
    table = table[list(dict.fromkeys(keep))].reset_index(drop=True)
    groups = series_rows(table)
    if len(set(state.series) | set(groups)) > MAX_SERIES:
        raise ValueError(f"{source}: a stream keeps at most {MAX_SERIES} series; send more under another key")
    series, n_events = dict(state.series), state.n_events
    answers, events, pending = [], [], {}
    for sid, at in groups.items():
        rows, record, series[sid], n_events = _series_answer(
            model, series.get(sid), table.iloc[at], sid, n_events
        )
        answers.append(rows)
        events += record
        if series[sid].answered < series[sid].offset + len(series[sid].kept):
            pending[str(sid)] = series[sid].offset + len(series[sid].kept) - series[sid].answered
    rows = pd.concat(answers, ignore_index=True) if answers else pd.DataFrame()
    rows.attrs["beside"] = {"events": pd.DataFrame(events, columns=EVENT_COLUMNS)}
    rows.attrs["stream"] = {"pending_rows": pending}
    return rows, StreamState(series, n_events)


EVENT_COLUMNS = ["event_id", "status", "series_id", "start", "end", "n_rows", "peak_score", "peak_time"]
EVENT_COLUMNS += ["top_channels"]


def _series_answer(model: AnomalyModel, before: SeriesState | None, new: pd.DataFrame, sid, n_events: int):
    """(judged rows, event records, next SeriesState, next event number) of one series' new rows."""
    detector = model.detector
    rule = model.rule
    if before is None:
        before = SeriesState(new.iloc[:0], 0, 0, np.zeros(rule.n - 1, dtype=bool))
    segment = pd.concat([before.kept, new], ignore_index=True)
    total = before.offset + len(segment)
    if total < max(detector.window, detector.window_length):  # no complete window yet: kept, pending
        return _judged(model, segment.iloc[:0], None, [], []), [], replace(before, kept=segment), n_events
    first = before.answered - before.offset  # segment position of the first row to answer
    scores, means, ends = _causal_scores(detector, segment, first, before)
    alarm = scores.score > model.threshold
    times = segment[model.time_col].to_numpy()[first:] if model.time_col in segment else np.arange(first, len(segment)) + before.offset  # fmt: skip
    event_ids, records, alarms, event, n_events, active = _events(
        model, before, alarm, scores, times, before.answered, sid, n_events
    )
    rows = _judged(model, segment.iloc[first:], scores, alarm, event_ids)
    keep = history_rows(model)
    after = SeriesState(segment.iloc[-keep:].reset_index(drop=True) if keep else segment.iloc[:0],
                        total - min(keep, len(segment)), total, alarms, event, means, ends, active)  # fmt: skip
    return rows, records, after, n_events


def _causal_scores(detector, segment: pd.DataFrame, first: int, before: SeriesState):
    """(`Scores` of the segment's rows from `first` on, the last windows' mean contributions and their
    ends to keep) from the windows that end at those rows alone, and (`window` row score) the kept
    scores of the windows before them. The segment starts at the series' first row, or `history_rows`
    before `first`."""
    L, offset = detector.window_length, before.offset
    start = max(0, first - (L - 1))  # the first window ending at a new row
    trim = max(0, start - _context(detector))  # the rows before what the windows read are left out
    values = detector.standardised(segment.iloc[trim:])
    starts = np.arange(start, len(segment) - L + 1)
    was_training = detector.training
    detector.eval()
    try:
        import torch

        with torch.inference_mode():
            parts = detector.window_parts(values, starts - trim)
    finally:
        detector.train(was_training)
    if detector.hparams.row_score != "window":
        rows = {
            name: detector.to_rows(p, starts, len(segment), causal=True)[first:] for name, p in parts.items()
        }
        return detector.combined(rows), {}, np.zeros(0, dtype=int)
    ends = np.concatenate([before.window_ends, offset + starts + L - 1])  # series positions, in order
    means = {name: np.concatenate([before.window_means[name], p.mean(axis=1)]) if len(before.window_ends)
             else p.mean(axis=1) for name, p in parts.items()}  # fmt: skip
    rows = {
        name: causal_rows_of_windows(m, ends - offset - (L - 1), L, len(segment))[first:]
        for name, m in means.items()
    }
    last = ends > offset + len(segment) - L  # the windows a later row still averages
    return detector.combined(rows), {name: m[last] for name, m in means.items()}, ends[last]


def _events(model, before: SeriesState, alarm, scores, times, position: int, sid, n_events: int):
    """Each new row's event id, the records of the events that opened or closed, the last n - 1 alarms,
    the event being built, the next event number and whether the last row is active
    (`tasks.alarms.events_of`, row by row)."""
    rule = model.rule
    history = np.concatenate([before.alarms, alarm])
    counts = np.convolve(history.astype(int), np.ones(rule.n, dtype=int))[len(before.alarms) : len(history)]
    active = counts >= rule.k
    if rule.release < 1.0:  # hysteresis: a run goes on while the score stays above release x threshold
        held, previous = scores.score / model.threshold > rule.release, before.active
        for i in range(len(active)):
            active[i] = active[i] or (held[i] and previous)
            previous = active[i]
    event, records, ids = before.event, {}, []
    for i, is_active in enumerate(active):
        pos, score, contrib = position + i, float(scores.score[i]), scores.contributions[i]
        if is_active:
            if event is not None and pos - event.end <= rule.merge_gap:  # the run goes on (gap merged)
                event = _extended(event, pos, score, times[i], contrib)
            else:
                event = Event(pos, pos + 1, times[i], times[i], score, times[i], contrib.copy())
            if event.event_id is None and event.end - event.start >= rule.min_duration:
                event = replace(event, event_id=n_events)
                n_events += 1
                records[event.event_id] = (event, "open")
        elif event is not None:
            event = replace(event, gap=(*event.gap, (score, times[i], contrib)))
            if pos + 1 - event.end > rule.merge_gap:  # no later row can merge into it
                if event.event_id is not None:
                    records[event.event_id] = (event, "closed")
                event = None
        ids.append(event.event_id if is_active and event is not None else None)
    for event_id, (e, status) in list(records.items()):
        if status == "open" and event is not None and event.event_id == event_id:
            records[event_id] = (event, "open")  # its figures at the end of the request
    last = history[len(history) - (rule.n - 1) :] if rule.n > 1 else history[:0]
    last_active = bool(active[-1]) if len(active) else before.active
    records = [_record(model, e, status, sid) for e, status in records.values()]
    return ids, records, last, event, n_events, last_active


def _extended(event: Event, pos: int, score: float, time, contrib: np.ndarray) -> Event:
    """`event` with the gap rows before `pos` and row `pos` merged into it."""
    peak_score, peak_time, total = event.peak_score, event.peak_time, event.contributions.copy()
    for s, t, c in [*event.gap, (score, time, contrib)]:
        if s > peak_score:
            peak_score, peak_time = s, t
        total += c
    return replace(event, end=pos + 1, end_time=time, peak_score=peak_score, peak_time=peak_time,
                   contributions=total, gap=())  # fmt: skip


def _record(model: AnomalyModel, event: Event, status: str, sid) -> dict:
    names = np.asarray(model.detector.channels)
    return {"event_id": event.event_id, "status": status, "series_id": sid if sid is not None else 0,
            "start": event.start_time, "end": event.end_time, "n_rows": event.end - event.start,
            "peak_score": event.peak_score, "peak_time": event.peak_time,
            "top_channels": ";".join(names[np.argsort(-event.contributions)[:N_TOP]])}  # fmt: skip


def _judged(model: AnomalyModel, rows: pd.DataFrame, scores, alarm, event_ids) -> pd.DataFrame:
    """The new rows as the whole table's `judge` writes them."""
    n, n_top = len(rows), min(N_TOP, len(model.detector.channels))
    top = np.asarray(scores.top_channels(n_top)) if scores is not None else np.zeros((0, n_top), dtype=object)
    columns = {
        "series_id": rows[SERIES_COL].to_numpy() if SERIES_COL in rows.columns else np.zeros(n, int),
        "time": rows[model.time_col].to_numpy() if model.time_col in rows.columns else np.arange(n),
        "score": scores.score if scores is not None else np.zeros(0),
        "threshold": model.threshold,
        "alarm": np.asarray(alarm, dtype=int),
        "event_id": pd.array(event_ids, dtype="Int64"),
    } | {f"top_channel_{i + 1}": top[:, i] for i in range(n_top)}
    out = pd.DataFrame(columns)
    if model.label_col is not None and model.label_col in rows.columns:
        out["label"] = pd.to_numeric(rows[model.label_col]).astype(int).to_numpy()
    return out
