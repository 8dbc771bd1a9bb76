"""Settings several tasks take alike, each group declared once as a dataclass and checked in one place:
`Optimisation` (tasks/optimisation.py: lr, weight_decay, the schedule), `InputOptions` (below: RevIN,
channel independence, patch tokens) and `Masking` (tasks/masked.py: the hidden values of masked
fill-in and pre-training).

A task (`TakesSettings`) names its groups in `setting_groups` and takes their fields as keywords
(`**settings`, the config's `model.lr`, ...); `take_settings` makes each group an attribute, refuses a
setting no group or the constructor knows, and writes every group's values into the hyperparameters
(a model folder and a checkpoint keep them all). `task_settings` lists every keyword a task class
takes, with its type: what a model folder's `hparams` and a run's `model` config are checked against
(`check_task_settings`, before anything is built).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class InputOptions:
    """`model.revin`, `model.revin_affine`, `model.channel_independent`, `model.patch_len`,
    `model.patch_stride` (which family takes which: each task's own check)."""

    revin: bool = False  # reversible instance normalisation of the targets
    revin_affine: bool = False  # with a learnable affine map per channel
    channel_independent: bool = False  # each target channel its own series through shared weights
    patch_len: int | None = None  # one token per patch of this many steps (None: one per step)
    patch_stride: int | None = None  # steps between patch starts (None: patch_len)

    def __post_init__(self) -> None:
        if self.revin_affine and not self.revin:
            raise ValueError("model.revin_affine=true needs model.revin=true")
        if self.patch_stride is not None and self.patch_len is None:
            raise ValueError(f"model.patch_stride={self.patch_stride} needs model.patch_len")


class TakesSettings:
    """A task taking setting groups as keywords (see the module docstring)."""

    setting_groups: ClassVar[tuple[tuple[str, type], ...]] = ()  # (attribute, dataclass) pairs
    takes_settings_of: ClassVar[type | None] = None  # another task whose settings it takes, unused

    def take_settings(self, settings: dict) -> None:
        owner = {f.name: attr for attr, group in self.setting_groups for f in dataclasses.fields(group)}
        other = self.takes_settings_of
        unused = set(task_settings(other)) if other is not None else set()
        unknown = [k for k in settings if k not in owner and k not in unused]
        if unknown:
            raise ValueError(f"model.{unknown[0]}: not a setting of {type(self).__name__}")
        for attr, group in self.setting_groups:
            value = group(**{k: v for k, v in settings.items() if owner.get(k) == attr})
            setattr(self, attr, value)
            self.hparams.update(dataclasses.asdict(value))  # every one: defaults too


def task_settings(task_class: type) -> dict[str, inspect.Parameter]:
    """Every keyword `task_class` takes, with its type as `annotation`: its constructors' named
    parameters along the class hierarchy (a constructor with `**` hands the rest on), its setting
    groups' fields, and the settings of `takes_settings_of`."""
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
    for _, group in getattr(task_class, "setting_groups", ()):
        hints = typing.get_type_hints(group)
        for f in dataclasses.fields(group):
            kind, hint = inspect.Parameter.KEYWORD_ONLY, hints[f.name]
            found.setdefault(f.name, inspect.Parameter(f.name, kind, default=f.default, annotation=hint))
    other = getattr(task_class, "takes_settings_of", None)
    return found if other is None else {**task_settings(other), **found}


def check_task_settings(task_class: type, settings: dict) -> str | None:
    """The first problem of the `model` config `settings` for `task_class` (None: none): a setting it
    does not take, or a group's setting that cannot work."""
    known = task_settings(task_class)
    unknown = [k for k in settings if not k.startswith("_") and k not in known]
    if unknown:
        return f"model.{unknown[0]}: not a setting of {task_class.__name__} (it takes {', '.join(sorted(known))})"
    for _, group in getattr(task_class, "setting_groups", ()):
        names = {f.name for f in dataclasses.fields(group)}
        try:
            group(**{k: v for k, v in settings.items() if k in names})
        except (ValueError, TypeError) as err:
            return str(err)
    return None
