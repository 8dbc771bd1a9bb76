"""Sequence classification with the encoder-only family: a whole sequence -> one class.

Batch (`tsformer.data.sequences`): x `(B, T, D)` scaled channels padded at the end, valid `(B, T)`
True on real steps, label `(B,)`. The encoder reads every real step with bidirectional attention (the
padding is masked out of attention) and the `classification` head pools a learned `[CLS]` token
(`pooling: cls`) or the mean over real steps (`pooling: mean`) into class logits. A sample's
probabilities depend on its own steps only: padding and the other samples of a batch change nothing.

Loss: cross-entropy with `label_smoothing` and optional class weights (`class_weights: balanced`
weighs each class by the inverse of its share of the training samples). `val/loss` is the plain log
loss (no smoothing, no weights): what checkpoints and early stopping follow.

Model options: positional encodings, norm placement, patches (`patch_len`: sequences of one length
only, as patch tokens take no padding mask) come from `model.net` and `_common.yaml` as in the other
families. `revin: true` standardises each sample's channels by its own mean and std over its real
steps (instance normalisation; nothing to reverse for a class), `revin_affine` adds a learned scale
and shift per channel. Channel independence has no meaning for one label per sample and is refused.
`model.net.norm_layer=batch` takes its training statistics over every token of a batch, padded steps
included: keep `layer` (the default) for sequences of unequal length (at test time BatchNorm uses its
running averages, so a sample's probabilities stay its own either way).

Probabilities are calibrated by a temperature (Guo et al. 2017): softmax(logits / T), one T > 0 for
every class, which changes no predicted class. The task holds T (`temperature`, 1 until fitted); the
classification job fits it after training on samples that are never test samples
(`tsformer.jobs.classification.calibration`: `calibration: temperature`, `calibration_folds`;
`calibration: none` keeps T = 1) and the model folder keeps it.

Test metrics (torchmetrics, every test sample): accuracy, balanced accuracy (macro recall), macro
F1, log loss, expected calibration error (15 bins) of the calibrated probabilities (the log loss and
ECE of T = 1 beside them, `test/uncalibrated_*`), beside the same metrics of two baselines fitted
on the training samples (`tasks/baselines.py` conventions: the first is `baseline`):
- `baseline`: the majority class, with the training class shares as probabilities;
- `logistic`: logistic regression on per-channel summaries (mean, std, min, max, last, slope over
  the real steps): what a practitioner fits first, in seconds, with probabilities for the log loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch import nn
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassCalibrationError, MulticlassF1Score

from tsformer.data.augment import Augmentation
from tsformer.models import EncoderOnly, EncoderOnlyConfig
from tsformer.tasks.base import CLASSES
from tsformer.tasks.optimisation import Optimisation, Optimised
from tsformer.tasks.setting_groups import InputOptions, TakesSettings

METRICS = ("accuracy", "balanced_accuracy", "macro_f1", "log_loss", "ece")
ECE_BINS = 15
CALIBRATIONS = ("temperature", "none")


def class_metrics(n_classes: int, prefix: str) -> MetricCollection:
    """The test metrics on probabilities `(B, C)` and labels `(B,)` (log loss is fed separately)."""
    return MetricCollection(
        {
            "accuracy": MulticlassAccuracy(n_classes, average="micro"),
            "balanced_accuracy": MulticlassAccuracy(n_classes, average="macro"),
            "macro_f1": MulticlassF1Score(n_classes, average="macro"),
            "ece": MulticlassCalibrationError(n_classes, n_bins=ECE_BINS, norm="l1"),
        },
        prefix=prefix,
    )


def score(proba: np.ndarray, labels: np.ndarray, n_classes: int) -> dict[str, float]:
    """Every metric of `METRICS` for probabilities `(S, C)` of samples with class indices `(S,)`."""
    p, y = torch.as_tensor(proba, dtype=torch.float64), torch.as_tensor(labels, dtype=torch.int64)
    out = {k: float(v) for k, v in class_metrics(n_classes, "").to(torch.float64)(p, y).items()}
    out["log_loss"] = float(F.nll_loss(p.clamp_min(1e-15).log(), y))
    return out


def summary_features(x: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per sample and channel over its real steps: mean, std, min, max, last, slope -> `(S, 6 * D)`.

    x `(S, T, D)` padded, valid `(S, T)`."""
    w = valid[..., None].astype(np.float64)  # (S, T, 1)
    n = w.sum(axis=1)  # (S, 1)
    mean = (x * w).sum(axis=1) / n  # (S, D)
    std = np.sqrt((((x - mean[:, None]) ** 2) * w).sum(axis=1) / n)
    last = x[np.arange(len(x)), valid.sum(axis=1) - 1]  # (S, D)
    t = np.arange(x.shape[1], dtype=np.float64)[None, :, None]  # (1, T, 1)
    t_mean = (t * w).sum(axis=1) / n  # (S, 1)
    t_var = (((t - t_mean[:, None]) ** 2) * w).sum(axis=1)  # (S, 1)
    slope = (((t - t_mean[:, None]) * (x - mean[:, None])) * w).sum(axis=1) / np.maximum(t_var, 1e-12)
    low, high = np.where(w > 0, x, np.inf).min(axis=1), np.where(w > 0, x, -np.inf).max(axis=1)
    return np.hstack([mean, std, low, high, last, slope])  # (S, 6 * D)


