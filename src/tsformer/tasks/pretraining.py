"""Masked pre-training of a classifier's encoder on its own sequences, labels ignored (`pretrain=masked`).

The cloze task of TST (Zerveas et al., KDD 2021) on the batches of classification data
(`tsformer.data.sequences`: x `(B, T, D)` scaled and padded, valid `(B, T)`): values hidden in runs of
geometric length (`tsformer.nn.masking`, `mask_ratio`, `mask_mean_length`) are set to 0 (or, with
`interpolate_hidden`, to the linear interpolation of their kept neighbours) and restored from both sides:

    x (B, T, D) --hide--> (B, T, D) --EncoderOnly(per_token head), padding masked-->
        (B, T', F) restored values per token: F = D per step, or P * D per patch of P steps (patch_len),
        or S * D per token of a convolutional embedding of stride S (model.net.conv_stride)
    loss: MSE over the hidden values of the real steps only (padding is never hidden nor scored).

The network is the classifier's own (`model.net`, `patch_len`, `patch_stride` of the same model config,
which the pretrain config only re-targets), and its input is laid out as the classifier's: the D
channels per step, no mask flags. So `init_from=<this run>` in the classification run gives the
classifier the Transformer blocks, the learned positions AND the input projection
(`init_from.load_into`, `input_layout`); the per-token head is left behind. The classifier's own
settings (pooling, label smoothing, class weights) are taken and unused: one model config serves both.

Masks: a new one for every training batch; each validation and test sample gets a fixed one drawn from
`eval_mask_seed` (`val/loss`: the masked MSE of the validation samples, what checkpoints follow).
Test metrics: `test/mse`, `test/mae` over the hidden values of every test sample, beside
`test/baseline_*`, linear interpolation between the nearest kept values on the same masks (with
patches, both in the patches' layout: a step of two overlapping patches counts twice for both).
"""

from __future__ import annotations

import lightning as L
import torch
from torchmetrics import MeanMetric

from tsformer.models import EncoderOnly, EncoderOnlyConfig
from tsformer.nn.masking import draw_mask, eval_masks, interpolate
from tsformer.nn.patching import Patching, token_features
from tsformer.tasks.base import RECONSTRUCTIONS
from tsformer.tasks.classification import ClassificationTask
from tsformer.tasks.masked import SPLIT_SEED_OFFSET, LinearInterpolation, Masking
from tsformer.tasks.optimisation import Optimisation, Optimised
from tsformer.tasks.setting_groups import InputOptions, TakesSettings

INPUT_LAYOUT = "channels"  # the classifier's: the D scaled channels of each step (init_from reads it)


