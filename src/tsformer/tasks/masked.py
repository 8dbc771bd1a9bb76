"""Masked fill-in with the encoder-only family: hide some values of a window, restore them from both sides.

The cloze task of BERT for time series (Zerveas et al., KDD 2021), and how missing sensor values are
imputed (`tsformer.jobs.imputation.job`). The values are the table's target columns (`data.target_cols`):
they are the inputs and the targets at once. A window of N steps:

    values (B, N, Dy) --hide(mask)--> [kept values, 0 where hidden | mask] (B, N, 2 Dy)
        + known and observed covariates (B, N, Dk + Do), never hidden (calendar, static features)
        --EncoderOnly, bidirectional, per_step head--> (B, N, Dy), scored on the hidden values only.

Masks (`tsformer.nn.masking`, `model.mask_kind`, `mask_ratio`, `mask_mean_length`): a new one for
every training batch; the validation and test windows each get a fixed one, drawn from
`model.eval_mask_seed`, so that every evaluation and the baseline score the same hidden values. A value
nobody measured (a step filled in for a gap, data.fill; NaN at prediction) is hidden from the model
too, and never scored.

Test metrics (`test/mse`, `test/mae` scaled; `test/mae_orig`, `test/rmse_orig` in original units) are
over the hidden values of every test window; the baseline beside them (`test/baseline_*`) is linear
interpolation between the nearest kept values of the same window, on the same masks. The forecasts
CSV holds every value of every test window as `y_true`, and `y_pred` on the hidden ones only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection

from tsformer.models import EncoderOnly, EncoderOnlyConfig
from tsformer.nn.masking import MaskConfig, draw_mask, eval_masks, hide, interpolate
from tsformer.tasks.base import RECONSTRUCTIONS, WindowTask, valid_steps
from tsformer.tasks.baselines import fit_baselines

SPLIT_SEED_OFFSET = {"val": 0, "test": 1}  # the validation and the test masks are different draws


@dataclass(frozen=True)
class Masking:
    """The values hidden in training and scoring (a setting group of masked fill-in and pre-training,
    `tasks/setting_groups.py`): runs of mean length `mask_mean_length` (geometric) or single values
    (random) covering `mask_ratio` of them; fixed masks of the validation and test windows drawn from
    `eval_mask_seed`; `interpolate_hidden`: hidden values enter as their neighbours' interpolation, not 0."""

    mask_kind: str = "geometric"
    mask_ratio: float = 0.15
    mask_mean_length: float = 3.0
    eval_mask_seed: int = 0
    interpolate_hidden: bool = False

    def __post_init__(self) -> None:
        self.config  # noqa: B018 (refuses what cannot be drawn)

    @property
    def config(self) -> MaskConfig:
        return MaskConfig(self.mask_kind, float(self.mask_ratio), float(self.mask_mean_length))


class LinearInterpolation:
    """Each hidden value by linear interpolation between the nearest kept values of its channel in its
    window (the nearest kept value before the first or after the last one; 0, the train mean, in a
    channel with none kept). Reads `batch["hidden"]` `(B, N, Dy)`."""

    name = "baseline"
    description = "linear interpolation between the nearest kept values of the same window and channel"

    def fit(self, train, features, table) -> None:
        pass  # nothing to learn

    def predict(self, batch: dict) -> torch.Tensor:
        return interpolate(batch["hist_target"], batch["hidden"])  # (B, N, Dy)