@dataclass
class MajorityClass:
    """The training samples' most frequent class; their class shares as probabilities."""

    name: str = "baseline"
    description: str = "the majority class of the training samples (their class shares as probabilities)"

    def fit(self, x, valid, labels, n_classes: int):
        self.shares = np.bincount(labels, minlength=n_classes) / len(labels)  # (C,)
        return self

    def predict_proba(self, x, valid) -> np.ndarray:
        return np.tile(self.shares, (len(x), 1))  # (S, C)


@dataclass
class SummaryLogistic:
    """Logistic regression on `summary_features` (standardised), fitted on the training samples."""

    name: str = "logistic"
    description: str = (
        "logistic regression on per-channel mean, std, min, max, last value and slope (scikit-learn)"
    )

    def fit(self, x, valid, labels, n_classes: int):
        self.n_classes = n_classes
        self.model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
        self.model.fit(summary_features(x, valid), labels)
        return self

    def predict_proba(self, x, valid) -> np.ndarray:
        proba = np.zeros((len(x), self.n_classes))  # (S, C): a class absent from training gets 0
        proba[:, self.model.classes_] = self.model.predict_proba(summary_features(x, valid))
        return proba


class ClassificationTask(TakesSettings, Optimised, L.LightningModule):
    """`model=enc_only_classifier` (see the module docstring)."""

    family = "enc_only_classifier"
    produces = CLASSES
    input_layout = "channels"  # the scaled channels of each step: masked pre-training reads the same
    setting_groups = (("optimisation", Optimisation), ("input_options", InputOptions))

    def __init__(
        self,
        net: dict,
        d_in: int,
        classes: list[str],
        pooling: str = "cls",
        label_smoothing: float = 0.0,
        class_weights: str | list[float] | None = None,
        class_counts: list[int] | None = None,
        loss: str = "cross_entropy",
        head: dict | None = None,
        static_embedding_dim: int = 4,  # shared setting of _common.yaml; sequences have no static columns
        monitor: str = "val/loss",  # what checkpoints and early stopping follow (conf/callbacks reads it)
        augment: dict | None = None,  # training-batch augmentation (data/augment.py); None: none
        calibration: str = "temperature",  # temperature | none (the module docstring)
        calibration_folds: int = 3,  # cross-fitted networks when no series is held out for validation
        **settings,  # of `setting_groups`: model.lr, model.revin, ...
    ):
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.take_settings(settings)
        options = self.input_options
        if loss != "cross_entropy":
            raise ValueError(f"loss={loss!r}: classification trains with cross_entropy")
        if (head or {}).get("kind", "point") != "point":
            raise ValueError(f"head={head['kind']}: distribution heads are for forecasts; a class needs none")
        if options.channel_independent:
            raise ValueError("channel_independent=true: one label per sample has no channel series to split")
        if monitor != "val/loss":
            raise ValueError(f"monitor={monitor!r}: a classifier is checkpointed on val/loss (the log loss)")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing={label_smoothing}: must be in [0, 1)")
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration={calibration!r}: choose one of {', '.join(CALIBRATIONS)}")
        if (
            isinstance(calibration_folds, bool)
            or not isinstance(calibration_folds, int)
            or calibration_folds < 2
        ):
            raise ValueError(f"calibration_folds={calibration_folds!r}: a whole number >= 2 (e.g. 3)")
        self.temperature = 1.0  # softmax(logits / T); the job fits T after training (not a weight)
        self.classes = [str(c) for c in classes]
        n_classes = len(self.classes)
        config = EncoderOnlyConfig(
            **net, d_in=d_in, head="classification", n_classes=n_classes, pooling=pooling,
            patch_len=options.patch_len, patch_stride=options.patch_stride,
        )  # fmt: skip
        self.net = EncoderOnly(config)
        self.affine = nn.Parameter(torch.zeros(2, d_in)) if options.revin_affine else None  # log-scale, shift
        self.register_buffer("weight", self._class_weights(class_weights, class_counts, n_classes))
        self.val_loss = MeanMetric()
        self.val_accuracy = MulticlassAccuracy(n_classes, average="micro")
        self.test_metrics = class_metrics(n_classes, "test/")
        self.test_log_loss = MeanMetric()
        self.baselines = [MajorityClass(), SummaryLogistic()]
        self.augment = Augmentation(**(augment or {}))
        self._augment_rng = np.random.default_rng(torch.initial_seed())  # the run's seed: repeatable
        self.test_outputs: dict[str, np.ndarray] = {}
        self._test_parts: list[tuple] = []

    @staticmethod
    def _class_weights(setting, counts, n_classes: int) -> torch.Tensor:
        if setting is None:
            return torch.ones(n_classes)
        if setting == "balanced":
            if counts is None or len(counts) != n_classes:
                raise ValueError("class_weights=balanced needs the training samples' class counts")
            counts = torch.as_tensor(counts, dtype=torch.float32).clamp_min(1.0)
            return counts.sum() / (n_classes * counts)
        if isinstance(setting, str) or len(setting) != n_classes:
            raise ValueError(f"class_weights={setting!r}: give null, balanced or {n_classes} numbers")
        return torch.as_tensor(setting, dtype=torch.float32)

    # -- the network ----------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """x `(B, T, D)`, valid `(B, T)` -> logits `(B, C)`."""
        if self.hparams.revin:
            x = self._instance_norm(x, valid)
        if bool(valid.all()):
            return self.net(x)  # nothing padded: patch tokens may be used
        if self.hparams.patch_len:
            raise ValueError(
                f"model.patch_len={self.hparams.patch_len}: patch tokens need sequences of one length, and "
                "this batch pads some; use patch_len=null for sequences of unequal length"
            )
        return self.net(x, valid)

    def _instance_norm(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Each sample's channels standardised over its real steps (padding stays 0)."""
        w = valid.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        n = w.sum(dim=1, keepdim=True).clamp_min(1.0)  # (B, 1, 1)
        mean = (x * w).sum(dim=1, keepdim=True) / n  # (B, 1, D)
        std = ((((x - mean) ** 2) * w).sum(dim=1, keepdim=True) / n + 1e-5).sqrt()
        z = (x - mean) / std
        if self.affine is not None:
            z = z * self.affine[0].exp() + self.affine[1]
        return z * w

    def logits(self, batch: dict) -> torch.Tensor:
        """Uncalibrated logits `(B, C)` of a padded batch."""
        return self(batch["x"], batch["valid"])

    def predict_proba(self, batch: dict) -> torch.Tensor:
        """Calibrated probabilities `(B, C)`: softmax(logits / temperature)."""
        return (self.logits(batch) / self.temperature).softmax(dim=-1)

    def augmented(self, batch: dict) -> dict:
        """`batch` as a training step sees it: the run's augmentations (`augment`), drawn from the task's
        own random stream (seeded by the run's seed)."""
        return self.augment(batch, len(self.classes), self._augment_rng)

    # -- Lightning steps ------------------------------------------------------------------------------

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if self.augment.active:  # training batches only: validation and test read the samples as they are
            batch = self.augmented(batch)
        logits = self(batch["x"], batch["valid"])
        target = batch.get("soft_label", batch["label"])  # mixup's mixed one-hot labels (B, C), or (B,)
        loss = F.cross_entropy(
            logits, target, weight=self.weight, label_smoothing=self.hparams.label_smoothing
        )
        self.log("train/loss", loss, prog_bar=True, batch_size=len(logits))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        logits = self(batch["x"], batch["valid"])
        self.val_loss.update(F.cross_entropy(logits, batch["label"], reduction="none"))
        self.val_accuracy.update(logits, batch["label"])

    def on_validation_epoch_end(self) -> None:
        self.log("val/loss", self.val_loss.compute(), prog_bar=True)
        self.log("val/accuracy", self.val_accuracy.compute())
        self.val_loss.reset()
        self.val_accuracy.reset()

    def on_test_epoch_start(self) -> None:
        self._test_parts = []

    def test_step(self, batch: dict, batch_idx: int) -> None:
        logits = self.logits(batch)
        calibrated = logits / self.temperature
        proba = calibrated.softmax(dim=-1)
        self.test_metrics.update(proba, batch["label"])
        self.test_log_loss.update(F.cross_entropy(calibrated, batch["label"], reduction="none"))
        parts = (batch["sample"], proba, batch["label"], logits.softmax(dim=-1))
        self._test_parts.append(tuple(t.detach().cpu() for t in parts))

    def on_test_epoch_end(self) -> None:
        self.log_dict(self.test_metrics.compute())
        self.log("test/log_loss", self.test_log_loss.compute())
        self.test_metrics.reset()
        self.test_log_loss.reset()
        samples = torch.cat([p[0] for p in self._test_parts]).numpy()
        order = np.argsort(samples, kind="stable")  # back to sample order
        proba = torch.cat([p[1] for p in self._test_parts]).double().numpy()[order]
        true = torch.cat([p[2] for p in self._test_parts]).numpy()[order]
        self.test_outputs = {"proba": proba, "true": true}
        uncalibrated = torch.cat([p[3] for p in self._test_parts]).double().numpy()[order]
        scores = score(uncalibrated, true, len(self.classes))
        self.log("test/uncalibrated_log_loss", scores["log_loss"])
        self.log("test/uncalibrated_ece", scores["ece"])
        self.log("calibration/temperature", float(self.temperature))
        datamodule = self.trainer.datamodule
        if datamodule is None:
            return
        train_x, train_valid = datamodule.datasets["train"].padded()
        test_x, test_valid = datamodule.datasets["test"].padded()
        train_labels = datamodule.labels("train")
        for baseline in self.baselines:
            baseline.fit(train_x, train_valid, train_labels, len(self.classes))
            p = baseline.predict_proba(test_x, test_valid)
            self.test_outputs[baseline.name] = p
            for name, value in score(p, true, len(self.classes)).items():
                self.log(f"test/{baseline.name}_{name}", value)
