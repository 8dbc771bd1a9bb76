"""Anomaly scores against labels: TSB-AD's metrics, and what an alarm threshold gives.

Threshold-free metrics come from TSB-AD's published evaluation code (PyPI `TSB-AD==1.5`, installed
with `--no-deps`: its evaluation needs only numpy, scikit-learn, scipy and statsmodels), called the
way TSB-AD's benchmark scripts call it, so figures sit beside its published tables:
- the score is min-max scaled to [0, 1] (TSB-AD does so before `get_metrics`; every metric here
  depends only on the order of the scores, so this changes nothing but ties from rounding);
- the sliding window of the range-based metrics is `find_length_rank(X[:, 0], rank=1)`, from the
  first channel of the scored rows;
- VUS-PR (the headline), VUS-ROC, AUC-PR (average precision) and AUC-ROC, on every scored row.

At a threshold (calibrated on normal validation rows, never chosen on these labels), a row alarms
when its score is above the threshold, and the metrics are:
- `f1`, `precision`, `recall`: point-wise, every row counted once (no point adjustment: with it a
  random score reaches 0.7-0.99 on these sets);
- `event_recall`: the fraction of labelled anomaly segments with at least one alarm inside;
- `false_alarms_per_1000`: alarms on normal rows per 1,000 normal rows.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score, precision_recall_fscore_support, roc_auc_score
from sklearn.preprocessing import MinMaxScaler

from tsformer.data.schema import plain

# TSB-AD's defaults in `get_metrics`: the 'opt' implementation of VUS, 250 thresholds
VUS_VERSION = "opt"
VUS_THRESHOLDS = 250


def _tsb_ad():
    """TSB-AD's evaluation functions, imported from their submodules (the package's own __init__
    is empty, but its other modules need torch and more)."""
    try:
        from TSB_AD.evaluation.basic_metrics import generate_curve
        from TSB_AD.utils.slidingWindows import find_length_rank
    except ImportError as e:
        raise ImportError(
            f"error: anomaly evaluation needs TSB-AD's metrics ({e}); install them with "
            "`pip install statsmodels && pip install --no-deps TSB-AD==1.5` (make install does)"
        ) from e
    return generate_curve, find_length_rank


def sliding_window(x_first_channel: np.ndarray) -> int:
    """TSB-AD's window for the range-based metrics: the period of the first channel from its
    autocorrelation (`find_length_rank(X[:, 0], rank=1)`; 125 when none is found)."""
    _, find_length_rank = _tsb_ad()
    return int(find_length_rank(np.asarray(x_first_channel, dtype=float).reshape(-1, 1), rank=1))


def check_inputs(score, label, x_first_channel=None) -> tuple[np.ndarray, np.ndarray]:
    """`score` and `label` as float and int arrays of one length, or a ValueError naming what is wrong."""
    score = np.asarray(score, dtype=float)
    label = np.asarray(label)
    if score.ndim != 1 or label.ndim != 1 or len(score) != len(label):
        raise ValueError(f"error: score {score.shape} and label {label.shape} must be 1-D of one length")
    if x_first_channel is not None and np.shape(x_first_channel)[0] != len(score):
        raise ValueError(
            f"error: X's first channel has {np.shape(x_first_channel)[0]} rows, the score {len(score)}"
        )
    bad = np.flatnonzero(~np.isfinite(score))
    if len(bad):
        raise ValueError(f"error: the score is not finite at row {bad[0]} ({plain(score[bad[0]])})")
    bad = np.flatnonzero(~np.isin(label, (0, 1)))
    if len(bad):
        raise ValueError(f"error: labels must be 0 or 1; row {bad[0]} is {plain(label[bad[0]])!r}")
    label = label.astype(int)
    if label.min() == label.max():
        raise ValueError(f"error: every label is {label[0]}: the metrics need anomalous and normal rows")
    return score, label


def anomaly_segments(label: np.ndarray) -> list[tuple[int, int]]:
    """The labelled anomalies as (start, end) row ranges, end exclusive."""
    edges = np.diff(np.concatenate([[0], np.asarray(label, dtype=int), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def alarm_metrics(alarm: np.ndarray, label: np.ndarray) -> dict:
    """Point-wise F1, event recall and false alarms per 1,000 normal rows of boolean `alarm`."""
    alarm = np.asarray(alarm, dtype=bool)
    precision, recall, f1, _ = precision_recall_fscore_support(
        label, alarm, labels=[1], average="binary", zero_division=0
    )
    segments = anomaly_segments(label)
    normal = label == 0
    return {
        "f1": float(f1),
        "precision": float(precision),
        "recall": float(recall),
        "event_recall": sum(bool(alarm[a:b].any()) for a, b in segments) / len(segments),
        "false_alarms_per_1000": 1000.0 * float(alarm[normal].sum()) / float(normal.sum()),
        "alarm_rate": float(alarm.mean()),
    }


def evaluate(score, label, x_first_channel, threshold: float | None = None) -> dict:
    """TSB-AD's VUS-PR, VUS-ROC, AUC-PR and AUC-ROC of `score` (T,) against 0/1 `label` (T,), with the
    sliding window found on `x_first_channel` (T,) (the first channel of the same rows); with a
    `threshold`, also the alarm metrics of `score > threshold` (see the module's docstring)."""
    score, label = check_inputs(score, label, x_first_channel)
    generate_curve, _ = _tsb_ad()
    window = sliding_window(x_first_channel)
    scaled = MinMaxScaler(feature_range=(0, 1)).fit_transform(score.reshape(-1, 1)).ravel()  # as TSB-AD
    *_, vus_roc, vus_pr = generate_curve(label, scaled, window, VUS_VERSION, VUS_THRESHOLDS)
    out = {
        "vus_pr": float(vus_pr),
        "vus_roc": float(vus_roc),
        "auc_pr": float(average_precision_score(label, scaled)),
        "auc_roc": float(roc_auc_score(label, scaled)),
        "sliding_window": window,
        "rows": len(score),
        "anomalous_fraction": float(label.mean()),
    }
    if threshold is not None:
        out["threshold"] = float(threshold)
        out.update(alarm_metrics(score > threshold, label))
    return out


def per_series(scores: dict[str, np.ndarray], label, first_channel, series) -> tuple[dict, int]:
    """Threshold-free metrics of each method's score `scores[name]` (T,), computed per series (the
    labels of `series` (T,) told apart) and averaged over the series whose rows hold both anomalous and
    normal rows: ({name: {metric: mean}}, the number of series evaluated). A series with one kind of
    row has no ranking to measure; TSB-AD's table likewise averages per-file figures."""
    label, first_channel, series = np.asarray(label), np.asarray(first_channel), np.asarray(series)
    out: dict[str, dict[str, list[float]]] = {name: {} for name in scores}
    evaluated = 0
    for sid in dict.fromkeys(series):  # in order of appearance
        rows = series == sid
        if label[rows].min() == label[rows].max():
            continue
        evaluated += 1
        for name, score in scores.items():
            figures = evaluate(np.asarray(score)[rows], label[rows], first_channel[rows])
            for metric in ("vus_pr", "vus_roc", "auc_pr", "auc_roc"):
                out[name].setdefault(metric, []).append(figures[metric])
    return {name: {m: float(np.mean(v)) for m, v in ms.items()} for name, ms in out.items()}, evaluated
