"""Anomaly detection (`experiment=plant_anomaly`; model=enc_only_anomaly or dec_only_anomaly): a detector
(`tasks/anomaly.py`) trained on the normal rows of `data.AnomalyData`, calibrated on its held-out normal
rows (each channel's usual error, and the threshold at `model.false_alarm_rate`), judges the rows from
`data.train_end` on (docs/anomaly.md).

Outputs: `anomalies.csv` (per judged row `series_id, time, score, threshold, alarm, event_id,
top_channel_1..3`, and the label when the table has one), `events.csv` (per event `event_id, series_id,
start, end, n_rows, peak_score, peak_time, top_channels`), the model folder (`anomaly.judging`); in
MLflow, with labels, the alarms' figures against them (`test/event_recall`, `test/false_alarms_per_1000`,
`test/auc_pr`, ...: labels are read for this only), the score over time with the threshold, events and
labels and the channel-by-time heat map of contributions. `predict.py MODEL table.csv --output
anomalies.csv` judges a new table (its events beside it, `anomalies_events.csv`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from tsformer import tracking
from tsformer.data.anomaly import AnomalyData, series_rows
from tsformer.data.schema import read_times
from tsformer.jobs.anomaly.baselines import baselines
from tsformer.jobs.anomaly.evaluation import per_series
from tsformer.jobs.anomaly.judging import FOLDER, AnomalyContract, AnomalyModel
from tsformer.jobs.anomaly.report import evaluate, report_lines, score_figures
from tsformer.jobs.anomaly.streaming import answer_stream
from tsformer.jobs.base import (
    TIME_FORMAT,
    Param,
    Prediction,
    RunOutputs,
    job_of_module,
    metric_table,
    predict_usage,
)
from tsformer.model_folder import ModelInfo
from tsformer.serving.writers import write_csv
from tsformer.tasks.anomaly import ForecastAnomalyDetector, MaskedAnomalyDetector

ROWS_FILE, EVENTS_FILE = "anomalies.csv", "events.csv"


def task_sizes(datamodule) -> dict:
    """The channels are the detector's targets and its known inputs (last), the states and constants
    among the targets read from the train rows; the known inputs enter as channels never hidden nor
    scored (the network's covariate input stays empty)."""
    return {
        "d_target": len(datamodule.channels),
        "d_known": 0,
        "d_observed": 0,
        "target_names": datamodule.channels,
        "state_channels": datamodule.state_names,
        "constant_channels": datamodule.constant_names,
        "known_channels": datamodule.known_names,
    }


def prepare_task(task, datamodule) -> None:
    task.set_standardisation(datamodule.loc, datamodule.scale)  # the train rows', never per window


def write_outputs(cfg: DictConfig, task, datamodule, run_id: str | None) -> RunOutputs:
    """The model folder, then the judged rows and events as the folder's model judges them; with labels,
    the alarms' figures against them."""
    output_dir = Path(cfg.paths.output_dir)
    contract = AnomalyContract(datamodule.time_col, datamodule.label_col, dict(datamodule.csv))
    info = ModelInfo(
        family=task.family, dataset=datamodule.name, run_id=run_id, git_commit=tracking.git_commit()
    )
    folder = AnomalyModel.of_task(task, contract, info).save(output_dir / "model")
    model = AnomalyModel.load(folder)  # what predict.py and the pyfunc model judge with
    rows, events, scores = model.judge(
        datamodule.tables["test"], "judged rows", context=judge_context(datamodule)
    )
    rows_path = write_csv(rows, output_dir / ROWS_FILE)
    events_path = write_csv(events, output_dir / EVENTS_FILE)
    metrics = {"test/n_alarms": float(rows["alarm"].sum()), "test/n_events": float(len(events))}
    compared = []
    if "label" in rows.columns:
        metrics |= {f"test/{k}": v for k, v in evaluate(rows, events).items()}
        compared = baselines(int(cfg.seed))
        metrics |= beside_baselines(datamodule, rows, scores, compared)
    return RunOutputs(
        folder, rows_path, rows, example=example_table(datamodule), metrics=metrics, logged_under="anomalies",
        details={"events": events, "events_path": events_path, "scores": scores, "baselines": compared,
                 "report": report_lines(rows, events, model.false_alarm_rate, task.state_names,
                                           task.constant_names, known=task.known_names,
                                           threshold_rows=task.threshold_rows)},
    )  # fmt: skip


def judge_context(datamodule) -> pd.DataFrame | None:
    """With `data.judge_context`, the normal rows (each series' rows before its judged ones, in order):
    the judged rows' first windows read them (`judging.scored_in_context`); else None (each series'
    judged rows scored alone)."""
    return datamodule.normal_rows if getattr(datamodule, "judge_context", False) else None


RANKING = ("vus_pr", "vus_roc", "auc_pr", "auc_roc")  # threshold-free: how well the score ranks the rows


@dataclass(frozen=True)
class Part:
    """A part of the hybrid score, shown beside it as the baselines are."""

    name: str
    description: str


def parts_of(scores) -> list[Part]:
    return [Part(name, f"the hybrid's {name} part alone") for name in scores.parts]


def beside_baselines(datamodule, rows: pd.DataFrame, scores, compared: list) -> dict[str, float]:
    """`test/<metric>` of the detector's score, `test/<part>_<metric>` of each part of a hybrid and
    `test/<baseline>_<metric>` of each baseline fitted on the same train rows (`anomaly.baselines`:
    series by series), TSB-AD's metrics per series averaged over the series with both kinds of rows
    (`test/n_series_evaluated`); it replaces `evaluate`'s pooled AUC-PR."""
    judged, train, channels = datamodule.tables["test"], datamodule.tables["train"], datamodule.channels
    ranked = {"model": rows["score"].to_numpy()} | dict(scores.parts)
    train_series = [train[channels].to_numpy(dtype=float)[at] for at in series_rows(train).values()]
    for baseline in compared:
        fitted = baseline.fit(train_series)
        ranked[baseline.name] = np.zeros(len(judged))
        for at in series_rows(judged).values():
            ranked[baseline.name][at] = fitted.score(judged[channels].to_numpy(dtype=float)[at]).score
    figures, evaluated = per_series(ranked, rows["label"], judged[channels[0]], rows["series_id"])
    out = {"test/n_series_evaluated": float(evaluated)}
    for name, by_metric in figures.items():
        prefix = "test/" if name == "model" else f"test/{name}_"
        out |= {prefix + metric: value for metric, value in by_metric.items()}
    return out


def example_table(datamodule, windows: int = 2) -> pd.DataFrame:
    """The first rows of the first judged series (`windows` windows' worth), as a table predict.py takes."""
    judged = datamodule.tables["test"]
    first = next(iter(series_rows(judged).values()))
    return judged.iloc[first[: windows * datamodule.window]].reset_index(drop=True)


def log_outputs(logger, cfg: DictConfig, task, datamodule, outputs: RunOutputs) -> None:
    """The alarms' metrics and the events table."""
    for name, value in outputs.metrics.items():
        logger.experiment.log_metric(logger.run_id, name, value)
    tracking.log_files(logger, [(outputs.logged_under, outputs.details["events_path"])])


def figures(cfg: DictConfig, task, datamodule, outputs: RunOutputs) -> dict:
    """Per series, the score over time with the threshold and the events (`report.score_figures`)."""
    return score_figures(outputs.forecasts, outputs.details["scores"])


def summary_lines(metrics: dict[str, float], baselines: list, outputs: RunOutputs) -> list[str]:
    """What the judged rows hold (`report.report_lines`); with labels, how the score ranks them beside
    its parts and the baselines; the files."""
    lines = list(outputs.details["report"])
    compared = outputs.details["baselines"]
    if compared and outputs.metrics.get("test/n_series_evaluated", 0) > 0:
        # the score's ranking of the judged rows beside its parts' and the baselines' (labels only evaluate)
        beside = parts_of(outputs.details["scores"]) + list(compared)
        lines += metric_table(outputs.metrics, list(RANKING), beside, header="per series, mean")
    lines += [
        f"rows CSV: {outputs.csv_path.resolve()}",
        f"events CSV: {outputs.details['events_path'].resolve()}",
    ]
    return lines


NORMAL_ROWS = Param(
    "normal_rows",
    "recalibrate on a stretch of the table declared normal (a new asset, a changed sensor): 'A:B', rows A "
    "to B (B excluded) of each series counted from 0, or 'T1/T2', the rows from time T1 to before T2; the "
    "channels' usual errors and the threshold are measured on it instead of the training's held-out rows",
)


CONTEXT_ROWS = Param(
    "context_rows",
    "the first N rows of each series are context only: they precede the rows to judge and are read by "
    "the first windows, not judged nor written (without it, each series' first rows are scored from "
    "fewer windows than the rest)",
)


def answer(model: AnomalyModel, table: pd.DataFrame, params: dict, source: str) -> pd.DataFrame:
    """The judged rows of `table`, its times read; its events beside them (`attrs["beside"]`, which
    predict.py writes to `<output stem>_events.csv`). With `normal_rows`, judged by the model
    recalibrated on that stretch (`recalibrated`; the model given is left as it is); with
    `context_rows`, each series' first rows read as context (`context_split`), not judged."""
    time_col = model.time_col
    if time_col in table.columns and not pd.api.types.is_numeric_dtype(table[time_col]):
        table = table.assign(**{time_col: read_times(table[time_col], params["time_format"], source)})
    stretch = params.get("normal_rows") or ""
    if stretch:
        model = recalibrated(model, table.iloc[normal_stretch(table, stretch, time_col, source)])
    context = None
    if params.get("context_rows"):
        context, table = context_split(table, params["context_rows"], source)
    rows, events, _ = model.judge(table, source, context=context)
    rows.attrs["beside"] = {"events": events}
    if stretch:
        rows.attrs["recalibrated"] = stretch
    return rows


def context_split(table: pd.DataFrame, spec, source: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(context, rows to judge) of `table`: the first `spec` rows of each series and the rest
    (`CONTEXT_ROWS`), or one line saying what is wrong."""
    try:
        n = int(str(spec).strip())
    except ValueError:
        raise ValueError(
            f"{source}: context_rows={spec!r}: give a number of rows (each series' first N)"
        ) from None
    if n < 1:
        raise ValueError(f"{source}: context_rows={spec!r}: at least 1")
    first = np.zeros(len(table), dtype=bool)
    for rows in series_rows(table).values():
        first[rows[:n]] = True
    return table[first].reset_index(drop=True), table[~first].reset_index(drop=True)


def normal_stretch(table: pd.DataFrame, spec: str, time_col: str, source: str) -> np.ndarray:
    """Positions of the rows `spec` declares normal (`NORMAL_ROWS`), or one line saying what is wrong."""
    where = f"{source}: normal_rows={spec!r}"
    if "/" in spec:
        if time_col not in table.columns:
            raise ValueError(f"{where}: times need the table's time column {time_col!r}")
        try:
            first, last = (pd.Timestamp(t.strip()) for t in spec.split("/", 1))
        except ValueError:
            raise ValueError(f"{where}: 'T1/T2' must be two times") from None
        times = pd.to_datetime(table[time_col])
        at = np.flatnonzero(((times >= first) & (times < last)).to_numpy())
    else:
        try:
            first, last = (int(v) for v in spec.split(":"))
        except ValueError:
            raise ValueError(f"{where}: give 'A:B' (rows A to B of each series) or 'T1/T2' (times)") from None
        if not 0 <= first < last:
            raise ValueError(f"{where}: rows A:B need 0 <= A < B")
        at = np.concatenate([rows[first:last] for rows in series_rows(table).values()])
    if len(at) == 0:
        raise ValueError(f"{where}: no row of the table lies in it")
    return np.sort(at)


def recalibrated(model: AnomalyModel, normal: pd.DataFrame) -> AnomalyModel:
    """A copy of `model` calibrated on `normal` (declared normal by the user) as the training calibrated
    on its held-out rows: the channels' usual errors, a hybrid's medians and the threshold at the same
    false-alarm rate. The network and the memory stay as trained."""
    detector = copy.deepcopy(model.detector)
    detector.calibrate(normal.reset_index(drop=True))
    return AnomalyModel.of_task(detector, model.contract, model.info)


def report(model: AnomalyModel, rows: pd.DataFrame, written: list[Path]) -> str:
    """What predict.py prints: the judged table's events, labelled incidents and alarm rate as the run's
    summary gives them (`report.report_lines`), and the files written."""
    events = rows.attrs["beside"]["events"]
    lines = report_lines(
        rows, events, model.false_alarm_rate, model.detector.state_names, model.detector.constant_names,
        recalibrated_on=rows.attrs.get("recalibrated"), known=model.detector.known_names,
        threshold_rows=model.detector.threshold_rows,
    )  # fmt: skip
    return "\n".join([*lines, *(f"written: {path}" for path in written)])


JOB = job_of_module(
    __name__,
    data_class=AnomalyData,
    folders=(FOLDER,),
    name="anomaly",
    tasks=(MaskedAnomalyDetector, ForecastAnomalyDetector),
    data="a table of channels whose rows before data.train_end are normal (data=plant_anomaly)",
    prediction=Prediction(  # tsformer-serve's streams too
        answer,
        report,
        params=(TIME_FORMAT, NORMAL_ROWS, CONTEXT_ROWS),
        per_series_ids=("event_id",),
        stream=answer_stream,
        serve_threads=2,  # a table's windows under every mask: tensor work, 1.8x at 16 clients with 2
    ),
    usage=predict_usage("judge new data", "--output", ROWS_FILE),
)
