"""`WindowTask`: what every family shares in training and evaluation (a LightningModule).

A family subclass says only how its network is built and how a batch of windows becomes (a) a
teacher-forced prediction with its labels and (b) a prediction of the target steps. Everything else
lives here once:
- the model options that wrap any family (`model_options.py`: RevIN, channel independence; patch
  tokens are passed to the network of the families that take them), checked against the family's
  `supported_options`;
- loss (MSE, MAE or Huber), AdamW with linear warmup then cosine decay (warmup matters for Post-Norm);
- validation: `val/loss` (the training loss) and `val/mse`, `val/mae` of real predictions (for the
  autoregressive families: generated, feeding predictions back), monitored for checkpoints;
- test: `test/mse`, `test/mae` on scaled values (the literature's convention), `test/mae_orig`,
  `test/rmse_orig` in original units (also per target variable), and the same for the naive
  baseline on the same windows (`test/baseline_*`) and for any extra baselines
  (`test/<name>_*`, see `baselines.py`); predictions of every window kept for the export.

Batches are the dicts of `tsformer.data.WindowDataset`: hist_target (B, N, Dy), hist_known (B, N, Dk),
hist_observed (B, N, Do), fut_target (B, M, Dy), fut_known (B, M, Dk), fut_observed (B, M, Do), window (B,).
"""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection

from tsformer.nn.attention import collect_attention, stack_query_rows
from tsformer.tasks.baselines import Persistence
from tsformer.tasks.model_options import ModelOptions
from tsformer.tasks.static import StaticCovariates

LOSSES = {"mse": F.mse_loss, "mae": F.l1_loss, "huber": F.huber_loss}


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier: linear warmup from ~0 to 1, then cosine decay to `min_lr_ratio`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def valid_steps(batch: dict, part: str) -> torch.Tensor:
    """`batch["<part>_valid"]` `(B, T)` bool; all True for batches built without it (by hand)."""
    if f"{part}_valid" in batch:
        return batch[f"{part}_valid"]
    return torch.ones(batch[f"{part}_target"].shape[:2], dtype=torch.bool, device=batch[f"{part}_target"].device)


