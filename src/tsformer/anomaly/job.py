"""The names scripts imported from here before the anomaly job joined the jobs seam
(`tsformer.jobs.anomaly`); they live in `tsformer.anomaly.judging` and `tsformer.data.anomaly`."""

from tsformer.anomaly.judging import AnomalyModel, evaluate, figures, labelled_incidents
from tsformer.data.anomaly import check_labels, split_at

__all__ = ["AnomalyModel", "check_labels", "evaluate", "figures", "labelled_incidents", "split_at"]
