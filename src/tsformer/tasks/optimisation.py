"""The optimiser and learning-rate schedule settings of every task, declared and checked once: a
setting group (`tasks/setting_groups.py`) every task takes; `Optimised.configure_optimizers` builds
AdamW and the schedule from them. A bad value is one `model.<key>: ...` line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import torch

LR_SCHEDULES = ("warmup_cosine", "epoch_decay")


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier: linear warmup from ~0 to 1, then cosine decay to `min_lr_ratio`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def epoch_decay(epoch: int, hold_epochs: int, decay: float) -> float:
    """LR multiplier of epoch `epoch` (0-based): 1 for the first `hold_epochs` epochs, then x `decay` an
    epoch. PatchTST's ETT schedule ("type3": 4 epochs at the learning rate, then x 0.9 an epoch) is
    hold 4, decay 0.9. It does not depend on the number of epochs, so a cap on them changes nothing."""
    return decay ** max(0, epoch + 1 - hold_epochs)


def _number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Optimisation:
    """AdamW's learning rate and weight decay, and the learning-rate schedule (`model.lr_schedule`):
    warmup_cosine: linear warmup over warmup_steps, cosine decay to min_lr_ratio x lr at the last step;
    epoch_decay: lr for lr_hold_epochs epochs, then x lr_decay an epoch, no warmup."""

    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05
    lr_schedule: str = "warmup_cosine"
    lr_hold_epochs: int = 4
    lr_decay: float = 0.9

    def __post_init__(self) -> None:
        problem = next(self.problems(), None)
        if problem is not None:
            raise ValueError(problem)

    def problems(self):
        """`model.<key>: ...` for each setting that cannot work."""
        rules = {
            "lr": (_number(self.lr) and self.lr > 0, "must be a number above 0, e.g. model.lr=1e-3"),
            "weight_decay": (_number(self.weight_decay) and self.weight_decay >= 0, "must be a number >= 0"),
            "warmup_steps": (
                _whole(self.warmup_steps) and self.warmup_steps >= 0,
                "must be a whole number >= 0",
            ),
            "min_lr_ratio": (_number(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1, "must be in [0, 1]"),
            "lr_schedule": (self.lr_schedule in LR_SCHEDULES, f"is not one of {', '.join(LR_SCHEDULES)}"),
            "lr_hold_epochs": (_whole(self.lr_hold_epochs) and self.lr_hold_epochs >= 0, "must be >= 0"),
            "lr_decay": (_number(self.lr_decay) and 0 < self.lr_decay <= 1, "must be in (0, 1]"),
        }
        for key, (fine, why) in rules.items():
            if not fine:
                yield f"model.{key}: {getattr(self, key)!r} {why}"

    def configure(self, module: torch.nn.Module, trainer) -> dict:
        """Lightning's `configure_optimizers` result: AdamW and the schedule, stepped per step or epoch."""
        optimizer = torch.optim.AdamW(module.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        if self.lr_schedule == "epoch_decay":  # set at each epoch's start; no warmup
            interval = "epoch"
            multiplier = lambda epoch: epoch_decay(epoch, self.lr_hold_epochs, self.lr_decay)
        else:
            interval = "step"
            total = int(trainer.estimated_stepping_batches)
            warmup = min(self.warmup_steps, max(1, total // 4))
            multiplier = lambda step: warmup_cosine(step, warmup, total, self.min_lr_ratio)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": interval}}


class Optimised:
    """A task trained with its `self.optimisation` (an `Optimisation`, set by its constructor)."""

    optimisation: Optimisation

    def configure_optimizers(self):
        return self.optimisation.configure(self, self.trainer)
