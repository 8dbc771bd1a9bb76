"""A trained model as a self-contained folder, for every kind of model: written (`write`), read and
checked (`read`) in one place. Each job package declares the kinds of folder its models are (a
`FolderKind`: `forecaster` in jobs/forecasting/forecaster.py, `classifier` and `ensemble` in
jobs/classification/, `anomaly` in jobs/anomaly/judging.py; `Job.folders`, collected in
`jobs.FOLDER_KINDS`), and the inference object built on top of it (`Forecaster`, `Classifier`, ...).

The folder holds
- `tsformer.json`: its format, `"format": "<kind>-<version>"` (e.g. `forecaster-3`), the task class and
  its hyperparameters, the data contract (the kind's dataclass: what a table must hold and how training
  scaled it, as plain numbers) and where the weights came from (`ModelInfo`); an ensemble names its
  `members` (folders of another kind inside it) in place of hyperparameters and weights;
- `weights.pt`: the network's weights, a plain state dict loaded with `torch.load(weights_only=True)`.
Nothing in it is pickled Python, and no code is imported but the tsformer package's own task classes.

`read` refuses a damaged or hostile folder with one line naming the file and the key (`ModelFolderError`),
checking in this order, each before anything is built: the format (a kind this tsformer reads, a version
neither newer than it writes nor older than it reads; an older version is first brought up to date by
the kind's `upgrades`); every key and type of `tsformer.json` (the kind's contract dataclass); the task
class and every hyperparameter's name and type (its constructor's); the contract's values (counts that
follow from the column roles, scaler numbers, ranges: the kind's `check_contract`); the weights file;
every weight's name and shape against the network the hyperparameters describe, built on PyTorch's meta
device (no memory: `d_model: 10**9` is refused without allocating it); only then the network itself,
with the weights loaded.

Adding a field to a kind (docs/architecture.md, "The model folder"): the field in its contract
dataclass, the kind's `version` one up, and an `Upgrade` from the old version in its `upgrades` giving
an old folder's `tsformer.json` (and weights) the field's value that reproduces what the old folder did.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tsformer.serving.writers import write_atomically
from tsformer.tasks.setting_groups import task_settings

CONFIG_FILE = "tsformer.json"
WEIGHTS_FILE = "weights.pt"
RESTORE = (
    "copy the folder again from the training run (its output folder's model/, or model/artifacts/model "
    "in its MLflow run) or train again"
)
FORMAT = re.compile(r"^([a-z_]+)-(\d+)$")  # "<kind>-<version>"
# `format_version: n` was a forecaster's header up to version 2, before every kind had `format`
LAST_FORMAT_VERSION = 2


class ModelFolderError(ValueError):
    """A model folder that cannot be used as it is; the message names the file and what is wrong."""


@dataclass
class ModelInfo:
    """Where the weights came from (for people; prediction does not depend on it)."""

    family: str
    dataset: str
    run_id: str | None = None
    git_commit: str | None = None
    extra: dict = field(default_factory=dict)


def _unchanged(value, *rest):
    return value


def _nothing(*args) -> None:
    return None


@dataclass(frozen=True)
class Upgrade:
    """How a folder of one version of a kind is read as the next version (its `format` is set by
    `read`): its `tsformer.json` and its weights (`(state, config) -> state`) made what the next version
    writes, with the values that reproduce what the older folder did."""

    config: Callable[[dict], dict] = _unchanged
    weights: Callable[[dict, dict], dict] = _unchanged


@dataclass(frozen=True)
class FolderKind:
    """One kind of model folder: its format, how its `tsformer.json` is laid out and checked, and what
    it loads as."""

    name: str  # the format's first word, e.g. "forecaster"
    version: int  # the format this tsformer writes: "<name>-<version>"
    describes: str  # for messages: "forecasting model"
    contract: type  # the dataclass `data` holds: every key written, and required when read
    tasks: tuple[type, ...]  # the task classes a folder of this kind may name (their subclasses too)
    load: Callable[[Path], Any]  # model folder -> its inference object (`Forecaster.load`, ...)
    # contract, hparams, path: refuses values the types allow but prediction cannot use
    check_contract: Callable[[Any, dict, Path], None] = _nothing
    upgrades: Mapping[int, Upgrade] = field(default_factory=dict)  # older version n -> n + 1 (all read)
    member_kind: FolderKind | None = (
        None  # an ensemble: `members`, folders of this kind, in place of a network
    )

    @property
    def format(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def oldest(self) -> int:
        """The oldest version read: the upgrades reach back to it without a gap."""
        version = self.version
        while version - 1 in self.upgrades:
            version -= 1
        return version

    def keys(self) -> dict:
        """The keys of `tsformer.json` and their types."""
        network = {"members": list[str]} if self.member_kind is not None else {"hparams": dict}
        return {"format": str, "task_class": str, **network, "data": self.contract, "info": ModelInfo}


def plain(value):
    """Hyperparameters as JSON values (Hydra may hand over tuples; numpy scalars sneak in)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def write(folder: str | Path, kind: FolderKind, task, contract, info: ModelInfo) -> Path:
    """Write `task`'s network and the data `contract` (a dataclass) to `folder`, each file atomically
    (a run stopped while writing leaves no half-written file behind)."""
    folder = Path(folder)
    task_class = type(task)
    state = {k: v.detach().cpu() for k, v in task.state_dict().items()}  # network + static embeddings
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / WEIGHTS_FILE, lambda tmp: torch.save(state, tmp))
    write_config(folder, kind, {
        "task_class": f"{task_class.__module__}.{task_class.__qualname__}", "hparams": plain(dict(task.hparams)),
        "data": asdict(contract), "info": asdict(info),
    })  # fmt: skip
    return folder


