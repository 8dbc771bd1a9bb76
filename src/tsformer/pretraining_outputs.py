"""What a masked pre-training run (`pretrain=masked`) writes after its test: the model folder, which
`init_from` reads, logged to MLflow with the checkpoint, and the summary.

There is nothing to classify: no CSV, no pyfunc model. The folder is a classifier's folder
(`classifier.save_classifier_folder`: the network, the data contract, the channel scaler) holding the
pre-training task; it is logged as the run's artifacts under `model`, so that `runs:/<run id>/model`
and a bare run id find it as they find any run's model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from tsformer import tracking
from tsformer.classification_outputs import task_sizes
from tsformer.classifier import save_classifier_folder
from tsformer.config import command_line
from tsformer.forecaster import ModelInfo

__all__ = ["log_outputs", "print_summary", "task_sizes", "write_outputs"]

# the pre-training's own settings, which the fine-tuning command leaves out
PRETRAINING_ONLY = (
    "pretrain=",
    "model.mask_",
    "model.eval_mask_seed=",
    "model.interpolate_hidden=",
    "hydra.",
)


@dataclass
class PretrainingOutputs:
    """The files of a pre-training run; the field names of `train.RunOutputs`."""

    model_folder: Path
    csv_path: Path | None = None
    forecasts: None = None
    paths_path: Path | None = None


def write_outputs(cfg: DictConfig, task, datamodule, run_id: str | None) -> PretrainingOutputs:
    """The model folder (the encoder with its data contract)."""
    info = ModelInfo(
        family=task.family, dataset=datamodule.name, run_id=run_id, git_commit=tracking.git_commit()
    )
    folder = save_classifier_folder(Path(cfg.paths.output_dir) / "model", task, datamodule, info)
    return PretrainingOutputs(folder)


def log_outputs(recorder, task, datamodule, outputs: PretrainingOutputs, best_ckpt: str) -> None:
    """Log the checkpoint and the model folder; end the run FINISHED (no MLflow run: nothing)."""
    if not recorder.opened:
        return
    logger = recorder.logger
    tracking.log_files(logger, [("checkpoints", Path(best_ckpt))] if best_ckpt else [])
    logger.experiment.log_artifacts(logger.run_id, str(outputs.model_folder), "model")
    tracking.end_run(logger, "FINISHED")


def fine_tune_command(ref: str) -> str:
    """This run's command line without the pre-training settings, with `init_from=ref`: the same
    experiment, seed (the same validation samples) and network."""
    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # not started by Hydra (a script composing its config)
        overrides = ["experiment=<the same experiment>", "seed=<the same seed>"]
    kept = [o for o in overrides if not o.lstrip("+~").startswith((*PRETRAINING_ONLY, "init_from="))]
    return command_line("train", *kept, f"init_from={ref}")


def print_summary(logger, metrics: dict[str, float], baselines: list, outputs: PretrainingOutputs) -> None:
    """The run id, the test masked MSE / MAE beside interpolation's, and how to fine-tune from it."""
    lines = ["", "=" * 72]
    if logger is not None:
        lines.append(f"MLflow run id: {logger.run_id}   (tracking URI: {logger.experiment.tracking_uri})")
    lines.append(f"{'test metric (hidden values)':<30}{'model':>14}{'baseline':>14}")
    for name in ("mse", "mae"):
        model, line = (
            metrics.get(f"test/{name}", float("nan")),
            metrics.get(f"test/baseline_{name}", float("nan")),
        )
        lines.append(f"{name:<30}{model:>14.4f}{line:>14.4f}")
    lines += [f"{b.name}: {b.description}" for b in baselines]
    ref = logger.run_id if logger is not None else outputs.model_folder.resolve()
    lines.append(f"fine-tune a classifier from it: {fine_tune_command(str(ref))}")
    lines.append("=" * 72)
    print("\n".join(lines))
