"""Anomaly detection: scores from trained models, calibrated alarms, events and their evaluation."""
