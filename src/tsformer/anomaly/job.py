"""The anomaly-detection job: `python train.py experiment=plant_anomaly` (docs/anomaly.md).

A run reads the table of `data` (its `source`), trains a detector (`detector.py`, `anomaly.method`) on
the rows before `data.train_end` (assumed normal; a label column is never read for it), holds out the
last `anomaly.val_fraction` of them to measure each channel's usual error and to calibrate the
threshold at `anomaly.false_alarm_rate` (`alarms.py`), and judges the rows from `data.train_end` on:

- `anomalies.csv`: per row `series_id, time, score, threshold, alarm, event_id, top_channel_1..3`
  (and the label when the table has one);
- `events.csv`: per event `event_id, series_id, start, end, n_rows, peak_score, peak_time,
  top_channels` (the channels with the largest summed contributions over the event);
- `model/`: `anomaly.json` (settings, scalers, threshold) and `weights.pt` (a state dict): what
  `predict.py MODEL table.csv --output anomalies.csv` and the MLflow pyfunc model score a table with;
- in MLflow: the settings, the validation loss, with labels the evaluation figures (false alarms per
  1,000 normal rows, the normal rows' alarm rate, event recall, AUC-PR), the two figures (score over
  time with threshold, events and labels; channel-by-time heat map of contributions), the files and
  the pyfunc model.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from tsformer import tracking
from tsformer.anomaly.alarms import EventRule, calibrate_threshold, events_of
from tsformer.anomaly.detector import (
    DETECTORS,
    SERIES_COL,
    AnomalyDetector,
    DetectorSettings,
    Scores,
    fit_detector,
    series_rows,
    split_normal_rows,
)
from tsformer.data.schema import DataValidationError
from tsformer.data.sources import CSV_OPTIONS, load_table

log = logging.getLogger(__name__)

CONFIG_FILE = "anomaly.json"
WEIGHTS_FILE = "weights.pt"
N_TOP = 3  # top contributing channels per row and event


def check_labels(table: pd.DataFrame, label_col: str | None) -> None:
    """Labels, when the table has them, are 0 or 1: one line naming the column and row otherwise."""
    if label_col is None or label_col not in table.columns:
        return
    values = pd.to_numeric(table[label_col], errors="coerce")
    bad = ~values.isin([0, 1])
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataValidationError(
            f"column {label_col!r} (data.label_col), row {row} (counted from 0): {table[label_col].iloc[row]!s}; labels must "
            "be 0 (normal) or 1 (anomalous)"
        )


@dataclass
class AnomalyModel:
    """A trained detector with its calibrated threshold and event rule: what a model folder holds."""

    detector: AnomalyDetector
    threshold: float
    false_alarm_rate: float
    rule: EventRule
    time_col: str = "time"
    label_col: str | None = None

    # -- the model folder (json + a weights_only state dict: loading runs no code) ------------------

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        d = self.detector
        config = {
            "kind": "tsformer-anomaly",
            "method": d.method,
            "channels": d.channels,
            "settings": asdict(d.settings),
            "seed": d.seed,
            "loc": d.loc.tolist(),
            "scale": d.scale.tolist(),
            "error_scale": d.error_scale.tolist(),
            "val_loss": d.val_loss,
            "threshold": self.threshold,
            "false_alarm_rate": self.false_alarm_rate,
            "events": asdict(self.rule),
            "time_col": self.time_col,
            "label_col": self.label_col,
        }
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        torch.save(d.net.state_dict(), folder / WEIGHTS_FILE)
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> AnomalyModel:
        folder = Path(folder)
        config = json.loads((folder / CONFIG_FILE).read_text())
        detector = DETECTORS[config["method"]](
            config["channels"], DetectorSettings(**config["settings"]), config["seed"]
        )
        detector.loc, detector.scale = np.asarray(config["loc"]), np.asarray(config["scale"])
        detector.error_scale = np.asarray(config["error_scale"]).reshape(-1, len(detector.channels))
        detector.val_loss = config["val_loss"]
        detector.net.load_state_dict(torch.load(folder / WEIGHTS_FILE, weights_only=True))
        detector.net.eval()
        return cls(
            detector, config["threshold"], config["false_alarm_rate"], EventRule(**config["events"]),
            config["time_col"], config["label_col"],
        )  # fmt: skip

    # -- judging a table --------------------------------------------------------------------------

    def judge(self, table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, Scores]:
        """(per-row table, events table, scores) of `table` (the rows in its order)."""
        check_labels(table, self.label_col)
        scores = self.detector.score(table)
        alarm = scores.score > self.threshold
        event = np.full(len(table), -1)
        n_events = 0
        for rows in series_rows(table).values():  # events never cross series
            local = events_of(alarm[rows], self.rule)
            event[rows] = np.where(local >= 0, local + n_events, -1)
            n_events += int(local.max()) + 1 if (local >= 0).any() else 0
        series = table[SERIES_COL].to_numpy() if SERIES_COL in table.columns else np.zeros(len(table), int)
        times = table[self.time_col].to_numpy() if self.time_col in table.columns else np.arange(len(table))
        top = np.asarray(scores.top_channels(N_TOP))  # (T, N_TOP)
        rows = pd.DataFrame(
            {
                "series_id": series,
                "time": times,
                "score": scores.score,
                "threshold": self.threshold,
                "alarm": alarm.astype(int),
                "event_id": pd.array(np.where(event >= 0, event, None), dtype="Int64"),
            }
            | {f"top_channel_{i + 1}": top[:, i] for i in range(top.shape[1])}
        )
        if self.label_col is not None and self.label_col in table.columns:
            rows["label"] = pd.to_numeric(table[self.label_col]).astype(int).to_numpy()
        return rows, self.events_table(rows, event, scores), scores

    def events_table(self, rows: pd.DataFrame, event: np.ndarray, scores: Scores) -> pd.DataFrame:
        records = []
        names = np.asarray(scores.channels)
        for e in range(int(event.max()) + 1 if len(event) else 0):
            at = np.flatnonzero(event == e)
            peak = at[np.argmax(scores.score[at])]
            summed = scores.contributions[at].sum(axis=0)
            records.append(
                {
                    "event_id": e,
                    "series_id": rows["series_id"].iloc[at[0]],
                    "start": rows["time"].iloc[at[0]],
                    "end": rows["time"].iloc[at[-1]],
                    "n_rows": len(at),
                    "peak_score": float(scores.score[peak]),
                    "peak_time": rows["time"].iloc[peak],
                    "top_channels": ";".join(names[np.argsort(-summed)[:N_TOP]]),
                }
            )
        columns = [
            "event_id",
            "series_id",
            "start",
            "end",
            "n_rows",
            "peak_score",
            "peak_time",
            "top_channels",
        ]
        return pd.DataFrame(records, columns=columns)


# -- evaluation when labels exist ---------------------------------------------------------------------


def labelled_incidents(rows: pd.DataFrame) -> list[np.ndarray]:
    """Row positions of each labelled incident (a run of label 1 within a series)."""
    incidents = []
    for at in series_rows(rows).values():
        label = rows["label"].to_numpy()[at].astype(bool)
        padded = np.concatenate([[False], label, [False]])
        edges = np.flatnonzero(np.diff(padded.astype(int)))
        incidents += [at[a:b] for a, b in zip(edges[::2], edges[1::2], strict=True)]
    return incidents


def evaluate(rows: pd.DataFrame, events: pd.DataFrame) -> dict[str, float]:
    """Alarm figures against the labels: false alarms per 1,000 normal rows, event recall, AUC-PR."""
    from sklearn.metrics import average_precision_score

    label = rows["label"].to_numpy().astype(bool)
    alarm = rows["alarm"].to_numpy().astype(bool)
    event = rows["event_id"].to_numpy(dtype=float, na_value=-1)
    incidents = labelled_incidents(rows)
    found = [bool((event[at] >= 0).any()) for at in incidents]
    false_events = [e for e in range(len(events)) if not label[event == e].any()]
    metrics = {
        "normal_alarm_rate": float(alarm[~label].mean()) if (~label).any() else float("nan"),
        "false_alarms_per_1000": 1000.0 * float(alarm[~label].mean()) if (~label).any() else float("nan"),
        "event_recall": float(np.mean(found)) if found else float("nan"),
        "n_incidents": float(len(incidents)),
        "n_events": float(len(events)),
        "false_events": float(len(false_events)),
    }
    if label.any() and (~label).any():
        metrics["auc_pr"] = float(average_precision_score(label, rows["score"].to_numpy()))
    return metrics


# -- figures ----------------------------------------------------------------------------------------


def figures(rows: pd.DataFrame, scores: Scores, max_series: int = 4) -> dict[str, object]:
    """`plots/anomaly_scores.png` (score over time, threshold, event bands, labels) and
    `plots/anomaly_contributions.png` (channel-by-time heat map of contributions), per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(series_rows(rows).items())[:max_series]
    fig_s, axes_s = plt.subplots(len(groups), 1, figsize=(11, 2.4 * len(groups)), squeeze=False)
    fig_c, axes_c = plt.subplots(len(groups), 1, figsize=(11, 0.5 + 0.35 * len(scores.channels) * len(groups)),
                                 squeeze=False)  # fmt: skip
    for (sid, at), ax, axc in zip(groups, axes_s[:, 0], axes_c[:, 0], strict=True):
        x = np.arange(len(at))
        ax.plot(x, rows["score"].to_numpy()[at], lw=0.8, label="score")
        ax.axhline(rows["threshold"].iloc[0], color="k", ls="--", lw=0.8, label="threshold")
        event = rows["event_id"].to_numpy(dtype=float, na_value=-1)[at]
        for e in np.unique(event[event >= 0]):
            inside = np.flatnonzero(event == e)
            ax.axvspan(inside[0], inside[-1] + 1, color="orange", alpha=0.3, lw=0)
        if "label" in rows.columns:
            label = rows["label"].to_numpy()[at]
            ax.fill_between(x, 0, 1, where=label == 1, transform=ax.get_xaxis_transform(), color="red",
                            alpha=0.15, lw=0, label="labelled anomaly")  # fmt: skip
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_title(f"series {sid}: score (events orange)", fontsize=9)
        ax.legend(loc="upper left", fontsize=7)
        image = axc.imshow(np.log1p(scores.contributions[at].T), aspect="auto", interpolation="nearest",
                           cmap="magma")  # fmt: skip
        axc.set_yticks(range(len(scores.channels)), scores.channels, fontsize=7)
        axc.set_title(f"series {sid}: log(1 + contribution) per channel", fontsize=9)
        fig_c.colorbar(image, ax=axc)
    for fig in (fig_s, fig_c):
        fig.supxlabel("row of the judged table")
        fig.tight_layout()
    return {"plots/anomaly_scores.png": fig_s, "plots/anomaly_contributions.png": fig_c}


