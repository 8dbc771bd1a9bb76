"""Alarms and events: a threshold calibrated on normal rows, and one event per incident.

The threshold is set on the validation rows' scores (held-out normal rows), never on the scores of
the table being judged: it is the score that normal rows exceed at the target false-alarm rate
(`anomaly.false_alarm_rate`). Rates too small for the validation rows to show directly (0.001 of
2,000 rows is 2 rows) come from the tail of those scores: the peaks over their 95th percentile follow
a generalised Pareto distribution (Pickands-Balkema-de Haan; SPOT, Siffer et al., KDD 2017), whose
quantile gives the threshold.

A row is an alarm when its score is above the threshold. Alarms become events per series: a row is
active when at least `k` of the last `n` rows (itself included) are alarms (k = n = 1: every alarm),
active runs closer than `merge_gap` rows become one event, and events shorter than `min_duration`
rows are dropped. All of it reads only the past of a row but the merge, which joins two runs once the
second has begun.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from tsformer.settings import SettingError

TAIL_FRACTION = 0.05  # the peaks over this upper share of the validation scores fit the Pareto tail


def calibrate_threshold(val_scores: np.ndarray, false_alarm_rate: float) -> float:
    """The score that normal rows exceed with probability `false_alarm_rate`, from `val_scores`."""
    if not 0.0 < false_alarm_rate < 1.0:
        raise SettingError(f"anomaly.false_alarm_rate={false_alarm_rate}: a probability between 0 and 1")
    scores = np.sort(np.asarray(val_scores, dtype=float))
    n = len(scores)
    if n == 0:
        raise ValueError("no validation scores to calibrate the threshold on")
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
    merge_gap: int = 10  # active runs separated by at most this many rows are one event
    min_duration: int = 1  # rows; shorter events are dropped

    def __post_init__(self):
        if not 1 <= self.k <= self.n:
            raise SettingError(f"anomaly.events: k={self.k} of n={self.n} needs 1 <= k <= n")
        if self.merge_gap < 0 or self.min_duration < 1:
            raise SettingError(
                f"anomaly.events: merge_gap={self.merge_gap} must be >= 0 and min_duration={self.min_duration} >= 1"
            )


def events_of(alarm: np.ndarray, rule: EventRule) -> np.ndarray:
    """Event number per row of one series `(T,)`: -1 outside events, 0, 1, ... inside them."""
    alarm = np.asarray(alarm, dtype=bool)
    counts = np.convolve(alarm.astype(int), np.ones(rule.n, dtype=int))[: len(alarm)]  # last n rows
    active = counts >= rule.k
    runs = _runs(active)
    merged: list[list[int]] = []
    for start, end in runs:  # end exclusive
        if merged and start - merged[-1][1] <= rule.merge_gap:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    event = np.full(len(alarm), -1)
    number = 0
    for start, end in merged:
        if end - start >= rule.min_duration:
            event[start:end] = number
            number += 1
    return event


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of every run of True in `flags`, end exclusive."""
    padded = np.concatenate([[False], flags, [False]])
    edges = np.flatnonzero(np.diff(padded.astype(int)))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))