def write_config(folder: Path, kind: FolderKind, keys: dict) -> Path:
    """`tsformer.json` of a folder of `kind`: its format, then `keys`; atomically, and last (a folder
    without it is no model)."""
    config = {"format": kind.format, **keys}
    return write_atomically(folder / CONFIG_FILE, lambda tmp: tmp.write_text(json.dumps(config, indent=2)))


def read_config(folder: str | Path) -> tuple[dict, Path]:
    """`tsformer.json` of `folder` parsed as a JSON object, and its path (nothing checked but that)."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{folder} is not a tsformer model folder: {CONFIG_FILE} is missing (a training run writes "
            "one to <run output folder>/model and logs it to MLflow)"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelFolderError(f"{path}: not readable as JSON ({err}): {RESTORE}") from err
    if not isinstance(config, dict):
        raise ModelFolderError(f"{path}: the file is {_json_kind(config)}, expected an object: {RESTORE}")
    return config, path


def format_of(config: dict, path: Path) -> tuple[str, int]:
    """(kind, version) of a folder's `tsformer.json` by its header; the headers an older tsformer wrote
    are read here, and only here: `format_version: n` (a forecaster, n up to 2) and `"classifier-1"`
    naming `members` (an ensemble: version 0)."""
    written = config.get("format")
    legacy = config.get("format_version")
    if written is None and type(legacy) is int and 0 < legacy <= LAST_FORMAT_VERSION:
        return "forecaster", legacy
    if written == "classifier-1" and "members" in config:
        return "ensemble", 0
    found = FORMAT.match(written) if isinstance(written, str) else None
    if found is None:
        shown = f"format {written!r}" if "format" in config else f"format_version {legacy!r}"
        raise ModelFolderError(
            f"{path}: {shown if 'format' in config or legacy else 'no format'}, not the header of a tsformer "
            f"model folder (format '<kind>-<version>'): {RESTORE}"
        )
    return found.group(1), int(found.group(2))


def kind_of(config: dict, path: Path, kinds: Mapping[str, FolderKind]) -> FolderKind:
    """The kind among `kinds` a folder's `tsformer.json` is, of a version this tsformer reads."""
    name, version = format_of(config, path)
    if name not in kinds:
        raise ModelFolderError(
            f"{path}: format '{name}-{version}' is no kind of model folder this tsformer reads "
            f"({', '.join(sorted(kinds))}): load it with the tsformer that wrote it"
        )
    _check_version(kinds[name], version, path)
    return kinds[name]


def _check_version(kind: FolderKind, version: int, path: Path) -> None:
    shown = f"format '{kind.name}-{version}'"
    if version > kind.version:
        raise ModelFolderError(
            f"{path}: {shown} is newer than this tsformer reads ({kind.format}): load it with the tsformer "
            "that wrote it, or a newer one"
        )
    if version < kind.oldest:
        raise ModelFolderError(
            f"{path}: {shown} is older than this tsformer reads ({kind.name}-{kind.oldest} to {kind.format}): "
            "train the model again, or load it with the tsformer that wrote it"
        )


def read_checked_config(folder: str | Path, kind: FolderKind) -> tuple[dict, Path, int]:
    """`tsformer.json` of a folder of `kind`, brought up to the version this tsformer writes and
    checked key by key against `kind.keys()`; its path; the version it was written in."""
    config, path = read_config(folder)
    name, version = format_of(config, path)
    if name != kind.name:
        raise ModelFolderError(
            f"{path}: format '{name}-{version}' is not a {kind.describes}'s ({kind.format}): {RESTORE}"
        )
    _check_version(kind, version, path)
    if "format" not in config:  # an older forecaster's header
        config = {k: v for k, v in config.items() if k != "format_version"}
    for older in range(version, kind.version):
        config = {**kind.upgrades[older].config(config), "format": f"{kind.name}-{older + 1}"}
    config["format"] = kind.format
    keys = kind.keys()
    _check_keys(config, keys, set(keys), "", path)
    return config, path, version