class MaskedPretraining(TakesSettings, Optimised, L.LightningModule):
    """`pretrain=masked` on classification data (see the module docstring)."""

    setting_groups = (("optimisation", Optimisation), ("input_options", InputOptions), ("masking", Masking))
    takes_settings_of = ClassificationTask  # one model config serves both
    produces = RECONSTRUCTIONS  # of the hidden values of each sequence
    family = "enc_only_pretrain"
    input_layout = INPUT_LAYOUT

    def __init__(
        self,
        net: dict,
        d_in: int,
        monitor: str = "val/loss",
        **settings,  # of `setting_groups`, and the classifier's (taken, unused)
    ):
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.take_settings(settings)
        options = self.input_options
        if options.revin_affine or options.channel_independent:
            raise ValueError(
                "masked pre-training takes neither model.revin_affine (the classifier's own learned scale) "
                "nor model.channel_independent; set them false"
            )
        if monitor != "val/loss":
            raise ValueError(
                f"monitor={monitor!r}: pre-training is checkpointed on val/loss (the masked MSE)"
            )
        patch_len, patch_stride = options.patch_len, options.patch_stride
        patching = Patching(patch_len, patch_stride) if patch_len else None
        # a token restores its values: D, P * D for a patch, or S * D for a token of a conv_stride of S
        stride = net.get("conv_stride", 1) if net.get("embedding", "linear") in ("conv", "multiscale") else 1
        d_out = token_features(patching, d_in) * stride
        self.net = EncoderOnly(
            EncoderOnlyConfig(
                **net,
                d_in=d_in,
                d_out=d_out,
                head="per_token",
                patch_len=patch_len,
                patch_stride=patch_stride,
            )
        )
        self.baselines = [LinearInterpolation()]
        self.val_loss = MeanMetric()
        self.test_metrics = torch.nn.ModuleDict(
            {f"{who}{kind}": MeanMetric() for who in ("", "baseline_") for kind in ("mse", "mae")}
        )
        self._eval_masks: dict[str, torch.Tensor] = {}

    # -- the fill ---------------------------------------------------------------------------------

    def entered(self, x: torch.Tensor, valid: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """What the network reads `(B, T, D)`: the kept values (instance-normalised with `revin`, by
        the kept real values only), hidden ones as 0 or interpolated, padding 0."""
        if self.hparams.revin:
            x = self.standardise(x, valid, hidden)
        real = valid.unsqueeze(-1)  # (B, T, 1)
        if self.hparams.interpolate_hidden:
            line = interpolate(x, hidden | ~real)  # padding is no neighbour to interpolate from
            return torch.where(real, line, 0.0)
        return x.masked_fill(hidden | ~real, 0.0)

    @staticmethod
    def standardise(x: torch.Tensor, valid: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Each sample's channels by the mean and std of their kept real values (the classifier's
        `revin`, which sees every real value; a hidden value must not leak into the statistics)."""
        w = (valid.unsqueeze(-1) & ~hidden).to(x.dtype)  # (B, T, D)
        n = w.sum(dim=1, keepdim=True).clamp_min(1.0)  # (B, 1, D)
        mean = (x * w).sum(dim=1, keepdim=True) / n
        std = ((((x - mean) ** 2) * w).sum(dim=1, keepdim=True) / n + 1e-5).sqrt()
        return (x - mean) / std

    def tokens(self, values: torch.Tensor) -> torch.Tensor:
        """Per-step values `(B, T, D)` in the network's output layout `(B, T', F)` (patches or steps)."""
        patching = self.net.patching
        if patching is not None:
            return patching(values)
        if self.net.grid is not None:  # a strided convolutional embedding: S steps per token
            return self.net.grid.group_steps(values)
        return values

    def restore(self, batch: dict, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the network's values, the true values, scored) `(B, T', F)` each for `hidden` `(B, T, D)`
        (already limited to real steps); scored: the hidden values."""
        x, valid = batch["x"], batch["valid"]
        padded = not bool(valid.all())
        if padded and self.hparams.patch_len:
            raise ValueError(
                f"model.patch_len={self.hparams.patch_len}: patch tokens need sequences of one length, and "
                "this batch pads some; use patch_len=null for sequences of unequal length"
            )
        out = self.net(self.entered(x, valid, hidden), valid if padded else None)  # (B, T', F)
        true = self.standardise(x, valid, hidden) if self.hparams.revin else x
        scored = self.tokens(hidden.to(x.dtype)) > 0.5
        return out, self.tokens(true), scored

    def hidden_of(self, batch: dict, split: str | None) -> torch.Tensor:
        """`(B, T, D)` bool: a new mask (training, `split` None) or the samples' fixed ones; real steps
        only."""
        x, valid = batch["x"], batch["valid"]
        if split is None:
            mask = draw_mask(tuple(x.shape), self.masking.config).to(x.device)
        else:
            mask = self.split_masks(split)[batch["sample"].cpu(), : x.shape[1]].to(x.device)
        return mask & valid.unsqueeze(-1)

    def split_masks(self, split: str) -> torch.Tensor:
        """The fixed masks `(S, T_max, D)` of every sample of the validation or test split."""
        if split not in self._eval_masks:
            samples = self.trainer.datamodule.datasets[split].samples
            longest = max(len(s) for s in samples)
            seed = self.hparams.eval_mask_seed * 2 + SPLIT_SEED_OFFSET[split]
            self._eval_masks[split] = eval_masks(
                len(samples), longest, self.hparams.d_in, self.masking.config, seed
            )
        return self._eval_masks[split]

    # -- Lightning steps --------------------------------------------------------------------------

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out, true, scored = self.restore(batch, self.hidden_of(batch, None))
        if not bool(scored.any()):  # a tiny batch may draw no mask: nothing to learn from it
            return out.sum() * 0.0
        loss = ((out - true)[scored] ** 2).mean()
        self.log("train/loss", loss, prog_bar=True, batch_size=len(out))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        out, true, scored = self.restore(batch, self.hidden_of(batch, "val"))
        self.val_loss.update((out - true)[scored] ** 2)

    def on_validation_epoch_end(self) -> None:
        self.log("val/loss", self.val_loss.compute(), prog_bar=True)
        self.val_loss.reset()

    def test_step(self, batch: dict, batch_idx: int) -> None:
        hidden = self.hidden_of(batch, "test")
        out, true, scored = self.restore(batch, hidden)
        x = self.standardise(batch["x"], batch["valid"], hidden) if self.hparams.revin else batch["x"]
        line = self.tokens(interpolate(x, hidden | ~batch["valid"].unsqueeze(-1)))
        for who, pred in (("", out), ("baseline_", line)):
            error = (pred - true)[scored]
            self.test_metrics[f"{who}mse"].update(error**2)
            self.test_metrics[f"{who}mae"].update(error.abs())

    def on_test_epoch_end(self) -> None:
        for name, metric in self.test_metrics.items():
            self.log(f"test/{name}", metric.compute())
            metric.reset()
