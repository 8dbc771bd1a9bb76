"""Calibrated probabilities: the temperature of a trained classifier, fitted without a test sample.

A network trained to a low training loss is over-confident on new samples: "p = 0.95" is right less often
than 95 % of the time. Temperature scaling (Guo et al. 2017) divides the logits by one number T > 0
fitted to minimise the log loss of samples the network did not train on; it changes no predicted class
(argmax is kept), only how sure the probabilities are. One parameter fitted on few samples does not
overfit them, where a per-class or histogram method would on the archive's tens of series.

Which samples, in the job's order (`calibrate`, called after the fit and before the test):
- `model.calibration=none`: T = 1;
- validation samples (held-out series, a stream's validation windows): their logits under the weights
  that are tested (the best checkpoint's, or the last);
- no validation sample (`data.val_fraction=0`: the recipe trains on every series): cross-fitting. The
  training series are cut into `model.calibration_folds` K stratified folds; for each, a network of the
  run's config (steps, augmentation, init_from; seed + 1 + k: `Fitted.fit_again`) trains on the other
  K - 1 folds, and its logits of the held-out fold are kept. The out-of-fold logits of every training series fit T, which the network trained
  on all of them then uses: K more fits, each as long as the run's. The channels keep the scaler fitted on
  every training series (the run's), so a fold network reads them as the final one does.
Test samples never enter: the test split is not read here (tested).

When the network classifies every calibration sample right, their log loss falls without end as T shrinks:
they show how far to soften the probabilities, not how far to sharpen them. T is then kept at 1 or above
(on GunPoint, sharpening to T = 0.12 on error-free folds raised the test log loss from 0.06 to 0.46:
benchmarks/RESULTS_classification.md).

The model folder keeps the result (`Calibration`, `tsformer.json`'s `calibration`); every path that loads
the folder (predict.py, tsformer-serve, the pyfunc model) gives softmax(logits / T).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from tsformer.data.sequences import ClassificationData, SampleDataset, pad_batch
from tsformer.jobs.base import Fitted

log = logging.getLogger(__name__)

# log T is searched in [log 1/20, log 20]: wider only fits a network that learnt nothing (T -> inf)
LOG_T_RANGE = (math.log(0.05), math.log(20.0))


@dataclass
class Calibration:
    """The temperature a classifier's probabilities are divided by, and what it was fitted on."""

    method: str  # "temperature" | "none"
    temperature: float
    fitted_on: str  # "validation" | "cross-fitting" | "leave-one-out" | "none": which samples' scores
    n_samples: int  # how many
    folds: int = 0  # cross-fitting's K (0 otherwise)

    def problems(self):
        if self.method not in ("temperature", "none"):
            yield f"calibration.method is {self.method!r}, expected 'temperature' or 'none'"
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            yield f"calibration.temperature is {self.temperature!r}, expected a number above 0"


NONE = Calibration("none", 1.0, "none", 0)


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    """Mean log loss of softmax(logits / T) `(S, C)` for class indices `(S,)`."""
    z = logits / temperature
    z = z - z.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-log_p[np.arange(len(labels)), labels].mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The T > 0 that minimises the log loss of `logits` `(S, C)` with `labels` `(S,)` (bounded search
    over log T, `LOG_T_RANGE`); at least 1 when every sample is classified right (module docstring)."""
    logits = np.asarray(logits, dtype=np.float64)
    low, high = LOG_T_RANGE
    if (logits.argmax(axis=1) == np.asarray(labels)).all():
        low = 0.0  # log 1: no error, no evidence for sharper probabilities
    found = minimize_scalar(
        lambda log_t: nll(logits, labels, math.exp(log_t)), bounds=(low, high), method="bounded"
    )
    return float(math.exp(found.x))


@torch.no_grad()
def sample_logits(task, dataset: SampleDataset, batch_size: int = 256) -> np.ndarray:
    """The task's uncalibrated logits `(S, C)` of every sample of `dataset`, in its order."""
    was_training = task.training
    task.eval()
    out = []
    for lo in range(0, len(dataset), batch_size):
        batch = pad_batch([dataset[i] for i in range(lo, min(lo + batch_size, len(dataset)))])
        out.append(task.logits(batch).double().cpu().numpy())
    task.train(was_training)
    return np.concatenate(out)


