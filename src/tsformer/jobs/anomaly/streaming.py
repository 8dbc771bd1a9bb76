"""An anomaly model's answer to rows as they arrive (tsformer-serve's `params: {"stream": "<key>"}`): each
new row scored once, with the causal row score (from the windows that end at or before it, never a
later row), as scoring the whole table so far causally scores it (`AnomalyModel.judge(causal=True)`).

The state of a stream (`StreamState`, opaque to the server) keeps per series only what the next rows
need: its last `history_rows` rows (the window that ends at a new row, and what it reads: a forecast
detector's surprise of a row reads the `context_len` rows before it), with the `window` row score the
last windows' scores (a row's score averages the windows ending in the `L` rows up to it: each window is
scored once), the last `n - 1` alarms of the event rule's k-of-n, and the event being built. A series' first rows, fewer than one window, are kept
and answered once the window is complete (`pending_rows`). At most `MAX_SERIES` series per stream.

Events follow `tasks.alarms.event_spans`: an event opens (is paged) when its rows (from its first active
row, gaps merged) reach `min_duration`, and closes once `merge_gap` + 1 rows without an active row follow
it (no later row could merge into it then). Its start is set back to the first alarm of the `n` rows
that made its first row active, as in the whole table: those rows were answered before the page, and a
row's `event_id` is never changed once sent, so they keep a null `event_id`, and the event's record
holds them (`start`, `n_rows`, its peak and top sensors count them; `page_time` and `page_delay_rows`
say when it was paged). Each new row's `event_id` is the open event it belongs to when it is answered
(null before its event opened, or in a gap not yet merged); the events table
(`attrs["beside"]["events"]`) holds each event that opened or closed in the request, its `status` then
(`open` or `closed`), with the columns of the whole table's events: a closed event equals the whole
table's (start, end, page, rows, peak, top sensors).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from pandas.tseries.api import guess_datetime_format

from tsformer.data.anomaly import SEGMENT_COL, SERIES_COL, check_labels, check_table, rows_by_key, series_rows
from tsformer.data.schema import read_times
from tsformer.data.split_rows import SplitRows, frame_of
from tsformer.data.window_scores import causal_rows_of_windows
from tsformer.jobs.anomaly.judging import EVENT_COLUMNS as WHOLE_TABLE_EVENT_COLUMNS
from tsformer.jobs.anomaly.judging import N_TOP, AnomalyModel, elapsed
from tsformer.tasks.anomaly import ranked_channels

MAX_SERIES = 1000  # series per stream


@dataclass(frozen=True)
class Event:
    """The active run being built in a series (gaps merged), and its figures so far."""

    start: int  # series position of its first row (its first alarm)
    first_active: int  # of its first active row
    end: int  # after its last active row
    start_time: object
    end_time: object
    peak_score: float
    peak_time: object
    contributions: np.ndarray  # (C,) summed over its rows
    event_id: int | None = None  # set when it opens (is paged: min_duration active rows)
    page: int | None = None  # series position of its page
    page_time: object = None
    gap: tuple = ()  # rows after `end` not yet merged: (score, time, contributions) each


@dataclass(frozen=True)
class SeriesState:
    values: np.ndarray  # (K, C) float32: the last rows' standardised channels (the pending ones among them)
    offset: int  # series position of values' first row
    answered: int  # rows of the series answered
    alarms: np.ndarray  # the last n - 1 alarms (bool)
    recent: tuple = ()  # the last n - 1 rows' (score, time, contributions): an event's start reads them
    event: Event | None = None
    opened_end: int = (
        0  # after the last active row of the last event opened: a later event starts here at the earliest
    )
    # the `window` row score: the last L - 1 windows' mean contributions per part (W, C), and their last
    # rows' series positions (W,): a new row's score averages them with the windows ending at new rows
    window_means: dict = field(default_factory=dict)
    window_ends: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    active: bool = False  # whether the last row answered was active (hysteresis holds a run from it)
    pending: dict = field(default_factory=dict)  # the rows not answered yet (`_rows_of`), before one window


@dataclass(frozen=True)
class StreamState:
    series: dict = field(default_factory=dict)  # series id -> SeriesState
    n_events: int = 0  # events opened in this stream: the next event's id
    # the text times' format, as the whole table's would be read: given, or inferred from the first row
    time_format: str | None = None


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
    model: AnomalyModel, state: StreamState | None, table: pd.DataFrame | SplitRows, params: dict, source: str
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
    time_format = params["time_format"] or state.time_format
    plain = _plain_rows(model, table, time_format) if isinstance(table, SplitRows) else None
    if plain is None:  # a DataFrame, or rows the plain reader leaves to pandas
        table = frame_of(table)
        time_format = time_format or _inferred_format(table, model.time_col)
        rows_of, groups = _rows_of(model, table, time_format, source), series_rows(table)
    else:
        rows_of, groups, time_format = plain
    if len(set(state.series) | set(groups)) > MAX_SERIES:
        raise ValueError(f"{source}: a stream keeps at most {MAX_SERIES} series; send more under another key")
    series, n_events = dict(state.series), state.n_events
    answers, events, pending = [], [], {}
    for sid, at in groups.items():
        new = {name: column[at] for name, column in rows_of.items()}
        rows, record, series[sid], n_events = _series_answer(model, series.get(sid), new, n_events, sid)
        answers.append(rows)
        events += record
        if series[sid].pending:
            pending[str(sid)] = len(series[sid].pending["values"])
    if len(answers) == 1:
        rows = answers[0]
    else:
        rows = pd.concat(answers, ignore_index=True) if answers else pd.DataFrame()
    rows.attrs["beside"] = {
        "events": pd.DataFrame(events, columns=EVENT_COLUMNS) if events else NO_EVENTS.copy()
    }
    rows.attrs["stream"] = {"pending_rows": pending}
    return rows, StreamState(series, n_events, time_format)


EVENT_COLUMNS = [
    "event_id",
    "status",
    *WHOLE_TABLE_EVENT_COLUMNS[1:],
]  # the whole table's, with each one's status
NO_EVENTS = pd.DataFrame([], columns=EVENT_COLUMNS)


def _inferred_format(table: pd.DataFrame, time_col: str) -> str | None:
    """The format pandas infers from the first text time (as reading the whole table does), kept for the
    stream's later rows: inferring it again costs more than reading one row."""
    if time_col not in table.columns or pd.api.types.is_numeric_dtype(table[time_col]):
        return None
    first = table[time_col].dropna()
    return guess_datetime_format(first.iloc[0]) if len(first) and isinstance(first.iloc[0], str) else None


