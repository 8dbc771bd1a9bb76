"""`init_from=<run id | output folder | model folder>`: start a training from a saved model's weights.

The reference is resolved as `predict.py` resolves its MODEL (`predict.resolve_model`: a folder, an
MLflow run id or a runs:/ or models:/ URI, downloaded from the run's tracking URI) and the model
loaded and checked (`jobs.load_model`) before the data is read. Once the new task is built,
`load_into` copies the weights that fit into it, by this rule:

- the networks must be of one class (the family's: `EncoderOnly`, `DecoderOnly`,
  `EncoderDecoder`): another family's weights mean nothing to this one;
- the same task class (a refit: a forecaster or a reconstruction model on newer data, typically
  with a small `model.lr`): every tensor is taken, and every one must fit by name and shape; other
  channels, another horizon or other network sizes stop the run;
- another task on the same network (masked fill-in -> classifier or reconstruction): the
  Transformer blocks (every `TransformerStack`, with its final norm; all of them must fit) and
  learned positions that fit by name and shape.
Either way the blocks' settings (`BLOCK_SETTINGS`: d_model, n_heads, n_layers, ...) must be the model's:
some of them (n_heads, norm) change what the weights mean without changing a shape.
  The input projections are taken only between tasks that declare one input layout (`input_layout`:
  a classifier and the masked pre-training of its encoder both read the scaled channels of each
  step), where they fit by shape; otherwise each task lays its inputs out its own way (masked fill-in
  reads values, mask flags and covariates; reconstruction the covariates), so a width that happens
  to match would still mean other inputs. Neither are the heads,
  [CLS] token, linear skip, static embeddings and RevIN affine of the other task: they answer
  another question.
The task's own buffers (a classifier's class weights, a distribution head's spread factors) always
come from the new run's data and calibration. A refit also keeps the model's scalers (`keep_scalers`,
`TimeSeriesDataModule.keep_features`): its weights read inputs scaled as in its training, and a few
weeks of newer rows (one season) would scale them otherwise. What does not fit stops the run with one
`SettingError` line, before any MLflow run exists.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import get_class

from tsformer import tracking
from tsformer.data.features import FeaturePipeline
from tsformer.model_folder import state_mismatch
from tsformer.settings import SettingError

log = logging.getLogger(__name__)

# the `model.net` settings that make the Transformer blocks what they are (`nn.config.TransformerConfig`)
BLOCK_SETTINGS = (
    "d_model", "n_heads", "n_layers", "ffn_expansion", "activation", "norm", "norm_layer", "residual_attention",
)  # fmt: skip


@dataclass
class Source:
    """The model `init_from` names, loaded."""

    reference: str  # as given
    location: str  # the model folder, or the MLflow URI it was downloaded from
    run_id: str | None  # the run that trained it (its tsformer.json), if known
    task: torch.nn.Module  # the task with its weights
    state: dict[str, torch.Tensor]
    features: FeaturePipeline | None  # its fitted scalers (None: a classifier's are of another kind)

    @property
    def vocabularies(self) -> dict | None:
        """The categories of its static embeddings (None: a classifier has none)."""
        return self.features.static_vocabularies if self.features is not None else None

    def tags(self) -> dict[str, str]:
        """What the new MLflow run records about where it started."""
        tags = {"init_from": self.location}
        if self.run_id:
            tags["init_from_run_id"] = self.run_id
        return tags


def resolve(reference: str, tracking_uri: str | None) -> Source:
    """The model `reference` names, loaded; a reference that names none: one `SettingError` line."""
    from tsformer.jobs import load_model
    from tsformer.serving.references import RUN_ID, resolve_model

    where = f"init_from={reference}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = resolve_model(reference, tracking_uri, Path(tmp))
            model = load_model(folder)
    except (FileNotFoundError, ValueError, tracking.TrackingServerUnreachable) as err:
        raise SettingError(f"{where}: {err}") from err  # ModelFolderError is a ValueError
    if Path(reference).expanduser().is_dir():
        location = str(folder.resolve())
    else:  # the temporary download is gone: the URI it came from
        location = f"runs:/{reference}/model" if RUN_ID.match(reference) else reference
    state = {k: v.detach().clone() for k, v in model.task.state_dict().items()}
    features = model.contract if isinstance(model.contract, FeaturePipeline) else None
    return Source(reference, location, model.info.run_id, model.task, state, features)


OUTPUT_LAYERS = ("net.head.", "net.linear_skip.")  # what `freeze` leaves trainable of the weights taken


def freeze(task: torch.nn.Module, taken: list[str]) -> None:
    """`init_from_freeze=true`: the parameters `taken` from the model stay as they are, but the output
    layer; what the run initialised trains. A refit then recalibrates the model's outputs (a few weeks of
    one season cannot overfit them much); a pre-trained encoder is probed with a new head (and a new
    input projection unless both tasks read one input layout)."""
    frozen = set(taken)
    for name, p in task.named_parameters():
        p.requires_grad_(name not in frozen or name.startswith(OUTPUT_LAYERS))
    trains = [n for n, p in task.named_parameters() if p.requires_grad]
    n_all = len(list(task.parameters()))
    log.info("init_from_freeze: %d of %d parameter tensors train: %s", len(trains), n_all, ", ".join(trains))


def keep_scalers(datamodule, source: Source, model_cfg) -> None:
    """In a refit (the run's task is `source`'s again) with windowed data, the data module (not set up
    yet) scales with the model's own scalers; columns of other roles stop the run with one line."""
    refit = get_class(model_cfg._target_) is type(source.task)
    if not refit or source.features is None or not hasattr(datamodule, "keep_features"):
        return
    try:
        datamodule.keep_features(source.features)
    except ValueError as err:
        raise SettingError(f"{_where(source)}: {err}") from err