def stratified_folds(labels: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Fold index `(S,)` of each sample: each class's samples dealt round the folds in a seeded order."""
    rng = np.random.default_rng(seed)
    fold = np.empty(len(labels), dtype=np.int64)
    start = 0  # classes continue the round where the last one stopped: folds of even sizes
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        fold[members] = (start + np.arange(len(members))) % folds
        start = (start + len(members)) % folds
    return fold


class FoldData(ClassificationData):
    """Some of a set-up classification data module's training samples, as a data module to train on
    (no validation, no test: a fold network is scored by `sample_logits`)."""

    def __init__(self, parent: ClassificationData, keep: np.ndarray):
        super().__init__(
            parent.name, parent.batch_size, parent.eval_batch_size, parent.seed, parent.num_workers
        )
        self.classes, self.channel_names = list(parent.classes), list(parent.channel_names)
        self.channel_scaler = parent.channel_scaler
        train = parent.datasets["train"].subset(keep)
        empty = train.subset(np.zeros(len(train), dtype=bool))
        self.datasets = {"train": train, "val": empty, "test": empty}

    def setup(self, stage: str | None = None) -> None:
        pass  # built in __init__


def cross_fitted_logits(datamodule: ClassificationData, folds: int, fitted: Fitted) -> np.ndarray:
    """Out-of-fold logits `(S, C)` of every training sample (module docstring), in sample order."""
    train = datamodule.datasets["train"]
    fold = stratified_folds(train.labels, folds, fitted.seed)
    logits = np.zeros((len(train), datamodule.n_classes))
    for k in range(folds):
        task = fitted.fit_again(FoldData(datamodule, fold != k), fitted.seed + 1 + k)
        held = fold == k
        logits[held] = sample_logits(task, train.subset(held))
        log.info("calibration: fold %d of %d trained on %d series, scored %d", k + 1, folds, int((~held).sum()), int(held.sum()))  # fmt: skip
    return logits


def calibrate(task, datamodule, fitted: Fitted) -> Calibration:
    """Fit `task`'s temperature (module docstring), set it on the task and return it. The task holds the
    weights that are tested (the best checkpoint's are loaded first when there is one). A task that fits
    its own (`fits_own_temperature`: the random-kernel ridge's, on leave-one-out scores) keeps it."""
    if getattr(task, "fits_own_temperature", False):
        task.calibration = Calibration("temperature", task.temperature, "leave-one-out", task.loo_samples)
        return task.calibration
    if task.hparams.get("calibration", "temperature") == "none":
        found = NONE
    else:
        if fitted.best_checkpoint:
            state = torch.load(fitted.best_checkpoint, map_location="cpu", weights_only=True)["state_dict"]
            task.load_state_dict(state)
        val = datamodule.datasets["val"]
        if len(val):
            logits, labels, fitted_on, k = sample_logits(task, val), val.labels, "validation", 0
        else:
            k = int(task.hparams.calibration_folds)
            labels = datamodule.datasets["train"].labels
            logits, fitted_on = cross_fitted_logits(datamodule, k, fitted), "cross-fitting"
        found = Calibration("temperature", fit_temperature(logits, labels), fitted_on, len(labels), k)
        log.info(
            "calibration: temperature %.3f fitted on %d %s samples (log loss %.4f at T = 1, %.4f at T)",
            found.temperature, found.n_samples, fitted_on, nll(logits, labels, 1.0),
            nll(logits, labels, found.temperature),
        )  # fmt: skip
    task.temperature = found.temperature
    task.calibration = found
    return found