def contract_of(config: dict, kind: FolderKind):
    """The data contract of a checked `tsformer.json` (`read_checked_config`), as its kind's dataclass."""
    return from_json(config["data"], kind.contract)


def from_json(value, hint):
    """A checked JSON `value` as the type `hint` describes (dataclasses built, with what they hold)."""
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(**{name: from_json(item, hints[name]) for name, item in value.items()})
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        options = [o for o in typing.get_args(hint) if o is not type(None)]
        return None if value is None else from_json(value, options[0])
    args = typing.get_args(hint)
    if isinstance(value, list) and args:
        return [from_json(item, args[0]) for item in value]
    if isinstance(value, dict) and len(args) == 2:
        return {key: from_json(item, args[1]) for key, item in value.items()}
    return value


def read(folder: str | Path, kind: FolderKind):
    """(task with its weights, in eval mode; data contract; `ModelInfo`) of the model in `folder`,
    checked (see the module docstring)."""
    config, path, version = read_checked_config(folder, kind)
    task_class = _task_class(config["task_class"], kind, path)
    hparams = config["hparams"]
    settings = task_settings(task_class)
    required = {name for name, p in settings.items() if p.default is inspect.Parameter.empty}
    _check_keys(hparams, {name: p.annotation for name, p in settings.items()}, required, "hparams", path)
    contract = contract_of(config, kind)
    kind.check_contract(contract, hparams, path)
    weights = Path(folder) / WEIGHTS_FILE
    state = read_weights(weights)
    for older in range(version, kind.version):
        state = kind.upgrades[older].weights(state, config)
    with torch.device("meta"):  # the network's shapes, without its memory
        probe = _build(task_class, hparams, path)
    mismatch = state_mismatch(state, probe.state_dict())
    if mismatch:
        raise ModelFolderError(
            f"{weights} does not fit the network {CONFIG_FILE} describes: {mismatch};"
            f" the two files come from different models: {RESTORE}"
        )
    broken = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if broken:
        raise ModelFolderError(
            f"{weights}: {len(broken)} weight(s) hold NaN or infinite values (e.g. {broken[0]!r}): {RESTORE}"
        )
    task = _build(task_class, hparams, path)
    task.load_state_dict(state)
    return task.eval(), contract, from_json(config["info"], ModelInfo)


def member_folders(folder: str | Path, kind: FolderKind) -> tuple[list[Path], dict]:
    """The member folders an ensemble's checked `tsformer.json` names (inside `folder`), and the config."""
    config, path, _ = read_checked_config(folder, kind)
    _task_class(config["task_class"], kind, path)
    members = config["members"]
    if not members or not all(m not in ("", ".", "..") and Path(m).name == m for m in members):
        raise ModelFolderError(f"{path}: 'members' must name the member folders inside {folder}: {RESTORE}")
    return [Path(folder) / m for m in members], config


def _task_class(name: str, kind: FolderKind, path: Path) -> type:
    task_class = task_class_of(name)
    if task_class is None:
        raise unknown_task(name, path)
    if not issubclass(task_class, kind.tasks):
        raise ModelFolderError(f"{path}: task_class {name!r} is not a task of a {kind.describes}: {RESTORE}")
    return task_class


def unknown_task(name, path: Path) -> ModelFolderError:
    """The error of a `task_class` that names no task of this tsformer."""
    return ModelFolderError(
        f"{path}: task_class {name!r} is not a task of this tsformer (such as "
        f"'tsformer.tasks.forecasting.EncoderDecoderForecaster'): {RESTORE}"
    )


def _build(task_class: type, hparams: dict, path: Path):
    """The (untrained) task from its checked hparams; what fails here is the file's hparams."""
    try:
        return task_class(**hparams)
    except Exception as err:  # the code is known good
        raise ModelFolderError(
            f"{path}: hparams do not build a network of {task_class.__name__} ({type(err).__name__}: "
            f"{first_line(err)}): {RESTORE}"
        ) from err


def first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


# -- the JSON checker ------------------------------------------------------------------------------


def check_json(value, hint, where: str, path: Path) -> None:
    """Raise `ModelFolderError` unless the JSON `value` (at key `where` of the file `path`) is a `hint`:
    int, float, str, bool, dict, list[...], dict[str, ...], a union of those with None, or a
    dataclass (a JSON object with its fields as keys)."""
    if not _fits(value, hint, where, path):
        raise ModelFolderError(
            f"{path}: {where or 'the file'} is {_json_kind(value)}, expected {_hint_name(hint)}: {RESTORE}"
        )


