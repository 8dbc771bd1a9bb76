"""`fit_detector`: an anomaly detector (`tsformer.tasks.anomaly`) trained on normal rows by a Lightning
Trainer, for scripts and benchmarks; `python train.py experiment=plant_anomaly` trains the same tasks
through the application's run (`tsformer.jobs.anomaly.job`, docs/anomaly.md).

`fit_detector(train, val, channels, method=...)` trains on the `train` rows (assumed normal; no label
is read) and measures on the held-out normal `val` rows how large each channel's error normally is.
`detector.score(table)` gives every row a score and its per-channel contributions (`Scores`); what
the two methods compute is said in `tsformer.tasks.anomaly`.
"""

from __future__ import annotations

import logging
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, fields

import lightning as L
import pandas as pd
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tsformer.data.anomaly import AnomalyData, check_table, series_rows, split_normal_rows
from tsformer.settings import SettingError
from tsformer.tasks.anomaly import DETECTORS, AnomalyScoring, Scores, covering_window_starts

METHODS = tuple(DETECTORS)
AnomalyDetector = AnomalyScoring  # what `fit_detector` returns: a trained detector task


@dataclass
class DetectorSettings:
    context_len: int = 64  # rows of a window (the forecast method: the rows before a step, and it)
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    lr: float = 1e-3  # the project's AdamW and warmup-cosine schedule (tasks/optimisation.py)
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05
    batch_size: int = 64
    steps: int = 1500  # optimiser steps
    # masked
    mask_ratio: float = 0.2
    mask_mean_length: float = 4.0
    channel_out: bool = True
    n_masks: int = 5
    run_length: int = 4
    stride: int = 8
    # forecast: nothing more

    @classmethod
    def of(cls, settings: dict) -> DetectorSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise SettingError(f"anomaly.settings: unknown setting(s) {unknown}; known: {sorted(known)}")
        out = cls(**settings)
        if out.steps < 20:  # the learning-rate schedule's warmup needs a few steps
            raise SettingError(f"anomaly.settings.steps={out.steps}: at least 20 optimiser steps")
        if out.context_len < 2:
            raise SettingError(f"anomaly.context_len={out.context_len}: a window needs at least 2 steps")
        return out

    def task(self, method: str, channels: list[str]) -> AnomalyScoring:
        """The untrained detector task of `method` for `channels`, as these settings size it."""
        net = {"d_model": self.d_model, "n_heads": self.n_heads, "n_layers": self.n_layers}
        common = {"d_target": len(channels), "d_known": 0, "d_observed": 0, "target_names": list(channels),
                  "lr": self.lr, "warmup_steps": self.warmup_steps, "min_lr_ratio": self.min_lr_ratio}  # fmt: skip
        if method == "forecast":
            return DETECTORS[method](
                net=net, context_len=self.context_len - 1, horizon=1, head={"kind": "gaussian"}, **common
            )
        return DETECTORS[method](
            net=net, context_len=self.context_len, horizon=0, mask_ratio=self.mask_ratio,
            mask_mean_length=self.mask_mean_length, channel_out=self.channel_out, n_masks=self.n_masks,
            run_length=self.run_length, stride=self.stride, interpolate_hidden=True,
            window_norm=False,  # a level or spread changed within a window is what must show
            **common,
        )  # fmt: skip


@contextmanager
def _quiet_lightning():
    """Lightning's notes on devices and tips (a script prints its own figures), its warnings kept."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def fit_detector(
    train: pd.DataFrame,
    val: pd.DataFrame | None,
    channels: list[str],
    *,
    method: str = "masked",
    seed: int = 0,
    **settings,
) -> AnomalyScoring:
    """A detector trained on the normal `train` rows for `steps` optimiser steps, with the weights of
    its best validation loss (checked every tenth of them); `val`: held-out normal rows (None: the last
    20 % of each series of `train`) that set each channel's usual error (and a threshold at the task's
    false-alarm rate). The task's `val_scores` are the validation rows' scores, `val_loss` its best
    validation loss."""
    if method not in DETECTORS:
        raise SettingError(f"anomaly.method={method!r}: choose one of {METHODS}")
    s = DetectorSettings.of(settings)
    if val is None:
        train, val = split_normal_rows(train)
    torch.manual_seed(seed)
    task = s.task(method, channels)
    data = AnomalyData.of_tables(
        train, val, list(channels), context_len=task.hparams.context_len, horizon=task.hparams.horizon,
        batch_size=s.batch_size, seed=seed,
    )  # fmt: skip
    task.set_standardisation(data.loc, data.scale)
    with tempfile.TemporaryDirectory() as folder, _quiet_lightning():
        best = ModelCheckpoint(dirpath=folder, monitor="val/loss", save_weights_only=True)
        trainer = L.Trainer(
            max_steps=s.steps, max_epochs=-1, val_check_interval=max(1, s.steps // 10),
            check_val_every_n_epoch=None, gradient_clip_val=1.0, accelerator="auto", devices=1,
            logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
            callbacks=[best],
        )  # fmt: skip
        trainer.fit(task, datamodule=data)
        state = torch.load(best.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
    task.load_state_dict(state)
    task.to(trainer.strategy.root_device)  # scores on the device it trained on
    task.val_loss = float(best.best_model_score)
    task.calibrate(val)
    return task.eval()


__all__ = [
    "METHODS",
    "AnomalyDetector",
    "DetectorSettings",
    "Scores",
    "check_table",
    "covering_window_starts",
    "fit_detector",
    "series_rows",
    "split_normal_rows",
]
