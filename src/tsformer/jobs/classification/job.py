"""Sequence classification (model=enc_only_classifier on labelled sequences or streams): the classes
CSV, the model folder, the confusion matrix and reliability diagram in MLflow, the metric table, and
predict.py's classes of new sequences."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display (as plots.py)

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from omegaconf import DictConfig

from tsformer import tracking
from tsformer.data.sequences import LABEL_CODE, ClassificationData
from tsformer.jobs.base import (
    TIME_FORMAT,
    Fitted,
    Param,
    Prediction,
    RunOutputs,
    csv_file,
    job_of_module,
    made_by,
    metric_table,
    predict_usage,
)
from tsformer.jobs.classification import explain
from tsformer.jobs.classification.calibration import calibrate
from tsformer.jobs.classification.classifier import (
    FOLDER,
    Classifier,
    classes_frame,
    probabilities,
    save_classifier_folder,
)
from tsformer.jobs.classification.ensemble import FOLDER as ENSEMBLE
from tsformer.jobs.forecasting.forecaster import ModelInfo
from tsformer.serving.writers import write_csv
from tsformer.tasks.classification import ECE_BINS, METRICS, ClassificationTask, score

CLASSES_FILE = "classes.csv"  # the run's CSV of the test samples' classes (`forecasts_file`'s default)


def data_filter(datamodule) -> bool:
    return not datamodule.pretraining  # pre-training's data: its own job


def task_sizes(datamodule) -> dict:
    """What the classification task takes from its data."""
    counts = np.bincount(datamodule.labels("train"), minlength=datamodule.n_classes)
    return {"d_in": datamodule.d_in, "classes": datamodule.classes, "class_counts": counts.tolist()}


def finish_task(task, datamodule, fitted: Fitted) -> None:
    """The temperature of the probabilities, fitted without a test sample (`calibration.calibrate`)."""
    calibrate(task, datamodule, fitted)


def test_frame(task, datamodule) -> pd.DataFrame:
    """The test samples' classes and probabilities, in sample order (the CSV's rows)."""
    tested = task.test_outputs
    labels = np.asarray(datamodule.classes, dtype=object)[tested["true"]]
    return classes_frame(datamodule.sample_info("test"), tested["proba"], datamodule.classes, labels)


def write_outputs(cfg: DictConfig, task, datamodule, run_id: str | None) -> RunOutputs:
    """The classes CSV, the model folder and a few test samples for it."""
    output_dir = Path(cfg.paths.output_dir)
    frame = test_frame(task, datamodule)
    name = csv_file(cfg, CLASSES_FILE)
    csv_path = write_csv(frame, output_dir / name) if name else None
    info = ModelInfo(
        family=task.family, dataset=datamodule.name, run_id=run_id, git_commit=tracking.git_commit()
    )
    folder = save_classifier_folder(output_dir / "model", task, datamodule, info)
    return RunOutputs(folder, csv_path, frame, example=example_table(datamodule), logged_under="classes")


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


def log_outputs(logger, cfg: DictConfig, task, datamodule, outputs: RunOutputs) -> None:
    """The number of test samples."""
    logger.experiment.log_metric(logger.run_id, "test/n_samples", len(outputs.forecasts))


def figures(cfg: DictConfig, task, datamodule, outputs: RunOutputs) -> dict:
    """The confusion matrix, the reliability diagram and what the model looked at."""
    tested, classes = task.test_outputs, datamodule.classes
    curves = {"model": tested["proba"], **{b.name: tested[b.name] for b in task.baselines}}
    return {
        "plots/confusion_matrix.png": confusion_figure(
            tested["true"], tested["proba"].argmax(axis=1), classes
        ),
        "plots/reliability.png": reliability_figure(tested["true"], curves),
        "plots/explanation.png": looked_at(task, datamodule),
    }


def looked_at(task, datamodule):
    """The explanation figure (`explain.explanation_figure`) of the first `explain.PER_CLASS` test samples
    of each predicted class."""
    predicted = task.test_outputs["proba"].argmax(axis=1)  # (S,)
    chosen = np.concatenate(
        [np.flatnonzero(predicted == c)[: explain.PER_CLASS] for c in np.unique(predicted)]
    )
    samples = [np.asarray(datamodule.datasets["test"].samples[i]) for i in np.sort(chosen)]
    n_classes = len(datamodule.classes)
    found = explain.occlusion(
        lambda xs: probabilities(task, xs, n_classes), samples, predicted[np.sort(chosen)]
    )
    return explain.explanation_figure(samples, found, datamodule.classes)


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


def summary_lines(metrics: dict[str, float], baselines: list, outputs: RunOutputs) -> list[str]:
    """Each test metric of the model beside the baselines', the number of samples, the CSV."""
    lines = metric_table(metrics, list(METRICS), baselines)
    lines.append(f"test samples: {len(outputs.forecasts)} (every one)")
    csv_path = outputs.csv_path
    lines.append(
        f"classes CSV: {csv_path.resolve()}" if csv_path else "classes CSV: none (forecasts_file=null)"
    )
    return lines


