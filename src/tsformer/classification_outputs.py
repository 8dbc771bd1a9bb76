"""What a classification run writes after its test: the classes CSV, the model folder, the MLflow
outputs (CSV, checkpoint, confusion matrix, reliability diagram, pyfunc model) and the summary.

`train.run` calls these through its `Job` (one per job: forecasting or classification), in the
order and places the forecasting outputs take; the run's life cycle (`callbacks.MLflowRun`) is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display (as plots.py)

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from omegaconf import DictConfig

from tsformer import tracking
from tsformer.classifier import Classifier, classes_frame, save_classifier_folder
from tsformer.config import command_line
from tsformer.data.sequences import LABEL_CODE
from tsformer.export import write_csv
from tsformer.forecaster import ModelInfo
from tsformer.tasks.classification import ECE_BINS, METRICS


@dataclass
class ClassificationOutputs:
    """The files of a classification run; the field names of `train.RunOutputs`."""

    csv_path: Path | None
    forecasts: pd.DataFrame  # the classes CSV's rows (every test sample)
    model_folder: Path
    example: pd.DataFrame  # test samples as predict.py takes them (for the pyfunc signature)
    example_forecasts: pd.DataFrame  # the saved folder's classes of `example`
    paths_path: Path | None = None


def task_sizes(datamodule) -> dict:
    """What the classification task takes from its data."""
    counts = np.bincount(datamodule.labels("train"), minlength=datamodule.n_classes)
    return {"d_in": datamodule.d_in, "classes": datamodule.classes, "class_counts": counts.tolist()}


def test_frame(task, datamodule) -> pd.DataFrame:
    """The test samples' classes and probabilities, in sample order (the CSV's rows)."""
    tested = task.test_outputs
    labels = np.asarray(datamodule.classes, dtype=object)[tested["true"]]
    return classes_frame(datamodule.sample_info("test"), tested["proba"], datamodule.classes, labels)


def write_outputs(cfg: DictConfig, task, datamodule, run_id: str | None) -> ClassificationOutputs:
    """The classes CSV and the model folder, checked by a round trip on a few test samples."""
    output_dir = Path(cfg.paths.output_dir)
    frame = test_frame(task, datamodule)
    csv_path = write_csv(frame, output_dir / cfg.forecasts_file) if cfg.forecasts_file else None
    info = ModelInfo(
        family=task.family, dataset=datamodule.name, run_id=run_id, git_commit=tracking.git_commit()
    )
    folder = save_classifier_folder(output_dir / "model", task, datamodule, info)
    example = example_table(datamodule)
    example_classes = Classifier.load(folder).predict(example, source="example from the data")
    return ClassificationOutputs(csv_path, frame, folder, example, example_classes)


def example_table(datamodule, n: int = 3) -> pd.DataFrame:
    """The first `n` test samples as a table in the layout of the training data."""
    windows = getattr(datamodule, "windows", None)
    if windows is not None:  # a stream: the rows of the first test window and a few after it
        start = int(windows.datasets["test"].starts[0])
        rows = windows.frame.iloc[start : start + datamodule.context_len + n - 1]
        labels = np.asarray(datamodule.label_names, dtype=object)[rows[LABEL_CODE].to_numpy().astype(int)]
        return rows.drop(columns=[LABEL_CODE]).assign(**{datamodule.label_col: labels}).reset_index(drop=True)
    x = datamodule.datasets["test"].samples[:n]
    labels = np.asarray(datamodule.classes, dtype=object)[datamodule.labels("test")[:n]]
    info = datamodule.sample_info("test").iloc[:n]
    parts = []
    for sid, values, label in zip(info.series_id, x, labels, strict=True):
        original = datamodule.channel_scaler.inverse(values.astype(np.float64))  # (T, D)
        part = pd.DataFrame(original, columns=datamodule.channel_names)
        part.insert(0, datamodule.step_col, np.arange(len(part)))
        part.insert(0, datamodule.series_col, sid)
        part[datamodule.label_col] = label
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def log_outputs(recorder, task, datamodule, outputs: ClassificationOutputs, best_ckpt: str) -> None:
    """Log the CSV, checkpoint, figures and pyfunc model; end the run FINISHED (no MLflow run: nothing)."""
    if not recorder.opened:
        return
    logger = recorder.logger
    files = [("forecasts", outputs.csv_path)] if outputs.csv_path is not None else []
    files += [("checkpoints", Path(best_ckpt))] if best_ckpt else []
    tracking.log_files(logger, files)
    logger.experiment.log_metric(logger.run_id, "test/n_samples", len(outputs.forecasts))
    tested, classes = task.test_outputs, datamodule.classes
    figure = confusion_figure(tested["true"], tested["proba"].argmax(axis=1), classes)
    beside_csv = Path(recorder.cfg.paths.output_dir)  # the figures in the run's output folder too
    tracking.log_figure(logger, figure, "plots/confusion_matrix.png", beside_csv)
    curves = {"model": tested["proba"], **{b.name: tested[b.name] for b in task.baselines}}
    tracking.log_figure(
        logger, reliability_figure(tested["true"], curves), "plots/reliability.png", beside_csv
    )
    registry_name = (recorder.cfg.get("model_registry") or {}).get("name")
    tracking.log_pyfunc_model(
        logger,
        outputs.model_folder,
        outputs.example,
        outputs.example_forecasts,
        registry_name,
        optional_inputs=(datamodule.label_col,),  # new sequences come without labels
    )
    tracking.end_run(logger, "FINISHED")


def confusion_figure(true: np.ndarray, pred: np.ndarray, classes: list[str]):
    """Counts of (true class, predicted class), rows normalised to shares in the colours."""
    C = len(classes)
    counts = np.zeros((C, C), dtype=int)
    np.add.at(counts, (true, pred), 1)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    size = 2.5 + 0.45 * C
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    for i in range(C):
        for j in range(C):
            colour = "white" if shares[i, j] > 0.6 else "black"
            ax.text(j, i, str(counts[i, j]), ha="center", va="center", color=colour, fontsize=8)
    ax.set_xticks(range(C), classes, rotation=45, ha="right")
    ax.set_yticks(range(C), classes)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    accuracy = np.trace(counts) / max(counts.sum(), 1)
    ax.set_title(f"test samples: {counts.sum()}, accuracy {accuracy:.3f}")
    fig.colorbar(image, ax=ax, label="share of the true class")
    fig.tight_layout()
    return fig


def reliability_figure(true: np.ndarray, curves: dict[str, np.ndarray]):
    """Accuracy against confidence (the top class's probability) in `ECE_BINS` bins, per model."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="calibrated")
    edges = np.linspace(0, 1, ECE_BINS + 1)
    for name, proba in curves.items():
        confidence, correct = proba.max(axis=1), proba.argmax(axis=1) == true
        which = np.clip(np.digitize(confidence, edges[1:-1]), 0, ECE_BINS - 1)
        used = np.unique(which)
        mean_conf = [confidence[which == b].mean() for b in used]
        accuracy = [correct[which == b].mean() for b in used]
        ax.plot(mean_conf, accuracy, marker="o", label=name)
    ax.set_xlabel("confidence (probability of the predicted class)")
    ax.set_ylabel("accuracy")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_title(f"reliability on the test samples ({ECE_BINS} bins)")
    ax.legend()
    fig.tight_layout()
    return fig


def print_summary(logger, metrics: dict[str, float], baselines: list, outputs: ClassificationOutputs) -> None:
    """The run id, each test metric of the model beside the baselines', the CSV, how to classify."""
    lines = ["", "=" * 72]
    if logger is not None:
        lines.append(f"MLflow run id: {logger.run_id}   (tracking URI: {logger.experiment.tracking_uri})")
    columns = ["model", *(b.name for b in baselines)]
    lines.append(f"{'test metric':<20}" + "".join(f"{c:>14}" for c in columns))
    for name in METRICS:
        keys = [f"test/{name}"] + [f"test/{b.name}_{name}" for b in baselines]
        lines.append(f"{name:<20}" + "".join(f"{metrics.get(k, float('nan')):>14.4f}" for k in keys))
    lines += [f"{b.name}: {b.description}" for b in baselines]
    lines.append(f"test samples: {len(outputs.forecasts)} (every one)")
    csv_path = outputs.csv_path
    lines.append(
        f"classes CSV: {csv_path.resolve()}" if csv_path else "classes CSV: none (forecasts_file=null)"
    )
    ref = logger.run_id if logger is not None else outputs.model_folder.resolve()
    lines.append(
        f"classify new data: {command_line('predict', str(ref), '<table.csv>', '--output classes.csv')}"
    )
    lines.append("=" * 72)
    print("\n".join(lines))
