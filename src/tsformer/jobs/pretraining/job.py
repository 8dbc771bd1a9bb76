"""Masked pre-training of a classifier's encoder (`pretrain=masked`): the model folder, which `init_from`
reads, logged to MLflow with the checkpoint, and the summary.

There is nothing to classify: no CSV, no pyfunc model. The folder is a classifier's folder
(`classifier.save_classifier_folder`: the network, the data contract, the channel scaler) holding the
pre-training task; it is logged as the run's artifacts under `model`, so that `runs:/<run id>/model`
and a bare run id find it as they find any run's model.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from omegaconf import DictConfig

from tsformer import tracking
from tsformer.config import command_line
from tsformer.data.sequences import ClassificationData
from tsformer.jobs.base import RunOutputs, job_of_module, metric_table, refuses
from tsformer.jobs.classification import job as classification
from tsformer.jobs.classification.classifier import FOLDER, not_a_classifier, save_classifier_folder
from tsformer.jobs.forecasting.forecaster import ModelInfo
from tsformer.tasks.pretraining import MaskedPretraining

# the pre-training's own settings, which the fine-tuning command leaves out
PRETRAINING_ONLY = (
    "pretrain=",
    "trainer.max_steps=",  # the pre-training's budget: no key of the fine-tuning's trainer config
    "model.mask_",
    "model.eval_mask_seed=",
    "model.interpolate_hidden=",
    "hydra.",
)


task_sizes = classification.task_sizes  # the classifier's, so that its fine-tuning takes the weights


def data_filter(datamodule) -> bool:
    return datamodule.pretraining


def write_outputs(cfg: DictConfig, task, datamodule, run_id: str | None) -> RunOutputs:
    """The model folder (the encoder with its data contract)."""
    info = ModelInfo(
        family=task.family, dataset=datamodule.name, run_id=run_id, git_commit=tracking.git_commit()
    )
    folder = save_classifier_folder(Path(cfg.paths.output_dir) / "model", task, datamodule, info)
    return RunOutputs(folder)  # no example: no pyfunc model, the folder is logged as the artifacts `model`


def fine_tune_command(ref: str) -> str:
    """This run's command line without the pre-training settings, with `init_from=ref`: the same
    experiment, seed (the same validation samples) and network."""
    from hydra.core.hydra_config import HydraConfig  # not at import: loading a model needs no Hydra

    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # not started by Hydra (a script composing its config)
        overrides = ["experiment=<the same experiment>", "seed=<the same seed>"]
    kept = [o for o in overrides if not o.lstrip("+~").startswith((*PRETRAINING_ONLY, "init_from="))]
    return command_line("train", *kept, shlex.quote(f"init_from={ref}"))


def summary_lines(metrics: dict[str, float], baselines: list, outputs: RunOutputs) -> list[str]:
    """The test masked MSE / MAE beside interpolation's."""
    return metric_table(metrics, ["mse", "mae"], baselines, header="test metric (hidden values)")


def log_outputs(logger, cfg: DictConfig, task, datamodule, outputs: RunOutputs) -> None:
    """Nothing beyond the checkpoint and the model folder (`callbacks.MLflowRun.log_outputs`)."""


JOB = job_of_module(
    __name__,
    data_class=ClassificationData,
    folders=(FOLDER,),
    name="pretraining",
    tasks=(MaskedPretraining,),
    data="labelled sequences or streams with a classifier's model config, for pretrain=masked",
    prediction=refuses(lambda model: not_a_classifier(model.info)),
    usage=lambda ref: f"fine-tune a classifier from it: {fine_tune_command(ref)}",
)
