"""`WindowTask`: what every family shares in training and evaluation (a LightningModule).

A family subclass says only how its network is built and how a batch of windows becomes (a) a
teacher-forced prediction with its labels and (b) a prediction of the target steps. Everything else
lives here once:
- the model options that wrap any family (`model_options.py`: RevIN, channel independence; patch
  tokens are passed to the network of the families that take them), checked against the family's
  `supported_options`;
- the output head (`nn/heads.py`, `model.head`): a point forecast trained with MSE, MAE or Huber, or
  a distribution (Gaussian, Student-t, quantiles) trained on its negative log likelihood or pinball
  loss; AdamW with a learning-rate schedule (`model.lr_schedule`): linear warmup then cosine decay
  (the default; warmup matters for Post-Norm), or PatchTST's per-epoch decay (`epoch_decay`);
- validation: `val/loss` (the training loss) and `val/mse`, `val/mae` of real predictions (for the
  autoregressive families: generated, feeding predictions back), monitored for checkpoints;
- test: `test/mse`, `test/mae` on scaled values (the literature's convention), `test/mae_orig`,
  `test/rmse_orig` in original units (also per target variable; the target scaling arrives as
  tensors, `set_target_scaling`, so they are computed on the device), and the same for the naive
  baseline on the same windows (`test/baseline_*`) and for any extra baselines
  (`test/<name>_*`, see `baselines.py`); predictions of every window kept for the export;
- with a distribution head, the probabilistic test metrics (`test/crps`, `test/pinball`,
  `test/coverage_80`, `test/width_80`, and `test/crps_orig`, `test/width_80_orig` in original units)
  of the model and of the probabilistic baseline (`test/baseline_*`, `ErrorQuantiles`), and the
  quantiles of every window for the CSV. The spread is calibrated on the validation windows before
  the test and, rolling, on the test windows whose truth was known at each origin (`calibrate_spread`,
  `model.head.calibrate`, `tasks/probabilistic.py`); the latest factors, `spread_scale`, are saved
  with the weights. The point value `y_pred` (and `test/mse`...) is the
  distribution's mean or median (`model.head.point`). The autoregressive families sample
  `model.head.num_samples` trajectories per test window; their validation (`val/mse`, the checkpoint
  metric) uses one deterministic rollout that feeds back the point value, as cheap as a point model's.

Batches are the dicts of `tsformer.data.WindowDataset`: hist_target (B, N, Dy), hist_known (B, N, Dk),
hist_observed (B, N, Do), fut_target (B, M, Dy), fut_known (B, M, Dk), fut_observed (B, M, Do), window (B,).
"""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import torch
from torchmetrics import MeanAbsoluteError, MeanMetric, MeanSquaredError, MetricCollection

from tsformer.data.features import Affine
from tsformer.nn.attention import collect_attention, stack_query_rows
from tsformer.nn.heads import build_head
from tsformer.tasks.baselines import ErrorQuantiles, Persistence, fit_baselines
from tsformer.tasks.model_options import ModelOptions
from tsformer.tasks.optimisation import Optimisation, Optimised
from tsformer.tasks.probabilistic import (
    BAND_LEVELS,
    CENTRAL_80_COVERAGE,
    Forecast,
    SampleForecast,
    SpreadCalibration,
    head_forecast,
    scores,
    spread_needed,
)
from tsformer.tasks.setting_groups import InputOptions, TakesSettings
from tsformer.tasks.static import StaticCovariates

PROB_METRICS = ("crps", "pinball", "coverage_80", "width_80", "crps_orig", "width_80_orig")
# What a task produces (`produces`, declared by each task class; jobs, exports, figures and predict.py
# follow it, never the horizon's value):
FORECASTS = "forecasts"  # the `horizon` rows after each window (model.horizon >= 1)
RECONSTRUCTIONS = "reconstructions"  # each window's own rows (model.horizon 0)
CLASSES = "classes"  # a class per sequence (and its probabilities)


