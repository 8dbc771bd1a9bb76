"""Alarms and events: a threshold calibrated on normal rows, and one event per incident.

The threshold is set on the validation rows' scores (held-out normal rows), never on the scores of
the table being judged: it is the score that normal rows exceed at the target false-alarm rate
(`anomaly.false_alarm_rate`). Rates too small for the validation rows to show directly (0.001 of
2,000 rows is 2 rows) come from the tail of those scores: the peaks over their 95th percentile follow
a generalised Pareto distribution (Pickands-Balkema-de Haan; SPOT, Siffer et al., KDD 2017), whose
quantile gives the threshold. Optionally (`confidence`) the threshold is the upper confidence bound
of that quantile under a moving-block bootstrap of the validation scores, which are dependent
(neighbouring rows share windows).

A row is an alarm when its score is above the threshold. Alarms become events per series, as an
operator is paged: a row is active when at least `k` of the last `n` rows (itself included) are alarms
(k = n = 1: every alarm); with hysteresis (`release` < 1) an active run goes on while the score stays
above `release` x the threshold (a fault's score wavering about the threshold is one event, not many);
active runs closer than `merge_gap` rows become one event (the cool-down: alarms within it of an
event's end belong to that event, no new page); events shorter than `min_duration` active rows are
dropped. An event is paged at its first active row once it has lasted `min_duration` rows, and starts
at the first alarm of the `n` rows that made its first row active (the alarms that raised it; never
before the end of the event before it): the page's delay is `page - start` rows. All of it reads only
the past of a row but the merge, which joins two runs once the second has begun, and the start, which
the page sets back to rows already judged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from tsformer.settings import SettingError

TAIL_FRACTION = 0.05  # the peaks over this upper share of the validation scores fit the Pareto tail
LEVELS = {"median": 0.5, "tail": 1.0 - TAIL_FRACTION}  # a drifting threshold's level: a quantile of scores


def calibrate_threshold(
    val_scores: np.ndarray,
    false_alarm_rate: float,
    confidence: float | None = None,
    block: int = 1,
    n_boot: int = 200,
    seed: int = 0,
) -> float:
    """The score that normal rows exceed with probability `false_alarm_rate`, from `val_scores`.

    `confidence` (None: the estimate itself): the upper `confidence` bound of that score instead, over
    a moving-block bootstrap of `val_scores` in their order (`n_boot` resamples of blocks of `block`
    consecutive rows): normal rows like the validation rows then exceed it at the target rate or less
    with that confidence. The estimate alone often lies below the true threshold (more alarms than the
    target), and neighbouring scores share windows, so a few thousand validation rows hold far fewer
    independent ones than rows; `block` is the reach of that dependence (a detector's window)."""
    if not 0.0 < false_alarm_rate < 1.0:
        raise SettingError(f"anomaly.false_alarm_rate={false_alarm_rate}: a probability between 0 and 1")
    scores = np.asarray(val_scores, dtype=float)
    n = len(scores)
    if n == 0:
        raise ValueError("no validation scores to calibrate the threshold on")
    if confidence is None:
        return tail_quantile(scores, false_alarm_rate)
    if not 0.0 < confidence < 1.0:
        raise SettingError(f"threshold confidence={confidence}: a probability between 0 and 1")
    if not 1 <= block <= n or n_boot < 1:
        raise SettingError(
            f"threshold bootstrap: block={block} must lie in 1..{n} (the validation rows) and n_boot={n_boot} >= 1"
        )
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, n - block + 1, size=(n_boot, -(-n // block)))  # (n_boot, blocks)
    rows = (starts[:, :, None] + np.arange(block)).reshape(n_boot, -1)[:, :n]  # (n_boot, n)
    estimates = [tail_quantile(scores[r], false_alarm_rate) for r in rows]
    return float(np.quantile(estimates, confidence))


def tail_quantile(scores: np.ndarray, false_alarm_rate: float) -> float:
    """The (1 - `false_alarm_rate`) quantile of `scores`: read off the data when they show it, else
    from the generalised Pareto tail of the peaks over their (1 - TAIL_FRACTION) quantile."""
    scores = np.sort(scores)
    n = len(scores)
    if false_alarm_rate >= TAIL_FRACTION or n * false_alarm_rate >= 20:  # the data show it directly
        return float(np.quantile(scores, 1.0 - false_alarm_rate))
    u = float(np.quantile(scores, 1.0 - TAIL_FRACTION))
    excess = scores[scores > u] - u
    if len(excess) < 10 or np.ptp(excess) <= 0:  # too few peaks for a fit: the largest score
        return float(scores[-1])
    shape, _, scale = stats.genpareto.fit(excess, floc=0.0)
    tail_share = len(excess) / n
    return float(u + stats.genpareto.ppf(1.0 - false_alarm_rate / tail_share, shape, loc=0.0, scale=scale))


@dataclass
class EventRule:
    k: int = 1  # alarms among the last n rows that make a row active
    n: int = 1
    merge_gap: int = 10  # the cool-down: active runs separated by at most this many rows are one event
    min_duration: int = 1  # rows; shorter events are dropped
    release: float = 1.0  # hysteresis: an active run goes on while the score is above release x threshold

    def __post_init__(self):
        if not 1 <= self.k <= self.n:
            raise SettingError(f"anomaly.events: k={self.k} of n={self.n} needs 1 <= k <= n")
        if not 0.0 < self.release <= 1.0:
            raise SettingError(
                f"anomaly.events: release={self.release} must lie in (0, 1] (1: no hysteresis)"
            )
        if self.merge_gap < 0 or self.min_duration < 1:
            raise SettingError(
                f"anomaly.events: merge_gap={self.merge_gap} must be >= 0 and min_duration={self.min_duration} >= 1"
            )


@dataclass(frozen=True)
class Span:
    """One event's rows in a series: `start` (its first alarm), `page` (the row it is paged at) and
    `end` (after its last active row), positions in the series."""

    start: int
    page: int
    end: int


def event_spans(alarm: np.ndarray, rule: EventRule, over: np.ndarray | None = None) -> list[Span]:
    """The events of one series' `alarm (T,)` in order (module docstring). `over (T,)`: each row's score
    over the threshold, which hysteresis (`rule.release` < 1) reads."""
    alarm = np.asarray(alarm, dtype=bool)
    counts = np.convolve(alarm.astype(int), np.ones(rule.n, dtype=int))[: len(alarm)]  # last n rows
    active = counts >= rule.k
    if rule.release < 1.0 and over is not None:
        held = np.asarray(over) > rule.release
        for i in np.flatnonzero(held[1:] & ~active[1:]) + 1:  # in order: a run held goes on holding
            active[i] = active[i - 1]
    merged: list[list[int]] = []
    for start, end in true_runs(active):  # end exclusive
        if merged and start - merged[-1][1] <= rule.merge_gap:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    spans: list[Span] = []
    for first, end in merged:  # first: the first active row
        if end - first < rule.min_duration:
            continue
        ready = first + rule.min_duration - 1  # its first active row from here on is the page
        page = ready + int(np.flatnonzero(active[ready:end])[0])
        raised = max(0, first - rule.n + 1)  # the rows whose alarms made `first` active
        start = raised + int(np.flatnonzero(alarm[raised : first + 1])[0])
        spans.append(Span(max(start, spans[-1].end if spans else 0), page, end))
    return spans


def events_of(alarm: np.ndarray, rule: EventRule, over: np.ndarray | None = None) -> np.ndarray:
    """Event number per row of one series `(T,)`: -1 outside events, 0, 1, ... inside them, from each
    event's first alarm to its last active row (`event_spans`)."""
    event = np.full(len(alarm), -1)
    for number, span in enumerate(event_spans(alarm, rule, over)):
        event[span.start : span.end] = number
    return event


def true_runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of every run of True in `flags`, end exclusive."""
    padded = np.concatenate([[False], flags, [False]])
    edges = np.flatnonzero(np.diff(padded.astype(int)))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


@dataclass
class DriftRule:
    """A threshold that follows slow drift (`model.threshold_drift`): at each row, the base threshold
    times the drift factor, the `level` of the scores of the `span` rows that ended `delay` rows before
    it over the validation rows' same level, at least 1 and at most `max_factor`. `level`: `median`, or
    `tail`, their (1 - TAIL_FRACTION) quantile, where the tail the threshold is read from begins (a
    drift that widens the scores' tail more than their middle moves it where the median does not).

    The guard: a row's threshold reads no row of the last `delay` rows, so a fault that grows over
    fewer rows than `delay` (a slow drift fault) is judged against the level from before it began and
    cannot raise its own threshold; the median needs more than half the `span` rows raised to move (the
    tail more than TAIL_FRACTION of them), and `max_factor` caps how far any drift may carry the
    threshold."""

    span: int = 300
    delay: int = 500
    max_factor: float = 4.0
    level: str = "median"

    def __post_init__(self):
        if self.span < 1 or self.delay < 0 or self.max_factor < 1.0:
            raise SettingError(
                f"anomaly.threshold_drift: span={self.span} >= 1, delay={self.delay} >= 0 and "
                f"max_factor={self.max_factor} >= 1 are needed"
            )
        if self.level not in LEVELS:
            raise SettingError(f"anomaly.threshold_drift: level={self.level!r} is one of {', '.join(LEVELS)}")

    def of(self, scores: np.ndarray, axis: int | None = None) -> np.ndarray:
        """The rule's level of `scores` (along `axis`)."""
        return np.quantile(scores, LEVELS[self.level], axis=axis)


def drifting_threshold(scores: np.ndarray, threshold: float, val_level: float, rule: DriftRule) -> np.ndarray:
    """`(T,)` the threshold at each row of one series' `scores (T,)` (`DriftRule`); the base `threshold`
    where fewer than `span` rows lie `delay` rows back. `val_level`: the validation scores' `rule.level`."""
    scores = np.asarray(scores, dtype=float)
    out = np.full(len(scores), float(threshold))
    ends = np.arange(len(scores)) - rule.delay  # the reference rows end (excluded) here
    ready = np.flatnonzero(ends >= rule.span)
    if len(ready) == 0 or not val_level > 0:
        return out
    windows = np.lib.stride_tricks.sliding_window_view(scores, rule.span)  # (T - span + 1, span)
    levels = rule.of(windows, axis=1)  # levels[i]: of rows i .. i + span - 1
    factor = np.clip(levels[ends[ready] - rule.span] / val_level, 1.0, rule.max_factor)
    out[ready] = threshold * factor
    return out