def _plain_rows(model: AnomalyModel, rows: SplitRows, time_format: str | None):
    """(`_rows_of`, `series_rows`, the time format) of a request's rows read without pandas' table when
    they are plain (the channels finite numbers, the series ids all ints or all text, the times text that
    `time_format`, or the one inferred from the first as `_inferred_format` does, reads, labels 0 or 1;
    no segment column); None otherwise: `_rows_of` reads their DataFrame, and words any error."""
    raw = rows.numbers(model.detector.channels)
    if raw is None or SEGMENT_COL in rows:
        return None
    out = {"raw": raw, "values": model.detector.standardised(raw)}
    if model.label_col is not None and model.label_col in rows:
        labels = rows.values(model.label_col)
        if not all(type(v) is int and v in (0, 1) for v in labels):
            return None
        out["label"] = np.array(labels, dtype=np.int64)
    groups = {None: np.arange(len(rows))}
    if SERIES_COL in rows:
        out["series_id"] = rows.ids(SERIES_COL)
        if out["series_id"] is None:
            return None
        groups = rows_by_key(out["series_id"])
    if model.time_col in rows:
        text = rows.values(model.time_col)
        if not all(type(t) is str for t in text):
            return None
        time_format = time_format or guess_datetime_format(text[0])
        times = _plain_times(text, time_format)
        if times is None:
            return None
        out["time"] = times
    return out, groups, time_format


def _plain_times(text: list[str], time_format: str | None) -> np.ndarray | None:
    """`datetime64[ns]` of `text` as `read_times` reads it with `time_format`, or None where that
    reading would infer a format, convert a time zone or refuse a cell (`read_times` does it then)."""
    if time_format is None:
        return None
    try:
        times = pd.to_datetime(np.array(text, dtype=object), format=time_format, errors="coerce")
    except (ValueError, TypeError):
        return None
    if times.tz is not None or times.isna().any():
        return None
    return times.to_numpy().astype("datetime64[ns]", copy=False)