EXPLAIN = Param(
    "explain",
    "also write each sample's 3 time ranges where other classes' values lower the predicted class's "
    "log-odds most (range_<i>_start, range_<i>_end, range_<i>_score; occlusion, docs/classification.md)",
    kind=bool,
)


def answer(model: Classifier, table: pd.DataFrame, params: dict, source: str) -> pd.DataFrame:
    """The class and probabilities of each sequence (or stream window) of `table`; with `explain`, each
    sample's top time ranges."""
    return model.predict(table, source=source, time_format=params["time_format"], explain=params["explain"])


def report(model: Classifier, classes: pd.DataFrame, written: list[Path]) -> str:
    """What was predicted, how well where the table has its labels, and the file."""
    lines = [f"{made_by(model)}: {len(classes)} samples, classes {model.classes}"]
    lines += labelled_scores(classes, model)
    lines.append(f"classes CSV: {written[0]} ({len(classes)} rows)")
    return "\n".join(lines)


def labelled_scores(frame: pd.DataFrame, model: Classifier) -> list[str]:
    """Accuracy and log loss on the table's own labels, beside the majority class's (the training
    samples' class shares as probabilities): what a user checks a model on a new labelled table by.
    Nothing without labels; samples of a label the model does not know are left out, and counted."""
    if frame.y_true.isna().all():
        return []
    known = frame.y_true.astype(str).isin(model.classes).to_numpy()
    if not known.any():
        return [f"no sample of the table has a label among the classes {model.classes}: nothing scored"]
    truth = np.array([model.classes.index(y) for y in frame.y_true.astype(str)[known]])
    proba = frame.loc[known, [f"p_{c}" for c in model.classes]].to_numpy(dtype=np.float64)  # (S, C)
    scores = score(proba, truth, len(model.classes))
    left_out = f", {int((~known).sum())} of unknown labels left out" if not known.all() else ""
    line = f"on the table's labels ({int(known.sum())} samples{left_out}): accuracy {scores['accuracy']:.4f}"
    shares = model.class_shares
    if shares is None:
        return [f"{line}, log loss {scores['log_loss']:.4f}"]
    majority = score(np.tile(shares, (len(truth), 1)), truth, len(model.classes))
    beside = f"(majority class {majority['log_loss']:.4f}: the training samples' class shares)"
    return [f"{line} (majority class {majority['accuracy']:.4f}), log loss {scores['log_loss']:.4f} {beside}"]


JOB = job_of_module(
    __name__,
    data_class=ClassificationData,
    folders=(FOLDER, ENSEMBLE),
    name="classification",
    tasks=(ClassificationTask,),
    data="labelled sequences or streams, for model=enc_only_classifier",
    prediction=Prediction(answer, report, params=(TIME_FORMAT, EXPLAIN)),
    usage=predict_usage("classify new data", "--output", CLASSES_FILE),
)