class MaskedFillIn(WindowTask):
    family = "enc_only"
    produces = RECONSTRUCTIONS  # of the hidden values of each window
    learns_around_missing_targets = True  # an empty cell is hidden from the network and never scored

    setting_groups = (*WindowTask.setting_groups, ("masking", Masking))

    def __init__(self, *args, window_norm: bool = True, **kwargs):  # and `WindowTask`'s
        super().__init__(*args, **kwargs)
        self.require_point_head("masked fill-in")
        # scored on single values, not whole steps: no per-variable metric of whole rows
        scaled = MetricCollection({"mse": MeanSquaredError(), "mae": MeanAbsoluteError()})
        orig = MetricCollection(
            {"mae_orig": MeanAbsoluteError(), "rmse_orig": MeanSquaredError(squared=False)}
        )
        self.test_metrics = torch.nn.ModuleDict(
            {
                who: MetricCollection([scaled.clone(prefix=prefix), orig.clone(prefix=prefix)])
                for who, prefix in [
                    ("model", "test/"),
                    *((b.name, f"test/{b.name}_") for b in self.baselines),
                ]
            }
        )
        self._eval_masks: dict[str, torch.Tensor] = {}  # split -> (W, N, Dy), drawn when first needed

    def build_net(self, net: dict) -> EncoderOnly:
        hp = self.hparams
        d_in = 2 * hp.d_target + self.d_known_in + hp.d_observed  # values, mask, covariates
        return EncoderOnly(
            EncoderOnlyConfig(
                **net, d_in=d_in, d_out=hp.d_target, head="per_step", n_params=self.head.n_params
            )
        )

    def naive_baseline(self) -> LinearInterpolation:
        return LinearInterpolation()

    # -- the fill ---------------------------------------------------------------------------------

    @staticmethod
    def unmeasured(batch: dict) -> torch.Tensor:
        """`(B, N, Dy)` bool: values nobody measured (NaN, or a step filled in for a gap)."""
        values = batch["hist_target"]
        return values.isnan() | ~valid_steps(batch, "hist").unsqueeze(-1)

    def restore(self, batch: dict, hidden: torch.Tensor) -> torch.Tensor:
        """The network's values `(B, N, Dy)` of a batch whose known covariates include the static
        features, with the values `hidden` `(B, N, Dy)` withheld from it."""
        return self.head.point(self.net_params(batch, hidden))  # (B, N, Dy)

    def predict_target(self, batch: dict) -> torch.Tensor:
        """The window with its unmeasured values (and `batch["mask"]`'s, if any) filled in `(B, N, Dy)`;
        every other value as given."""
        hidden = self.unmeasured(batch) | batch.get("mask", False)
        return torch.where(hidden, self.restore(batch, hidden), batch["hist_target"])

    def true_target(self, batch: dict) -> torch.Tensor:
        return batch["hist_target"]

    def target_valid(self, batch: dict) -> torch.Tensor:
        return valid_steps(batch, "hist")

    # -- masks and loss ---------------------------------------------------------------------------

    def split_masks(self, split: str) -> torch.Tensor:
        """The fixed masks `(W, N, Dy)` of every window of the validation or test split."""
        if split not in self._eval_masks:
            hp = self.hparams
            n_windows = self.trainer.datamodule.n_windows(split)
            seed = hp.eval_mask_seed * 2 + SPLIT_SEED_OFFSET[split]
            self._eval_masks[split] = eval_masks(
                n_windows, hp.context_len, hp.d_target, self.masking.config, seed
            )
        return self._eval_masks[split]

    def masked_batch(self, batch: dict, split: str | None) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """`(batch with static features and "hidden", hidden (B, N, Dy), scored (B, N, Dy))`: a new mask
        (training, `split` None) or the split's fixed ones, plus the unmeasured values; scored: the
        hidden values that were measured."""
        values = batch["hist_target"]
        if split is None:
            mask = draw_mask(tuple(values.shape), self.masking.config).to(values.device)
        else:
            mask = self.split_masks(split)[batch["window"].cpu()].to(values.device)
        unmeasured = self.unmeasured(batch)
        hidden = mask | unmeasured
        return self.static.append_to_known(batch) | {"hidden": hidden}, hidden, mask & ~unmeasured

    def masked_loss_of(self, batch: dict, hidden: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
        """The head's loss over the `scored` values `(B, N, Dy)` alone, the network seeing none of `hidden`."""
        out = self.net_params(batch, hidden)  # (B, N, Dy, P)
        if not bool(scored.any()):  # a tiny window may draw no mask: nothing to learn from it
            return out.sum() * 0.0
        return self.head.loss(out[scored].unsqueeze(1), batch["hist_target"][scored].unsqueeze(1))

    def net_params(self, batch: dict, hidden: torch.Tensor) -> torch.Tensor:
        """The head's parameters `(B, N, Dy, P)` with the values `hidden` withheld (see `restore`).

        With `window_norm`, each channel of each window enters as (value - mean) / std of its kept
        values and its outputs are mapped back: a level or spread that drifted since the train rows
        (ETT's test months) is then no new input for the network (as TSLib's imputation models do).
        With `interpolate_hidden`, hidden values enter as the linear interpolation of their kept
        neighbours (flagged all the same) instead of 0, and the network gives the correction to it."""
        values = batch["hist_target"].nan_to_num(0.0)
        loc, scale = self.window_stats(values, hidden)  # (B, 1, Dy) each
        values = (values - loc) / scale
        line = interpolate(values, hidden) if self.hparams.interpolate_hidden else None
        entered = torch.cat([line, hidden.to(values.dtype)], -1) if line is not None else hide(values, hidden)
        x = torch.cat([entered, batch["hist_known"], batch["hist_observed"]], -1)  # (B, N, 2 Dy + Dk + Do)
        params = self.head.params(self.net(x))  # (B, N, Dy, P)
        if line is not None:  # the network gives the correction to the line
            params = params + line.unsqueeze(-1)
        return params * scale.unsqueeze(-1) + loc.unsqueeze(-1)  # point head: P = 1

    def window_stats(self, values: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std `(B, 1, Dy)` of the kept values of each window and channel (0 and 1 without
        `window_norm`; a channel with nothing kept gets 0 and 1)."""
        if not self.hparams.window_norm:
            return values.new_zeros(values.shape[0], 1, values.shape[2]), values.new_ones(1, 1, 1)
        kept = (~hidden).to(values.dtype)  # (B, N, Dy)
        n = kept.sum(dim=1, keepdim=True).clamp_min(1.0)  # (B, 1, Dy)
        loc = (values * kept).sum(dim=1, keepdim=True) / n
        var = (((values - loc) * kept) ** 2).sum(dim=1, keepdim=True) / n
        return loc, torch.sqrt(var + 1e-5)

    def loss(self, batch: dict) -> torch.Tensor:
        batch, hidden, scored = self.masked_batch(batch, None if self.training else "val")
        return self.masked_loss_of(batch, hidden, scored)

    # -- Lightning hooks: scored on the hidden values ---------------------------------------------

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        B = batch["hist_target"].shape[0]
        batch, hidden, scored = self.masked_batch(batch, "val")
        self.log("val/loss", self.masked_loss_of(batch, hidden, scored), prog_bar=True, batch_size=B,
                 sync_dist=True)  # fmt: skip
        pred = self.restore(batch, hidden)
        self.val_metrics.update(pred[scored], batch["hist_target"][scored])
        self.log_dict(self.val_metrics, batch_size=B)

    def on_test_start(self) -> None:
        self._test_chunks = []
        dm = self.trainer.datamodule
        fit_baselines(self.baselines, dm.datasets["train"], dm.features, dm.frame)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        true, valid = batch["hist_target"], self.target_valid(batch)
        batch, hidden, scored = self.masked_batch(batch, "test")
        preds = {"model": self.restore(batch, hidden)} | {b.name: b.predict(batch) for b in self.baselines}
        true_orig = self.to_original_units(true.float())
        for name, pred in preds.items():
            pred_orig = self.to_original_units(pred.float())
            for metric_name, metric in self.test_metrics[name].items():
                if "_orig" in metric_name:
                    metric.update(pred_orig[scored], true_orig[scored])
                else:
                    metric.update(pred[scored], true[scored])
        nan = torch.full_like(true, float("nan"))
        self._test_chunks.append(
            {  # the CSV's y_pred: the restored values where hidden, empty where kept
                "window": batch["window"].cpu(),
                "pred": torch.where(hidden, preds["model"], nan).cpu(),
                "true": true.cpu(),
                "valid": valid.cpu(),
                "baseline": torch.where(hidden, preds["baseline"], nan).cpu(),
            }
        )
