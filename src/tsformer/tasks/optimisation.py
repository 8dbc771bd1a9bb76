"""The optimiser and learning-rate schedule settings of every task, declared and checked once.

Each task's constructor takes them as keywords (`**optimisation`, the config's `model.lr`, ...) and
hands them to `Optimisation.of`, which refuses an unknown one; `Optimised.configure_optimizers` builds
AdamW and the schedule from them. `check_task_settings` checks a whole `model` config against its
task class before anything is built (`settings.check`): an unknown setting or a bad value is one
`model.<key>: ...` line.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
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

    @classmethod
    def of(cls, settings: dict, task: str) -> Optimisation:
        """The settings a task's constructor got as keywords beyond its own; any other is refused."""
        unknown = [k for k in settings if k not in OPTIMISATION]
        if unknown:
            raise ValueError(f"model.{unknown[0]}: not a setting of {task}")
        return cls(**settings)

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


OPTIMISATION = tuple(f.name for f in dataclasses.fields(Optimisation))  # the settings' names


class Optimised:
    """A task trained with its `self.optimisation` (an `Optimisation`, set by its constructor)."""

    optimisation: Optimisation

    def configure_optimizers(self):
        return self.optimisation.configure(self, self.trainer)


def task_settings(task_class: type) -> dict[str, inspect.Parameter]:
    """Every keyword `task_class` takes, with its type as `annotation`: its constructors' named
    parameters along the class hierarchy (a constructor with `**` hands the rest to its parent's), and
    the `Optimisation` settings."""
    found: dict[str, inspect.Parameter] = {}
    for cls in task_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None or not cls.__module__.startswith("tsformer."):
            continue
        parameters = list(inspect.signature(init).parameters.values())[1:]  # without self
        hints = typing.get_type_hints(init)
        for p in parameters:
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                found.setdefault(p.name, p.replace(annotation=hints.get(p.name, typing.Any)))
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    if issubclass(task_class, Optimised):
        hints = typing.get_type_hints(Optimisation)
        for f in dataclasses.fields(Optimisation):
            kind, hint = inspect.Parameter.KEYWORD_ONLY, hints[f.name]
            found.setdefault(f.name, inspect.Parameter(f.name, kind, default=f.default, annotation=hint))
    other = getattr(task_class, "takes_settings_of", None)  # settings taken for another task's sake
    return found if other is None else {**task_settings(other), **found}


def check_task_settings(task_class: type, settings: dict) -> str | None:
    """The first problem of the `model` config `settings` for `task_class` (None: none): a setting it
    does not take, or an optimisation setting that cannot work."""
    known = task_settings(task_class)
    unknown = [k for k in settings if not k.startswith("_") and k not in known]
    if unknown:
        return f"model.{unknown[0]}: not a setting of {task_class.__name__} (it takes {', '.join(sorted(known))})"
    given = {k: v for k, v in settings.items() if k in OPTIMISATION}
    try:
        Optimisation(**given)
    except ValueError as err:
        return str(err)
    return None
