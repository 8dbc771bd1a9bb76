"""Anomaly detection: scores per row and channel from a model trained on normal rows, calibrated
alarms and events, and their evaluation (docs/anomaly.md). The detectors are tasks
(`tsformer.tasks.anomaly`), and so are their threshold and event rule (`tsformer.tasks.alarms`).

- `job.py`: the job (`JOB`): judged rows, events, metrics beside classical baselines, the summary
- `judging.py`: the detector's model folder (`AnomalyContract`), `AnomalyModel`, events
- `report.py`: what an engineer reads (events, labelled incidents found / late / missed, the normal
  rows' alarm rate beside its target), its figures and metrics
- `evaluation.py`: TSB-AD's ranking metrics, alarm metrics
- `baselines.py`: Hotelling T², PCA residual, IsolationForest, random, the window memory and the windowed
  PCA residual, fitted on the same rows
"""