def valid_steps(batch: dict, part: str) -> torch.Tensor:
    """`batch["<part>_valid"]` `(B, T)` bool; all True for batches built without it (by hand)."""
    if f"{part}_valid" in batch:
        return batch[f"{part}_valid"]
    return torch.ones(
        batch[f"{part}_target"].shape[:2], dtype=torch.bool, device=batch[f"{part}_target"].device
    )


class WindowTask(TakesSettings, Optimised, L.LightningModule):
    setting_groups = (("optimisation", Optimisation), ("input_options", InputOptions))
    family = "base"  # the network's family, for runs and tags (what the run does: its job, `tsformer.jobs`)
    produces: str  # FORECASTS or RECONSTRUCTIONS, declared by each task class
    learns_around_missing_targets = False  # trains on empty target cells (data.allow_empty_targets)

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
        baselines: list | None = None,
        d_static_num: int = 0,
        static_vocab_sizes: list[int] | None = None,
        static_embedding_dim: int = 4,
        head: dict | None = None,
        **settings,  # of `setting_groups`: model.lr, model.revin, ...
    ):
        super().__init__()
        # Saved into checkpoints so the task can be rebuilt; logged to MLflow once, by train.py.
        self.save_hyperparameters(logger=False, ignore=["baselines"])
        self.take_settings(settings)
        self._check_horizon(horizon)
        self._check_options()
        self.head = build_head(head, loss)  # model.head (None: the point head with model.loss)
        self.target_names = list(target_names or [f"target_{i}" for i in range(d_target)])
        # static covariates enter as extra known channels of every step (see static.py)
        self.static = StaticCovariates(d_static_num, static_vocab_sizes or [], static_embedding_dim)
        self.d_known_in = d_known + self.static.width  # known channels the network reads
        options = self.input_options
        self.options = ModelOptions(
            d_target, options.revin, options.revin_affine, options.channel_independent
        )
        self.d_target_net = self.options.d_target_net  # target channels the network reads: 1 with CI
        self.net = self.build_net(dict(net))
        # original = scaled * scale + offset per target variable (`set_target_scaling`); NaN until set,
        # not saved with the weights: it belongs to the data (the model folder keeps it as numbers)
        unset = torch.full((d_target,), math.nan, dtype=torch.float64)
        self.register_buffer("target_scale", unset, persistent=False)
        self.register_buffer("target_offset", unset.clone(), persistent=False)

        scaled = MetricCollection({"mse": MeanSquaredError(), "mae": MeanAbsoluteError()})
        orig = MetricCollection(
            {
                "mae_orig": MeanAbsoluteError(),
                "rmse_orig": MeanSquaredError(squared=False),
                "mae_orig_by_var": MeanAbsoluteError(num_outputs=d_target),
            }
        )
        # the job's baselines, the naive one first (its metrics are test/baseline_*), then any extra ones
        self.baselines = [*self.job_baselines(), *(baselines or [])]
        names = [b.name for b in self.baselines]
        if len(set(names)) != len(names):
            raise ValueError(f"baseline names must differ, got {names}")
        self.val_metrics = scaled.clone(prefix="val/")

        def test_metrics(prefix: str) -> MetricCollection:
            return MetricCollection([scaled.clone(prefix=prefix), orig.clone(prefix=prefix)])

        self.test_metrics = torch.nn.ModuleDict(
            {
                "model": test_metrics("test/"),
                **{b.name: test_metrics(f"test/{b.name}_") for b in self.baselines},
            }
        )
        self.prob_metrics = None
        if self.head.probabilistic:  # the model and the probabilistic baseline, each metric a running mean
            self.prob_metrics = torch.nn.ModuleDict(
                {
                    who: torch.nn.ModuleDict({m: MeanMetric() for m in PROB_METRICS})
                    for who in ("model", "baseline")
                }
            )
            # the quantiles kept for the export and the fan chart: the configured ones and the bands
            self.report_levels = sorted(set(self.head.levels) | set(BAND_LEVELS))
            # the spread factor per output step and target variable (calibrate_spread); 1 = as trained
            out_len = context_len if self.reconstructs else horizon
            self.register_buffer("spread_scale", torch.ones(out_len, d_target))
            self.spread_calibration: SpreadCalibration | None = None  # fitted before each test
            self.calibration: dict[str, float] = {}  # its figures, logged with the test metrics
            self._test_times: tuple[np.ndarray, np.ndarray] | None = (
                None  # test origins (W,), target times (W, T)
            )
        self.prob_baseline: ErrorQuantiles | None = None
        self.keep_test_paths = False  # keep every test window's sampled paths (train.py: `paths_file`)
        self.test_outputs: dict[str, np.ndarray] | None = None
        self._test_chunks: list[dict[str, torch.Tensor]] = []

    # -- what a family defines ------------------------------------------------------------------
    # A family works on the batch as the network sees it (`ModelOptions.enter`): static features in
    # the known covariates, targets normalised with RevIN, `self.d_target_net` target channels (1 with
    # channel independence, where the batch holds one single-channel window per target channel).

    supported_options: frozenset[str] = frozenset()  # of "revin", "channel_independent", "patch_len"
    autoregressive = False  # True: predictions are fed back step by step (distribution heads sample paths)

    def build_net(self, net: dict) -> torch.nn.Module:
        raise NotImplementedError

    def teacher_forced(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The training pass: `(out (B, T, C * P), labels (B, T, C), valid (B, T) bool)`: the
        network's raw outputs (P = the head's n_params per channel), the targets' channels first in
        out and labels (the loss is taken over the valid steps)."""
        raise NotImplementedError

    def predict_target(self, batch: dict) -> torch.Tensor:
        """Point prediction of the target steps, `(B, T_out, d_target_net)` (T_out = M, or N for
        reconstruction), in the units of the batch it is given. Never reads the future targets.
        Autoregressive families feed back the head's point value (`self.head.point_of_raw`)."""
        raise NotImplementedError

    def predict_params(self, batch: dict) -> torch.Tensor:
        """Non-autoregressive families: the head's parameters of the target steps `(B, T_out,
        d_target_net, P)`, in the units of the batch. Never reads the future targets."""
        raise NotImplementedError

    def sample_paths(self, batch: dict, num_samples: int) -> torch.Tensor:
        """Autoregressive families: `num_samples` trajectories of the target steps per window, each
        step drawn from the head's distribution and fed back: `(B, S, M, d_target_net)`."""
        raise NotImplementedError

    # -- what every family shares -----------------------------------------------------------------

    @property
    def samples_paths(self) -> bool:
        """Whether the test can sample whole paths (`paths_file`): an autoregressive family with a
        distribution head."""
        return self.head.probabilistic and self.autoregressive

    @property
    def reconstructs(self) -> bool:
        """Whether the task rebuilds its window's own rows (reconstruction, masked fill-in) rather than
        forecasting the rows after them (`produces`)."""
        return self.produces == RECONSTRUCTIONS

    def _check_horizon(self, horizon: int) -> None:
        """The window the task's config gives fits what it produces: a horizon of 0 rows for
        reconstructions, of 1 or more for forecasts."""
        fits = horizon == 0 if self.reconstructs else horizon >= 1
        if not fits:
            what = (
                "each window's own rows: model.horizon 0" if self.reconstructs else "model.horizon >= 1 rows"
            )
            raise ValueError(
                f"{type(self).__name__} produces {self.produces} of {what}; got horizon={horizon}"
            )

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

    def forecast_distribution(self, batch: dict, calibrated: bool = True) -> Forecast:
        """The probabilistic forecast of a batch as it comes from the data (data's scaled units):
        sampled paths for the autoregressive families, the head's marginals for the others; with
        the spread calibration applied (`calibrated`, when one was fitted)."""
        net_batch, view = self.options.enter(self.static.append_to_known(batch))
        if self.autoregressive:
            paths = self.sample_paths(net_batch, self.head.num_samples)  # (B', S, M, Dy')
            dist = SampleForecast(view.paths_to_batch_layout(paths), self.head.point_kind)
        else:
            dist = head_forecast(
                self.head, view.params_to_batch_layout(self.predict_params(net_batch), self.head)
            )
        if calibrated and bool((self.spread_scale != 1).any()):
            dist = dist.with_spread_scale(self.spread_scale.to(batch["hist_target"].dtype))
        return dist

    def set_target_scaling(self, scaler: Affine) -> None:
        """The data's target scaler (`FeaturePipeline.target_scaler`), for the metrics in original
        units: set by `train.build_task` and `Forecaster.load`."""
        scale, offset = scaler.tensors(self.target_scale.device)
        self.target_scale.copy_(scale)
        self.target_offset.copy_(offset)

    def to_original_units(self, values: torch.Tensor) -> torch.Tensor:
        """Scaled targets `(..., Dy)` -> original units, on their device (computed in float64)."""
        return (values.double() * self.target_scale + self.target_offset).to(values.dtype)

    @torch.no_grad()
    def calibrate_spread(self, val_batches, val_target_times: np.ndarray) -> None:
        """Fit the spread calibration on every validation window (`tasks/probabilistic.py`): per
        step and target variable, the factor about the median that makes the central 80% interval
        cover 80% of them (`spread_scale` until the test moves on, if rolling). Without
        `model.head.calibrate`, the spread stays as trained (factor 1). `val_batches`: the
        validation loader; `val_target_times` `(W_val, T)`: its windows' target times."""
        self.spread_scale.fill_(1.0)
        self.spread_calibration = None
        if not self.head.calibrate:
            return
        needed, windows = [], []
        for batch in val_batches:
            batch = self.transfer_batch_to_device(batch, self.device, 0)
            raw = self.forecast_distribution(batch, calibrated=False)
            needed.append(self._spread_needed(raw, batch).cpu())
            windows.append(batch["window"].cpu())
        needed = torch.cat(needed)  # (W_val, T, Dy), NaN on steps not scored
        # reconstruction has no forecast origin to roll with: the validation windows only
        window = None if self.reconstructs else self.head.calibration_window
        self.spread_calibration = SpreadCalibration(window, CENTRAL_80_COVERAGE)
        known_at = val_target_times[torch.cat(windows).numpy()]  # (W_val, T)
        scale = self.spread_calibration.fit_validation(needed.numpy(), known_at)
        self.spread_scale.copy_(torch.as_tensor(scale))
        scored = needed[~needed.isnan()]
        self.calibration = {
            "calibration/val_coverage_80_as_trained": float((scored <= 1).float().mean()),
            "calibration/spread_scale_first_step": float(scale[0].mean()),
            "calibration/spread_scale_last_step": float(scale[-1].mean()),
        }

    def _spread_needed(self, raw: Forecast, batch: dict) -> torch.Tensor:
        """`(B, T, Dy)`: the factor each element of `batch` needed (`spread_needed`); NaN on filled steps."""
        not_scored = ~self.target_valid(batch).unsqueeze(-1)  # (B, T, 1)
        return spread_needed(raw, self.true_target(batch)).masked_fill(not_scored, float("nan"))

    def _calibrated_test_forecast(self, batch: dict) -> Forecast:
        """The model's forecast of a test batch, calibrated as of each window's origin: with a rolling
        `model.head.calibration_window`, the batch's own factors join the pool first, each usable only
        by origins at or after the time its truth was measured."""
        calibration = self.spread_calibration
        if calibration is None or calibration.window is None:
            return self.forecast_distribution(batch)  # the validation factors (`spread_scale`), or none
        raw = self.forecast_distribution(batch, calibrated=False)
        windows = batch["window"].cpu().numpy()
        origins, target_times = self._test_times
        calibration.add(self._spread_needed(raw, batch).cpu().numpy(), target_times[windows])
        scale = calibration.at(origins[windows])  # (B, T, Dy)
        return raw.with_spread_scale(
            torch.as_tensor(scale, dtype=batch["hist_target"].dtype, device=self.device)
        )

    def forecast_with_quantiles(self, batch: dict, levels) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(point (B, T_out, Dy), quantiles (B, T_out, Dy, K) at levels or None for a point head)`,
        data's scaled units: what `Forecaster.predict` writes."""
        if not self.head.probabilistic:
            return self.forecast(batch), None
        dist = self.forecast_distribution(batch)
        return dist.point(), dist.quantiles(levels)

    def training_loss(self, batch: dict) -> torch.Tensor:
        """The loss of a batch whose known covariates include the static features: in the data's
        scaled units whatever the options (the head's parameters and the labels denormalised by RevIN)."""
        net_batch, view = self.options.enter(batch)
        out, labels, valid = self.teacher_forced(net_batch)
        params = view.params_to_data_units(self.head.params(out), self.head)  # (B, T, C, P)
        return self.masked_loss(params, view.to_data_units(labels), valid)

    @property
    def patch_args(self) -> dict:
        """`model.patch_len` and `model.patch_stride`, for the network config of the families that
        take patch tokens."""
        return {"patch_len": self.hparams.patch_len, "patch_stride": self.hparams.patch_stride}

    def require_point_head(self, setting: str) -> None:
        """Refuse a distribution head for `setting` (e.g. "model.linear_path"), which needs the point head:
        one line naming it."""
        if self.head.probabilistic:
            raise ValueError(f"{setting} takes the point head (head=point), not head={self.head.kind}")

    def _check_options(self) -> None:
        hp = self.hparams
        asked = {
            "revin": hp.revin,
            "channel_independent": hp.channel_independent,
            "patch_len": hp.patch_len is not None,
        }
        for option, on in asked.items():
            if on and option not in self.supported_options:
                takes = ", ".join(f"model.{o}" for o in sorted(self.supported_options)) or "none of them"
                raise ValueError(
                    f"model.{option} is not an option of the {self.family} family (it takes {takes}); "
                    "see the table of model options in the README"
                )

    def true_target(self, batch: dict) -> torch.Tensor:
        return batch["fut_target"]

    def target_valid(self, batch: dict) -> torch.Tensor:
        """`(B, T_out)` bool: False on target steps that were filled in (data.fill), never scored."""
        return valid_steps(batch, "fut")

    def masked_loss(self, params: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The head's loss over the valid steps only; params `(B, T, D, P)`, target `(B, T, D)`, valid `(B, T)`."""
        if bool(valid.all()):
            return self.head.loss(params, target)
        return self.head.loss(params[valid], target[valid])  # (n_valid, D, P), (n_valid, D)

    def naive_baseline(self):
        """The job's naive baseline (forecasting: persistence)."""
        return Persistence()

    def job_baselines(self) -> list:
        """The baselines every run of the job measures, the naive one first (forecasting adds the
        linear forecaster)."""
        return [self.naive_baseline()]

    # -- Lightning hooks ----------------------------------------------------------------------------

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"training loss is {loss.item()} at global step {self.global_step} (epoch {self.current_epoch}); "
                f"lower the learning rate (model.lr={self.optimisation.lr}) or check the data for extreme values"
            )
        B = batch["hist_target"].shape[0]
        # per epoch, to MLflow; under DDP the mean over the processes (sync_dist: a no-op in one process)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=B, sync_dist=True)
        self.log("loss", loss, prog_bar=True, logger=False, batch_size=B)  # running value in the bar
        return loss

    @property
    def loss_of_forecast(self) -> bool:
        """Whether the training loss is the point head's loss of the forecast itself (a family whose
        teacher-forced pass is the forecast, `teacher_forced_is_forecast`): validation then runs the
        network once per batch, not once for `val/loss` and again for `val/mse`."""
        return self.teacher_forced_is_forecast and not self.head.probabilistic

    teacher_forced_is_forecast = False  # True: `teacher_forced` computes what `predict_target` does

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        B = batch["hist_target"].shape[0]
        valid = self.target_valid(batch)  # (B, T_out)
        forecast, target = self.forecast(batch), self.true_target(batch)
        if self.loss_of_forecast:  # the same number as `self.loss(batch)`, without a second pass
            loss = self.masked_loss(forecast.unsqueeze(-1), target, valid)
        else:
            loss = self.loss(batch)
        self.log("val/loss", loss, prog_bar=True, batch_size=B, sync_dist=True)
        self.val_metrics.update(forecast[valid].flatten(), target[valid].flatten())
        self.log_dict(self.val_metrics, batch_size=B)

    def on_test_start(self) -> None:
        if self.trainer.world_size > 1:
            # each process would hold the predictions of its own share of the windows only
            raise RuntimeError(
                f"test on one process, not {self.trainer.world_size}: every test window is evaluated once "
                "and exported from one process (train.py tests a multi-process fit with a one-device Trainer)"
            )
        if bool(self.target_scale.isnan().any()):
            raise RuntimeError(
                "the task has no target scaling for its metrics in original units: call "
                "task.set_target_scaling(datamodule.features.target_scaler) before the test"
            )
        self._test_chunks = []
        dm = self.trainer.datamodule  # what the baselines and the calibration are fitted on
        fit_baselines(self.baselines, dm.datasets["train"], dm.features, dm.frame, val=dm.datasets["val"])
        if self.head.probabilistic:  # the naive baseline plus the quantiles of its own validation errors
            self.prob_baseline = ErrorQuantiles(self.baselines[0])
            self.prob_baseline.fit_errors(dm.val_dataloader(), reconstruction=self.reconstructs)
            # the model's own spread, on the same windows
            self.calibrate_spread(dm.val_dataloader(), dm.target_times("val"))
            self._test_times = (dm.window_info("test")["origin_time"].to_numpy(), dm.target_times("test"))

    def test_step(self, batch: dict, batch_idx: int) -> None:
        true, valid = self.true_target(batch), self.target_valid(batch)  # (B, T, Dy), (B, T)
        baseline_preds = {b.name: b.predict(batch) for b in self.baselines}
        quantiles = {}
        if self.head.probabilistic:  # the probabilistic baseline spreads the naive baseline's forecast
            naive = baseline_preds[self.baselines[0].name]
            dists = {
                "model": self._calibrated_test_forecast(batch),
                "baseline": self.prob_baseline.forecast(batch, naive),
            }
            quantiles = {who: self._score_distribution(who, dist, true, valid) for who, dist in dists.items()}
            model_point = dists["model"].point()
        else:
            model_point = self.forecast(batch)
        preds = {"model": model_point} | baseline_preds
        true_orig = self.to_original_units(true.float())
        for name, pred in preds.items():
            pred_orig = self.to_original_units(pred.float())
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
                **{f"pred_{b.name}": preds[b.name].cpu() for b in self.baselines[1:]},  # the other baselines'
                **{
                    ("quantiles" if who == "model" else f"{who}_quantiles"): q.cpu()
                    for who, q in quantiles.items()
                },
                **({"paths": dists["model"].samples.cpu()} if self.keep_test_paths else {}),  # (B, S, M, Dy)
            }
        )

    def _score_distribution(
        self, who: str, dist: Forecast, true: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """Update `who`'s probabilistic metrics on the valid steps; return its quantiles at the
        report levels `(B, T, Dy, K)` (scaled units, for the export)."""
        per_element = scores(dist, true, self.head.levels)  # name -> (B, T, Dy), scaled units
        to_orig = self.target_scale.abs().to(true.dtype)  # (Dy,) original = scaled * scale + offset
        per_element["crps_orig"] = per_element["crps"] * to_orig
        per_element["width_80_orig"] = per_element["width_80"] * to_orig
        for name, values in per_element.items():
            self.prob_metrics[who][name].update(values[valid])
        return dist.quantiles(self.report_levels)

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
        if self.prob_metrics is not None:
            for who, metrics in self.prob_metrics.items():
                prefix = "test/" if who == "model" else f"test/{who}_"
                for name, metric in metrics.items():
                    values[f"{prefix}{name}"] = metric.compute()
                    metric.reset()
            if self.spread_calibration is not None:  # later forecasts use the latest factors
                self.spread_scale.copy_(torch.as_tensor(self.spread_calibration.latest()))
            values.update(self.calibration)
        self.log_dict(values)
        chunks = self._test_chunks
        order = torch.cat([c["window"] for c in chunks]).argsort()
        self.test_outputs = {k: torch.cat([c[k] for c in chunks])[order].numpy() for k in chunks[0]}
        self._test_chunks = []