# -- the run ----------------------------------------------------------------------------------------


def load_source(data: DictConfig) -> pd.DataFrame:
    source = data.source
    if isinstance(source, DictConfig) and "_target_" in source:
        return instantiate(source)
    return load_table(str(source))


def split_at(table: pd.DataFrame, train_end, time_col: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(normal rows, judged rows): before `train_end` (a time, or a fraction of each series' rows)."""
    if isinstance(train_end, float) and 0.0 < train_end < 1.0:
        cut = {sid: rows[: round(train_end * len(rows))] for sid, rows in series_rows(table).items()}
        before = np.zeros(len(table), dtype=bool)
        for rows in cut.values():
            before[rows] = True
    else:
        if time_col not in table.columns:
            raise DataValidationError(
                f"data.train_end={train_end!r} is a time, but there is no column {time_col!r}"
            )
        before = (pd.to_datetime(table[time_col]) < pd.Timestamp(train_end)).to_numpy()
    if not before.any() or before.all():
        raise DataValidationError(f"data.train_end={train_end!r} leaves no rows to train on or none to judge")
    return table[before], table[~before]


def run(cfg: DictConfig):
    """Train, calibrate, judge and record one anomaly-detection run; returns train.RunResult."""
    from tsformer.train import RunResult  # the run's result type is the application's

    a, data = cfg.anomaly, cfg.data
    table = load_source(data)
    channels = list(data.target_cols)
    label_col = data.get("label_col")
    check_labels(table, label_col)
    normal, judged = split_at(table, data.train_end, data.get("time_col", "time"))
    train, val = split_normal_rows(normal, float(a.val_fraction))
    settings = OmegaConf.to_container(a.settings, resolve=True)
    detector = fit_detector(train, val, channels, method=a.method, seed=int(cfg.seed), **settings)
    threshold = calibrate_threshold(detector.val_scores, float(a.false_alarm_rate))
    rule = EventRule(**OmegaConf.to_container(a.events, resolve=True))
    model = AnomalyModel(detector, threshold, float(a.false_alarm_rate), rule, data.get("time_col", "time"),
                         label_col)  # fmt: skip
    out = Path(cfg.paths.output_dir)
    folder = model.save(out / "model")
    rows, events, scores = model.judge(judged)
    rows_path, events_path = write_csv(rows, out / a.output_file), write_csv(events, out / "events.csv")
    metrics = {"val_loss": detector.val_loss, "threshold": threshold}
    if "label" in rows.columns:
        metrics |= evaluate(rows, events)
    run_id = record(cfg, model, metrics, rows, scores, folder, [rows_path, events_path], judged)
    print_summary(metrics, rows, events, rows_path, folder)
    return RunResult(metrics, run_id, detector.val_loss, folder, rows_path, rows)


def predict_folder(folder: Path, args) -> str:
    """predict.py on an anomaly model folder: `args.data` scored, its rows written to `args.output`
    and its events beside them (`<output>_events.csv`); returns the line to print."""
    model = AnomalyModel.load(folder)
    flags = {option: getattr(args, option) for option in CSV_OPTIONS if getattr(args, option) is not None}
    table = load_table(args.data, **flags)
    rows, events, _ = model.judge(table)
    path = write_csv(rows, Path(args.output))
    events_path = write_csv(events, path.with_name(path.stem + "_events.csv"))
    alarms = int(rows["alarm"].sum())
    return f"{len(rows)} rows scored, {alarms} alarms, {len(events)} events: {path}, {events_path}"


def write_csv(frame: pd.DataFrame, path: Path) -> Path:
    """Written whole or not at all (a temporary file renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
        frame.to_csv(tmp.name, index=False)
    os.replace(tmp.name, path)
    return path


def record(
    cfg, model: AnomalyModel, metrics, rows, scores, folder: Path, files: list[Path], judged
) -> str | None:
    """The MLflow run (with `logger=mlflow`): params, metrics, figures, files and the pyfunc model."""
    logger = cfg.get("logger") or {}
    mlflow_cfg = logger.get("mlflow") if hasattr(logger, "get") else None
    if mlflow_cfg is None:
        return None
    import mlflow

    # absolute (MLflow caches a database per URI string), its experiment's files beside it, and the
    # process's tracking URI put back after the run
    uri = tracking.absolute_sqlite_uri(mlflow_cfg.tracking_uri)
    tracking.prepare_sqlite_store(uri, mlflow_cfg.experiment_name)
    name = mlflow_cfg.get("run_name") or f"anomaly-{model.detector.method}-{cfg.data.name}"
    with tracking.tracking_uri_for(uri):
        mlflow.set_experiment(mlflow_cfg.experiment_name)
        return _record_run(name, cfg, model, metrics, rows, scores, folder, files, judged)


def _record_run(
    name: str, cfg, model: AnomalyModel, metrics, rows, scores, folder: Path, files: list[Path], judged
) -> str:
    """The run's params, metrics, figures, files and pyfunc model, in the active tracking URI."""
    import matplotlib.pyplot as plt
    import mlflow

    with mlflow.start_run(run_name=name, tags={"job": "anomaly"}) as active:
        mlflow.log_params({"method": model.detector.method, "false_alarm_rate": model.false_alarm_rate,
                           **{f"settings.{k}": v for k, v in asdict(model.detector.settings).items()},
                           **{f"events.{k}": v for k, v in asdict(model.rule).items()}})  # fmt: skip
        mlflow.log_metrics({k: v for k, v in metrics.items() if np.isfinite(v)})
        mlflow.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
        for path, fig in figures(rows, scores).items():
            mlflow.log_figure(fig, path)
            plt.close(fig)
        for path in files:
            mlflow.log_artifact(str(path))
        log_pyfunc_model(folder, judged.head(min(len(judged), 4 * model.detector.settings.context_len)))
        return active.info.run_id


def log_pyfunc_model(folder: Path, example: pd.DataFrame) -> None:
    """The pyfunc model `model` of the run: `mlflow.pyfunc.load_model(...).predict(table)` scores a table."""
    import warnings

    import mlflow

    import tsformer
    from tsformer.anomaly import mlflow_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlflow.pyfunc.log_model(
            name="model",
            python_model=mlflow_model.__file__,
            artifacts={"model_folder": str(folder)},
            code_paths=[str(Path(tsformer.__file__).parent)],
            input_example=example,
        )


def print_summary(
    metrics: dict, rows: pd.DataFrame, events: pd.DataFrame, rows_path: Path, folder: Path
) -> None:
    lines = [
        (
            f"anomaly: {len(rows)} rows judged, {int(rows['alarm'].sum())} alarms, {len(events)} events "
            f"(threshold {metrics['threshold']:.4g})"
        ),
        *(f"  {k}: {v:.4g}" for k, v in metrics.items() if k not in ("threshold",)),
        f"rows: {rows_path}",
        f"events: {rows_path.parent / 'events.csv'}",
        f"model: {folder}  (predict.py {folder} table.csv --output anomalies.csv)",
    ]
    print("\n".join(lines))