class WindowTask(L.LightningModule):
    family = "base"  # the name used for runs and tags

    def __init__(
        self,
        net: dict,
        d_target: int,
        d_known: int,
        d_observed: int,
        context_len: int,
        horizon: int,
        target_names: list[str] | None = None,
        loss: str = "mse",
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.05,
        baselines: list | None = None,
        d_static_num: int = 0,
        static_vocab_sizes: list[int] | None = None,
        static_embedding_dim: int = 4,
        revin: bool = False,
        revin_affine: bool = False,
        channel_independent: bool = False,
        patch_len: int | None = None,
        patch_stride: int | None = None,
    ):
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; choose one of {sorted(LOSSES)}")
        # Saved into checkpoints so the task can be rebuilt; logged to MLflow once, by train.py.
        self.save_hyperparameters(logger=False, ignore=["baselines"])
        self._check_options()
        self.loss_fn = LOSSES[loss]
        self.target_names = list(target_names or [f"target_{i}" for i in range(d_target)])
        # static covariates enter as extra known channels of every step (see static.py)
        self.static = StaticCovariates(d_static_num, static_vocab_sizes or [], static_embedding_dim)
        self.d_known_in = d_known + self.static.width  # known channels the network reads
        self.options = ModelOptions(d_target, revin, revin_affine, channel_independent)
        self.d_target_net = self.options.d_target_net  # target channels the network reads: 1 with CI
        self.net = self.build_net(dict(net))

        scaled = MetricCollection({"mse": MeanSquaredError(), "mae": MeanAbsoluteError()})
        orig = MetricCollection(
            {
                "mae_orig": MeanAbsoluteError(),
                "rmse_orig": MeanSquaredError(squared=False),
                "mae_orig_by_var": MeanAbsoluteError(num_outputs=d_target),
            }
        )
        # the naive baseline of the job first (its metrics are test/baseline_*), then any extra ones
        self.baselines = [self.naive_baseline(), *(baselines or [])]
        names = [b.name for b in self.baselines]
        if len(set(names)) != len(names):
            raise ValueError(f"baseline names must differ, got {names}")
        self.val_metrics = scaled.clone(prefix="val/")

        def test_metrics(prefix: str) -> MetricCollection:
            return MetricCollection([scaled.clone(prefix=prefix), orig.clone(prefix=prefix)])

        self.test_metrics = torch.nn.ModuleDict(
            {"model": test_metrics("test/"), **{b.name: test_metrics(f"test/{b.name}_") for b in self.baselines}}
        )
        self.test_outputs: dict[str, np.ndarray] | None = None
        self._test_chunks: list[dict[str, torch.Tensor]] = []

    # -- what a family defines ------------------------------------------------------------------
    # A family works on the batch as the network sees it (`ModelOptions.enter`): static features in
    # the known covariates, targets normalised with RevIN, `self.d_target_net` target channels (1 with
    # channel independence, where the batch holds one single-channel window per target channel).

    supported_options: frozenset[str] = frozenset()  # of "revin", "channel_independent", "patch_len"

    def build_net(self, net: dict) -> torch.nn.Module:
        raise NotImplementedError

    def teacher_forced(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The training pass: `(pred (B, T, C), labels (B, T, C), valid (B, T) bool)`, the targets'
        channels first in pred and labels (the loss is taken over the valid steps)."""
        raise NotImplementedError

    def predict_target(self, batch: dict) -> torch.Tensor:
        """Prediction of the target steps, `(B, T_out, d_target_net)` (T_out = M, or N for
        reconstruction), in the units of the batch it is given. Never reads the future targets."""
        raise NotImplementedError

    # -- what every family shares -----------------------------------------------------------------

    def forecast(self, batch: dict) -> torch.Tensor:
        """Prediction `(B, T_out, Dy)` of a batch as it comes from the data, in the data's scaled
        units (evaluation, `Forecaster.predict`)."""
        net_batch, view = self.options.enter(self.static.append_to_known(batch))
        return view.to_batch_layout(self.predict_target(net_batch))

    @torch.no_grad()
    def attention_maps(self, batch: dict) -> dict[str, torch.Tensor]:
        """The attention weights of every layer while the model forecasts `batch` as evaluation does
        (the autoregressive families generating step by step with the KV cache, whose per-step rows
        are stacked: `stack_query_rows`): `{layer name: (B', H, Tq, Tk)}`, B' the batch as the
        network sees it (B * Dy with channel independence: window-major, channel-minor)."""
        was_training = self.training
        self.eval()
        try:
            with collect_attention(self.net) as calls:
                self.forecast(batch)
        finally:
            self.train(was_training)
        return {name: stack_query_rows(weights) for name, weights in calls.items() if weights}

    def loss(self, batch: dict) -> torch.Tensor:
        return self.training_loss(self.static.append_to_known(batch))

    def training_loss(self, batch: dict) -> torch.Tensor:
        """The loss of a batch whose known covariates include the static features: in the data's
        scaled units whatever the options (predictions and labels denormalised by RevIN)."""
        net_batch, view = self.options.enter(batch)
        pred, labels, valid = self.teacher_forced(net_batch)
        return self.masked_loss(view.to_data_units(pred), view.to_data_units(labels), valid)

    @property
    def patch_args(self) -> dict:
        """`model.patch_len` and `model.patch_stride`, for the network config of the families that
        take patch tokens."""
        return {"patch_len": self.hparams.patch_len, "patch_stride": self.hparams.patch_stride}

    def _check_options(self) -> None:
        hp = self.hparams
        asked = {"revin": hp.revin, "channel_independent": hp.channel_independent, "patch_len": hp.patch_len is not None}
        for option, on in asked.items():
            if on and option not in self.supported_options:
                takes = ", ".join(f"model.{o}" for o in sorted(self.supported_options)) or "none of them"
                raise ValueError(
                    f"model.{option} is not an option of the {self.family} family (it takes {takes}); "
                    "see the table of model options in the README"
                )
        if hp.patch_stride is not None and hp.patch_len is None:
            raise ValueError(f"model.patch_stride={hp.patch_stride} needs model.patch_len")

    def true_target(self, batch: dict) -> torch.Tensor:
        return batch["fut_target"]

    def target_valid(self, batch: dict) -> torch.Tensor:
        """`(B, T_out)` bool: False on target steps that were filled in (data.fill), never scored."""
        return valid_steps(batch, "fut")

    def masked_loss(self, pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The loss over the valid steps only; pred, target `(B, T, D)`, valid `(B, T)`."""
        if bool(valid.all()):
            return self.loss_fn(pred, target)
        return self.loss_fn(pred[valid], target[valid])  # (n_valid, D)

    def naive_baseline(self):
        """The job's naive baseline (forecasting: persistence)."""
        return Persistence()

    # -- Lightning hooks ----------------------------------------------------------------------------

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"training loss is {loss.item()} at global step {self.global_step} (epoch {self.current_epoch}); "
                f"lower the learning rate (model.lr={self.hparams.lr}) or check the data for extreme values"
            )
        B = batch["hist_target"].shape[0]
        # per epoch, to MLflow; under DDP the mean over the processes (sync_dist: a no-op in one process)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=B, sync_dist=True)
        self.log("loss", loss, prog_bar=True, logger=False, batch_size=B)  # running value in the bar
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        B = batch["hist_target"].shape[0]
        self.log("val/loss", self.loss(batch), prog_bar=True, batch_size=B, sync_dist=True)
        valid = self.target_valid(batch)  # (B, T_out)
        self.val_metrics.update(self.forecast(batch)[valid].flatten(), self.true_target(batch)[valid].flatten())
        self.log_dict(self.val_metrics, batch_size=B)

    def on_test_start(self) -> None:
        if self.trainer.world_size > 1:
            # each process would hold the predictions of its own share of the windows only
            raise RuntimeError(
                f"test on one process, not {self.trainer.world_size}: every test window is evaluated once "
                "and exported from one process (train.py tests a multi-process fit with a one-device Trainer)"
            )
        self._test_chunks = []
        for baseline in self.baselines:
            baseline.fit(self.trainer.datamodule)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        true, valid = self.true_target(batch), self.target_valid(batch)  # (B, T, Dy), (B, T)
        preds = {"model": self.forecast(batch)} | {b.name: b.predict(batch) for b in self.baselines}
        true_orig = self.trainer.datamodule.inverse_transform_target(true.float())
        for name, pred in preds.items():
            pred_orig = self.trainer.datamodule.inverse_transform_target(pred.float())
            for metric_name, metric in self.test_metrics[name].items():  # scored on the valid steps only
                if metric_name.endswith("_by_var"):  # (n_valid, Dy): one value per target variable
                    metric.update(pred_orig[valid], true_orig[valid])
                elif "_orig" in metric_name:
                    metric.update(pred_orig[valid].flatten(), true_orig[valid].flatten())
                else:
                    metric.update(pred[valid].flatten(), true[valid].flatten())
        self._test_chunks.append(
            {
                "window": batch["window"].cpu(),
                "pred": preds["model"].cpu(),
                "true": true.cpu(),
                "valid": valid.cpu(),
                "baseline": preds["baseline"].cpu(),
            }
        )

    def on_test_epoch_end(self) -> None:
        values = {}
        for metrics in self.test_metrics.values():
            for name, value in metrics.compute().items():
                if name.endswith("_by_var"):  # test/mae_orig_by_var -> test/mae_orig/<variable>
                    for var, v in zip(self.target_names, value.reshape(-1)):
                        values[f"{name.removesuffix('_by_var')}/{var}"] = v
                else:
                    values[name] = value
            metrics.reset()
        self.log_dict(values)
        chunks = self._test_chunks
        order = torch.cat([c["window"] for c in chunks]).argsort()
        self.test_outputs = {k: torch.cat([c[k] for c in chunks])[order].numpy() for k in chunks[0]}
        self._test_chunks = []

    def configure_optimizers(self):
        hp = self.hparams
        optimizer = torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        total = self.trainer.estimated_stepping_batches
        warmup = min(hp.warmup_steps, max(1, int(total) // 4))
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, warmup, int(total), hp.min_lr_ratio)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