def _rows_of(model: AnomalyModel, table: pd.DataFrame, time_format: str | None, source: str) -> dict:
    """The columns of `table` a stream reads, checked, as arrays of its rows: `raw` `(T, C)` channel values,
    `values` standardised, and where the table has them `series_id`, `time` (read as times) and `label`."""
    detector = model.detector
    try:  # the usual table (numeric channels, every cell a number) in one conversion
        raw = np.column_stack([table[c].to_numpy() for c in detector.channels]).astype(np.float64, copy=False)
        usable = bool(np.isfinite(raw).all())
    except (KeyError, ValueError, TypeError):
        usable = False
    if not usable:
        check_table(table, detector.channels, 1, source)  # one line naming the column and row
        raw = table[detector.channels].to_numpy(dtype=np.float64)
    check_labels(table, model.label_col)
    rows = {"raw": raw, "values": detector.standardised(raw)}
    if SERIES_COL in table.columns:
        rows["series_id"] = table[SERIES_COL].to_numpy()
    time_col = model.time_col
    if time_col in table.columns:
        times = table[time_col]
        if not pd.api.types.is_numeric_dtype(times):
            times = read_times(times, time_format, source)
        rows["time"] = times.to_numpy()
    if model.label_col is not None and model.label_col in table.columns:
        rows["label"] = pd.to_numeric(table[model.label_col]).astype(int).to_numpy()
    return rows


def _series_answer(model: AnomalyModel, before: SeriesState | None, new: dict, n_events: int, sid):
    """(judged rows, event records, next SeriesState, next event number) of one series' new rows
    (`_rows_of`)."""
    detector = model.detector
    rule = model.rule
    if before is None:
        empty = np.zeros((0, len(detector.channels)), dtype=np.float32)
        before = SeriesState(empty, 0, 0, np.zeros(rule.n - 1, dtype=bool))
    values = np.concatenate([before.values, new["values"]]) if len(before.values) else new["values"]
    rows = _joined(before.pending, new)  # the rows to answer: those kept pending, then the new ones
    total = before.offset + len(values)
    if total < max(detector.window, detector.window_length):  # no complete window yet: kept, pending
        none = _judged(model, {name: rows[name][:0] for name in ("label",) if name in rows}, None, [], [], [])
        return none, [], replace(before, values=values, pending=rows), n_events
    first = before.answered - before.offset  # position in `values` of the first row to answer
    scores, means, ends = _causal_scores(detector, values, first, before)
    scores = detector.with_departures(scores, rows["raw"])  # a constant channel's departures: each row's own
    alarm = scores.score > model.threshold
    times = rows["time"] if "time" in rows else np.arange(before.answered, total)
    event_ids, records, kept, n_events = _events(model, before, alarm, scores, times, sid, n_events)
    judged = _judged(model, rows, scores, alarm, event_ids, times)
    keep = history_rows(model)
    after = SeriesState(values[max(0, len(values) - keep) :] if keep else values[:0], total - min(keep, len(values)),
                        total, window_means=means, window_ends=ends, **kept)  # fmt: skip
    return judged, records, after, n_events


def _joined(pending: dict, new: dict) -> dict:
    """The rows kept pending followed by the new ones (the columns both have)."""
    if not pending:
        return new
    return {name: np.concatenate([pending[name], column]) for name, column in new.items() if name in pending}


def _causal_scores(detector, values: np.ndarray, first: int, before: SeriesState):
    """(`Scores` of the rows of `values` from `first` on, the last windows' mean contributions and their
    ends to keep) from the windows that end at those rows alone, and (`window` row score) the kept
    scores of the windows before them. `values` (standardised) start at the series' first row, or
    `history_rows` before `first`."""
    L, offset, n = detector.window_length, before.offset, len(values)
    start = max(0, first - (L - 1))  # the first window ending at a new row
    trim = max(0, start - _context(detector))  # the rows before what the windows read are left out
    starts = np.arange(start, n - L + 1)
    was_training = detector.training
    if was_training:
        detector.eval()
    try:
        import torch

        with torch.inference_mode():
            parts = detector.window_parts(values[trim:], starts - trim)
    finally:
        if was_training:
            detector.train()
    if detector.hparams.row_score != "window":
        rows = {name: detector.to_rows(p, starts, n, causal=True)[first:] for name, p in parts.items()}
        return detector.combined(rows), {}, np.zeros(0, dtype=int)
    ends = np.concatenate([before.window_ends, offset + starts + L - 1])  # series positions, in order
    means = {name: np.concatenate([before.window_means[name], p.mean(axis=1)]) if len(before.window_ends)
             else p.mean(axis=1) for name, p in parts.items()}  # fmt: skip
    rows = {
        name: causal_rows_of_windows(m, ends - offset - (L - 1), L, n)[first:] for name, m in means.items()
    }
    last = ends > offset + n - L  # the windows a later row still averages
    return detector.combined(rows), {name: m[last] for name, m in means.items()}, ends[last]


