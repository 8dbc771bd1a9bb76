"""Anomaly detection: scores per step and channel from a model trained on normal rows, calibrated
alarms and events, and their evaluation (docs/anomaly.md). The detectors are tasks
(`tsformer.tasks.anomaly`), the run is a job (`tsformer.jobs.anomaly`)."""

from tsformer.anomaly.alarms import EventRule, calibrate_threshold, events_of
from tsformer.anomaly.detector import METHODS, AnomalyDetector, Scores, fit_detector

__all__ = [
    "METHODS",
    "AnomalyDetector",
    "EventRule",
    "Scores",
    "calibrate_threshold",
    "events_of",
    "fit_detector",
]
