"""`model=random_kernel_ridge`: the ridge classifier on random dilated kernel features
(`tsformer.models.random_kernel_ridge`) as a model of the classification job.

The closed-form peer of the Transformer classifier: its weights are solved, not trained. At the fit's
start the kernels draw their dilations, channel subsets and biases from the training series, the ridge
takes its penalty by leave-one-out error and the temperature of the probabilities is fitted on the
training series' leave-one-out scores (no validation series needed: `data.val_fraction=0` fits on
every training series, as the pool benchmark did). One epoch, no optimiser step.

Everything fitted is a buffer of `net` (a plain module) in the state dict (the kernels' channel subsets and biases, the features'
standardisation, the ridge weights); what shapes them (the dilations and the biases per dilation) is
written into the hparams after the fit, so a model folder rebuilds the model from its config and
tensors alone. Its probabilities, metrics, baselines and test outputs are the Transformer
classifier's (`ClassificationTask`): the job, the classes CSV, predict.py and the pyfunc model read
it unchanged. `logits` are the ridge's scores (on the classes' +1/-1 scale).
"""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from tsformer.models.random_kernel_ridge import RandomKernelRidge
from tsformer.tasks.classification import ClassificationTask, MajorityClass, SummaryLogistic, class_metrics
from tsformer.tasks.solved import SolvedAtFitStart


class FittedTensors(nn.Module):
    """The fitted tensors, as buffers (none moves by gradient). `restored`: whether the task's ridge holds
    them (`RandomKernelRidgeTask.fitted_ridge`); a load of a state dict, the task's or this module's own,
    clears it."""

    def __init__(self):
        super().__init__()
        self.restored = False

    def _load_from_state_dict(self, *args, **kwargs):
        self.restored = False  # the buffers take new numbers: the ridge is restored from them again
        super()._load_from_state_dict(*args, **kwargs)


class RandomKernelRidgeTask(SolvedAtFitStart, ClassificationTask):
    """`model=random_kernel_ridge` (see the module docstring).

    `n_features`: PPV features (84 kernels x dilations x biases); `diff`: half of them from the series'
    first differences; `seed`: the kernels' draws. `layout` is the fit's (null before it)."""

    family = "random_kernel_ridge"
    setting_groups = ()
    fits_own_temperature = True  # the job's calibration keeps the leave-one-out temperature

    def __init__(
        self,
        d_in: int,
        classes: list[str],
        class_counts: list[int] | None = None,
        n_features: int = 9996,
        diff: bool = False,
        seed: int = 0,
        layout: list | None = None,
        temperature: float = 1.0,
        head: dict | None = None,  # the run's head group (conf/train.yaml): the point head only
        monitor: str = "val/loss",  # what checkpoints and early stopping follow (conf/callbacks reads it)
    ):
        settings = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        L.LightningModule.__init__(self)  # not ClassificationTask's: no network, no optimisation settings
        self.save_hyperparameters(settings, logger=False)
        if (head or {}).get("kind", "point") != "point":
            raise ValueError(f"head={head['kind']}: distribution heads are for forecasts; a class needs none")
        if monitor != "val/loss":
            raise ValueError(f"monitor={monitor!r}: a classifier is checkpointed on val/loss (the log loss)")
        if n_features < 84 * (2 if diff else 1):
            raise ValueError(
                f"model.n_features={n_features}: at least one feature per kernel (84, x2 with diff)"
            )
        self.classes = [str(c) for c in classes]
        n_classes = len(self.classes)
        self.temperature = float(temperature)
        self.loo_samples = 0  # the training series whose leave-one-out scores fitted the temperature
        self.ridge = RandomKernelRidge(n_features, diff=diff, seed=seed)
        self.net = FittedTensors()  # the fitted tensors, as buffers (none moves by gradient)
        for name, shape in self._shapes(layout, d_in, n_classes).items():
            self.net.register_buffer(name, torch.zeros(shape, dtype=torch.float64))
        self.val_loss = MeanMetric()
        self.val_accuracy = MulticlassAccuracy(n_classes, average="micro")
        self.test_metrics = class_metrics(n_classes, "test/")
        self.test_log_loss = MeanMetric()
        self.baselines = [MajorityClass(), SummaryLogistic()]
        self.test_outputs: dict[str, np.ndarray] = {}
        self._test_parts: list[tuple] = []

    @staticmethod
    def _shapes(layout, d_in: int, n_classes: int) -> dict[str, tuple]:
        """The buffers' shapes from the fit's layout (none before the fit)."""
        if layout is None:
            return {}
        shapes, n_out = {}, 0
        for i, (dilations, n_biases) in enumerate(layout):
            shapes[f"view{i}_channels"] = (len(dilations), d_in, 84)
            shapes[f"view{i}_biases"] = (84 * sum(n_biases),)
            n_out += 84 * sum(n_biases)
        return {
            **shapes,
            "mean": (n_out,),
            "scale": (n_out,),
            "coef": (n_out, n_classes),
            "y_mean": (n_classes,),
        }

    @property
    def fitted(self) -> bool:
        return self.hparams.layout is not None

    # -- the fit, in closed form ----------------------------------------------------------------------

    def solve(self) -> None:
        train = self.trainer.datamodule.datasets["train"]
        x, valid = (torch.as_tensor(a) for a in train.padded())
        self.ridge.fit(x, valid, train.labels, len(self.classes))
        layout = [[list(d), list(n)] for d, n in self.ridge.layout()]
        self.hparams.layout = layout
        for name, shape in self._shapes(layout, x.shape[-1], len(self.classes)).items():
            self.net.register_buffer(name, torch.zeros(shape, dtype=torch.float64))
        for name, tensor in self.ridge.fitted_tensors().items():
            getattr(self.net, name).copy_(tensor)
        self.temperature = self.hparams.temperature = self.ridge.temperature
        self.loo_samples = len(train)
        self.net.restored = False  # new buffers: restored from them at the first scores

    def configure_optimizers(self):
        return None  # nothing moves by gradient

    def training_step(self, batch: dict, batch_idx: int) -> None:
        return None  # the weights are solved for (`solve`)

    # -- scores ---------------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """x `(B, T, D)`, valid `(B, T)` -> the ridge's scores `(B, C)` (float64)."""
        if not self.fitted:
            raise RuntimeError(
                "model=random_kernel_ridge: not fitted (train.py fits it on the training series)"
            )
        scores = self.fitted_ridge().decision(x.detach().cpu().float(), valid.detach().cpu())
        return torch.as_tensor(scores, device=x.device)

    def fitted_ridge(self) -> RandomKernelRidge:
        """The ridge of the buffers, restored from them once (after the fit, or a load), not every batch."""
        if not self.net.restored:
            self.ridge.restore(self.hparams.layout, dict(self.net.named_buffers()), self.temperature)
            self.net.restored = True
        return self.ridge

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        scores = self(batch["x"], batch["valid"]) / self.temperature  # val/loss: the calibrated log loss
        self.val_loss.update(F.cross_entropy(scores, batch["label"], reduction="none"))
        self.val_accuracy.update(scores, batch["label"])