def _events(model, before: SeriesState, alarm, scores, times, sid, n_events: int):
    """Each new row's event id, the records of the events that opened or closed, what the series keeps
    of them (`SeriesState`'s `alarms`, `recent`, `event`, `opened_end`, `active`) and the next event
    number (`tasks.alarms.event_spans`, row by row)."""
    rule, position = model.rule, before.answered
    history = np.concatenate([before.alarms, alarm])
    counts = np.convolve(history.astype(int), np.ones(rule.n, dtype=int))[len(before.alarms) : len(history)]
    active = counts >= rule.k
    if rule.release < 1.0:  # hysteresis: a run goes on while the score stays above release x threshold
        held, previous = scores.score / model.threshold > rule.release, before.active
        for i in range(len(active)):
            active[i] = active[i] or (held[i] and previous)
            previous = active[i]
    # each row of `history`'s (score, time, contributions): the kept rows', then the new ones'
    new_rows = list(zip(scores.score.tolist(), times, scores.contributions, strict=True))
    rows_of = [*before.recent, *new_rows]
    pad = len(history) - len(rows_of)  # a new series' alarms start with n - 1 rows of no alarm
    event, opened_end, records, ids = before.event, before.opened_end, {}, []
    for i, is_active in enumerate(active):
        pos, (score, time, contrib) = position + i, new_rows[i]
        if is_active:
            if event is not None and pos - event.end <= rule.merge_gap:  # the run goes on (gap merged)
                event = _extended(event, pos, score, time, contrib)
            else:  # from the first alarm of the n rows that made this row active
                at = len(before.alarms) + i  # this row in `history`
                lo = max(0, at - rule.n + 1)
                first = lo + int(np.flatnonzero(history[lo : at + 1])[0])  # its first alarm in `history`
                start = max(pos - (at - first), opened_end)  # in the series
                raised = rows_of[at - pad - (pos - start) : at - pad + 1]  # the rows from `start` to this one
                peak = max(range(len(raised)), key=lambda r: raised[r][0])  # the first of the largest
                event = Event(start, pos, pos + 1, raised[0][1], time, raised[peak][0], raised[peak][1],
                              np.sum([c for _, _, c in raised], axis=0))  # fmt: skip
            if event.event_id is None and event.end - event.first_active >= rule.min_duration:
                event = replace(event, event_id=n_events, page=pos, page_time=time)
                n_events += 1
                records[event.event_id] = (event, "open")
            if event.event_id is not None:
                opened_end = event.end
        elif event is not None:
            event = replace(event, gap=(*event.gap, (score, time, contrib)))
            if pos + 1 - event.end > rule.merge_gap:  # no later row can merge into it
                if event.event_id is not None:
                    records[event.event_id] = (event, "closed")
                event = None
        ids.append(event.event_id if is_active and event is not None else None)
    for event_id, (e, status) in list(records.items()):
        if status == "open" and event is not None and event.event_id == event_id:
            records[event_id] = (event, "open")  # its figures at the end of the request
    keep = rule.n - 1
    kept = {
        "alarms": history[len(history) - keep :] if keep else history[:0],
        "recent": tuple(rows_of[max(0, len(rows_of) - keep) :]) if keep else (),
        "event": event,
        "opened_end": opened_end,
        "active": bool(active[-1]) if len(active) else before.active,
    }
    return ids, [_record(model, e, status, sid) for e, status in records.values()], kept, n_events


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
    names = model.detector.channels
    return {"event_id": event.event_id, "status": status, "series_id": sid if sid is not None else 0,
            "start": event.start_time, "end": event.end_time, "n_rows": event.end - event.start,
            "page_time": event.page_time, "page_delay_rows": event.page - event.start,
            "page_delay": elapsed(event.start_time, event.page_time),
            "peak_score": event.peak_score, "peak_time": event.peak_time,
            "top_channels": ";".join(c for c in ranked_channels(event.contributions, names, N_TOP) if c)}  # fmt: skip


def _judged(model: AnomalyModel, rows: dict, scores, alarm, event_ids, times) -> pd.DataFrame:
    """The rows (`_rows_of`) as the whole table's `judge` writes them."""
    n, n_top = len(times), min(N_TOP, len(model.detector.channels))
    top = np.asarray(scores.top_channels(n_top)) if scores is not None else np.zeros((0, n_top), dtype=object)
    columns = {
        "series_id": rows["series_id"] if "series_id" in rows else np.zeros(n, int),
        "time": times,
        "score": scores.score if scores is not None else np.zeros(0),
        "threshold": model.threshold,
        "alarm": np.asarray(alarm, dtype=int),
        "event_id": pd.array(event_ids, dtype="Int64"),
    } | {f"top_channel_{i + 1}": top[:, i] for i in range(n_top)}
    out = pd.DataFrame(columns)
    if "label" in rows:
        out["label"] = rows["label"]
    return out