def _where(source: Source) -> str:
    """How messages name the model: as given, and where it was found when that differs."""
    where = f"init_from={source.reference}"
    if source.location != source.reference:
        where += f" (model {source.location})"
    return where


def load_into(
    task: torch.nn.Module, source: Source, vocabularies: dict | None = None
) -> dict[str, list[str]]:
    """Copy `source`'s weights that fit into `task` by the module docstring's rule; returns the
    names `{"taken": [...], "fresh": [...]}` (fresh: left at their initialisation) and logs them.
    `vocabularies`: the new data's static categories, which a refit's embeddings must share."""
    own = task.state_dict()
    same_task = type(source.task) is type(task)
    wanted = _fitting_part(task, own, source, same_task, vocabularies)
    if not same_task:  # learned positions, and the input projection of one input layout: where they fit
        layout = getattr(task, "input_layout", None)
        same_inputs = layout is not None and getattr(source.task, "input_layout", None) == layout
        wanted += [
            k
            for k in own
            if (".positional." in k or (same_inputs and k.startswith("net.input_proj.")))
            and k in source.state
            and source.state[k].shape == own[k].shape
        ]
    task.load_state_dict({k: source.state[k] for k in wanted}, strict=False)
    fresh = [k for k in own if k not in set(wanted)]
    log.info(
        "init_from=%s: loaded %d of %d tensors from %s%s%s; left at their initialisation: %s",
        source.reference,
        len(wanted),
        len(own),
        source.location,
        f" (run {source.run_id})" if source.run_id else "",
        "" if same_task else f", the Transformer blocks and what fits of a {type(source.task).__name__}",
        ", ".join(fresh) or "none",
    )
    return {"taken": wanted, "fresh": fresh}


def _fitting_part(task, own: dict, source: Source, same_task: bool, vocabularies) -> list[str]:
    """The names of `own` (the new task's state) that `source` must and can fill: every weight (a refit)
    or the Transformer blocks (another task); a `SettingError` naming what does not fit otherwise."""
    where = _where(source)
    theirs, ours = type(source.task.net).__name__, type(task.net).__name__
    if theirs != ours:
        raise SettingError(
            f"{where} is {type(source.task).__name__} ({source.task.family}, network {theirs}); this run "
            f"builds {type(task).__name__} ({task.family}, network {ours}): no weights carry over; "
            "start from a model of the same family, or drop init_from"
        )
    settings = _block_settings_that_differ(source.task, task)
    if settings:
        raise SettingError(
            f"{where}: its Transformer blocks do not fit this run's: {settings}; give the model's settings"
        )
    what = "this run's network (a refit takes every weight)" if same_task else "this run's Transformer blocks"
    wanted, offered = _part(task, own, same_task), _part(source.task, source.state, same_task)
    problem = state_mismatch(source.state, own, wanted, offered)
    if problem:
        raise SettingError(f"{where} does not fit {what}: {problem}")
    if same_task and source.vocabularies and vocabularies is not None and source.vocabularies != vocabularies:
        raise SettingError(
            f"{where}: its static embeddings are of the categories {source.vocabularies}, this data's are "
            f"{vocabularies} (data.static_categorical_cols): a refit needs the same categories"
        )
    return wanted


def _block_settings_that_differ(theirs: torch.nn.Module, ours: torch.nn.Module) -> str:
    """The `model.net` settings of the blocks that differ ("" when none): some (n_heads, norm) leave
    every shape as it is but change what the weights mean."""
    a, b = dict(theirs.hparams["net"]), dict(ours.hparams["net"])
    differ = [k for k in BLOCK_SETTINGS if a.get(k) != b.get(k)]
    return ", ".join(f"model.net.{k}={b.get(k)} here, {a.get(k)} in the model" for k in differ)


def _part(task: torch.nn.Module, state: dict, same_task: bool) -> list[str]:
    """The entries of `task`'s `state` that a start from another model must fill: every one but the
    task's own buffers (same task), or those of its Transformer stacks (another task)."""
    from tsformer.nn.blocks import TransformerStack

    if same_task:
        from_data = {name for name, _ in task.named_buffers(recurse=False)}  # class weights, spread factors
        return [k for k in state if k not in from_data]
    stacks = tuple(f"{name}." for name, m in task.named_modules() if isinstance(m, TransformerStack))
    return [k for k in state if k.startswith(stacks)]