def _fits(value, hint, where: str, path: Path) -> bool:
    """Whether `value` itself is a `hint`; what it holds (fields, items) is checked on the way, and a
    wrong part refused with its own key."""
    kind = typing.get_origin(hint) or hint
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict) and _fields_fit(value, hint, where, path)
    if kind in (types.UnionType, typing.Union):
        return any(_fits_quietly(value, option, where, path) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is typing.Any:
        return True
    if hint in (int, float):  # JSON has no int/float distinction for whole floats; bool is no number
        return isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
    if kind in (str, bool, list, dict):
        return isinstance(value, kind) and _items_fit(value, typing.get_args(hint), where, path)
    return False


def _fits_quietly(value, option, where: str, path: Path) -> bool:
    """One option of a union: whether `value`, with all it holds, is one."""
    try:
        check_json(value, option, where, path)
    except ModelFolderError:
        return False
    return True


def _fields_fit(value: dict, hint, where: str, path: Path) -> bool:
    """The JSON object `value` as the dataclass `hint`: its fields' keys, every one (the writer writes
    them all), and values (refused if not)."""
    required = {f.name for f in dataclasses.fields(hint)}
    _check_keys(value, typing.get_type_hints(hint), required, where, path)
    return True


def _items_fit(value, args: tuple, where: str, path: Path) -> bool:
    """The items of a list (`args`: its item type) or the values of a dict (`args`: key and value
    types) checked; a str or bool, or a list or dict without `args`, holds nothing to check."""
    if args and isinstance(value, list):
        for i, item in enumerate(value):
            check_json(item, args[0], f"{where}[{i}]", path)
    elif args and isinstance(value, dict):
        for key, item in value.items():
            check_json(item, args[1], f"{where}.{key}", path)
    return True


def _check_keys(value: dict, hints: dict, required: set[str], where: str, path: Path) -> None:
    """The JSON object `value` has every key of `required`, no key outside `hints`, and each value fits
    its hint."""
    inside = f" in {where}" if where else ""
    unknown = sorted(set(value) - set(hints))
    if unknown:
        raise ModelFolderError(f"{path}: unknown key(s) {unknown}{inside}: {RESTORE}")
    missing = sorted(required - set(value))
    if missing:
        raise ModelFolderError(f"{path}: key(s) {missing} missing{inside}: {RESTORE}")
    for key, item in value.items():
        check_json(item, hints[key], f"{where}.{key}" if where else key, path)


def _json_kind(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}  # fmt: skip
    shown = repr(value) if isinstance(value, (str, int, float)) else ""  # bool is an int
    return names.get(type(value), type(value).__name__) + (f" ({shown[:40]})" if shown else "")


def _hint_name(hint) -> str:
    if dataclasses.is_dataclass(hint):
        return "an object"
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return " or ".join(_hint_name(option) for option in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(hint, "__name__", str(hint)) if not typing.get_args(hint) else str(hint)


def task_class_of(task_class_name) -> type | None:
    """The class `module.qualname` names when it is a class of the tsformer package (no other module
    is imported: a model folder never runs code); None otherwise."""
    module, _, name = str(task_class_name).rpartition(".")
    if not module.startswith("tsformer."):
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) else None


def read_weights(path: Path) -> dict:
    """The state dict in `weights.pt`: a file torch reads, holding named tensors only."""
    if not path.is_file():
        raise ModelFolderError(f"{path} is missing: {RESTORE}")
    if path.stat().st_size == 0:
        raise ModelFolderError(f"{path} is empty: {RESTORE}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # whatever torch cannot read here is a damaged file
        reason = first_line(err).split(". ")[0][:120]  # torch's first sentence (the rest: advice on pickles)
        raise ModelFolderError(f"{path}: not a weights file torch can read ({reason}): {RESTORE}") from err
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()
    ):
        raise ModelFolderError(f"{path}: holds other things than named tensors (a state dict): {RESTORE}")
    return state


def state_mismatch(state: dict, own: dict, wanted=None, offered=None) -> str:
    """How the weights `state` do not fit the network's own state dict `own` ("" when they fit): the
    names of `wanted` (default: all of `own`) it lacks or holds in another shape, and the names of
    `offered` (default: all of `state`) that `own` has not."""
    wanted = list(own) if wanted is None else wanted
    offered = list(state) if offered is None else offered
    missing = [k for k in wanted if k not in state]
    unknown = [k for k in offered if k not in own]
    reshaped = [k for k in wanted if k in state and state[k].shape != own[k].shape]
    problems = []
    if missing:
        problems.append(f"{len(missing)} weight(s) missing (e.g. {missing[0]!r})")
    if unknown:
        problems.append(f"{len(unknown)} unknown (e.g. {unknown[0]!r})")
    if reshaped:
        k = reshaped[0]
        problems.append(
            f"{len(reshaped)} of another shape (e.g. {k!r}: {list(state[k].shape)}, the network has "
            f"{list(own[k].shape)})"
        )
    return ", ".join(problems)
