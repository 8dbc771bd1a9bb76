"""`Job`: what one of the application's jobs does after its task is built, and the summary envelope
every run prints (`print_summary`). See `tsformer.jobs` for the registry and how a job is added."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig

from tsformer.config import command_line


@dataclass
class RunOutputs:
    """The files a run writes after its test."""

    model_folder: Path  # what predict.py and the job's `load` read
    csv_path: Path | None = None  # the test outputs' CSV (None: none, or forecasts_file=null)
    forecasts: pd.DataFrame | None = None  # the CSV's rows
    paths_path: Path | None = None  # sampled paths (Parquet), with paths_file
    # a table from the data as predict.py takes it, and the saved folder's predictions of it: the pyfunc
    # model's signature (None: the job has no pyfunc model; its folder is logged as the artifacts `model`)
    example: pd.DataFrame | None = None
    example_forecasts: pd.DataFrame | None = None
    optional_inputs: tuple[str, ...] = ()  # columns of `example` new data may leave out
    # the job's own test metrics from its outputs (`test/...`: anomaly detection's alarms against labels),
    # which `train.run` adds to the test's; the job's `log_outputs` logs them
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)  # what else the job hands on to log_outputs


def _nothing(*args) -> None:
    return None


def _model_predict(model, table: pd.DataFrame, origin: str | None, source: str) -> pd.DataFrame:
    """The inference object's own predictions of `table` (forecasts, classes)."""
    return model.predict(table, origin=origin, source=source)


@dataclass(frozen=True)
class Job:
    """One job of the application: everything about a run that is not the task itself.

    Training (`train.run`) calls, in this order: `takes_data`, `task_sizes` (what the task's constructor
    takes from the data), `prepare_task` (after it is built), `before_test` (after the fit),
    `write_outputs` (after the test),
    `log_outputs` (its figures and metrics, in the run's MLflow run) and `summary_lines`. predict.py
    calls `load` and `predict`. The fields are plain functions, so that a job is a module with a `JOB`
    (`job_of_module`: the module's functions of these names).
    """

    name: str  # the run name's first word and the MLflow tag `job`
    tasks: tuple[type, ...]  # the task classes it runs (their subclasses too): how a run finds its job
    data: str  # the data it takes, for the error naming a model and data that do not go together
    takes_data: Callable[[Any], bool]  # whether a set-up data module feeds it
    task_sizes: Callable[[Any], dict]  # datamodule -> the task's constructor arguments from the data
    write_outputs: Callable[[DictConfig, Any, Any, str | None], RunOutputs]  # cfg, task, datamodule, run id
    log_outputs: Callable[
        [Any, DictConfig, Any, Any, RunOutputs], None
    ]  # logger, cfg, task, datamodule, outputs
    summary_lines: Callable[[dict, list, RunOutputs], list[str]]  # metrics, baselines, outputs
    load: Callable[[Path], Any]  # model folder -> the inference object (`Forecaster`, `Classifier`)
    predict: Callable[[Any, pd.DataFrame, argparse.Namespace], str]  # predict.py: writes args.output
    usage: Callable[[str], str]  # the summary's line saying how to use the model folder (its path)
    prepare_task: Callable[[Any, Any], None] = _nothing  # task, datamodule
    # after the fit, before the test (cfg, task, datamodule, best checkpoint path or ""): a classifier
    # fits the temperature of its probabilities here
    before_test: Callable[[DictConfig, Any, Any, str], None] = _nothing
    # a table in, the job's rows out (model, table, origin, source): what `tsformer-serve` answers with
    predict_table: Callable[[Any, pd.DataFrame, str | None, str], pd.DataFrame] = _model_predict
    # the predict.py option that asks for this job's use, and its help; predict.py refuses it for another
    # job's model, and refuses this job's model without it
    predict_flag: tuple[str, str] | None = None
    # predict.py options this job's models may take (flag, help), e.g. classification's --explain;
    # refused for another job's model
    predict_options: tuple[tuple[str, str], ...] = ()


# the fields of `Job` a job module defines as functions of these names (`job_of_module`)
FUNCTIONS = ("takes_data", "task_sizes", "prepare_task", "before_test", "write_outputs", "log_outputs")
FUNCTIONS += ("summary_lines",)
FUNCTIONS += ("load", "predict")


def job_of_module(module_name: str, **fields) -> Job:
    """The `Job` whose functions are the module's of the fields' names (`FUNCTIONS`; `prepare_task` and
    `before_test` may be left out), with the other `fields` given."""
    module = sys.modules[module_name]
    return Job(**{name: getattr(module, name) for name in FUNCTIONS if hasattr(module, name)}, **fields)


def predict_usage(what: str, *options: str) -> Callable[[str], str]:
    """`usage` of a job that predict.py runs on a table: '<what>: <the predict.py command>'."""
    return lambda ref: f"{what}: {command_line('predict', shlex.quote(ref), '<table.csv>', *options)}"


def predict_csv(
    model, table: pd.DataFrame, args: argparse.Namespace, **options
) -> tuple[pd.DataFrame, Path, str]:
    """`model.predict` of `table` (with the job's `options`) written to `args.output` (predict.py's
    options): the rows, the file, and who predicted them, '<family> model (run <id>, data <data set>)'."""
    from tsformer.serving.writers import write_csv

    frame = model.predict(
        table, origin=args.origin, source=str(args.data), time_format=args.time_format, **options
    )
    path = write_csv(frame, args.output).resolve()
    return frame, path, f"{model.info.family} model (run {model.info.run_id}, data {model.info.dataset})"


RULE = "=" * 72


def print_summary(job: Job, logger, metrics: dict[str, float], baselines: list, outputs: RunOutputs) -> None:
    """What every run prints at its end: where its MLflow run is and how to look at it, the job's lines
    (test metrics beside the baselines', files), and how to use the model folder, each command as it
    runs from any folder."""
    lines = ["", RULE]
    if logger is not None:
        uri = logger.experiment.tracking_uri
        # the query opens MLflow 3's UI on its model-training pages, not its GenAI ones
        page = f"#/experiments/{logger.experiment_id}/runs/{logger.run_id}?workflowType=machine_learning"
        served = uri.startswith(("http://", "https://"))  # a tracking server shows the run itself
        ui = f"{shlex.quote(os.path.abspath(sys.executable))} -m mlflow ui --backend-store-uri {shlex.quote(uri)}"
        look = f"{uri.rstrip('/')}/{page}" if served else f"{ui}   then open http://127.0.0.1:5000/{page}"
        lines += [f"MLflow run id: {logger.run_id}   (tracking URI: {uri})", f"look at the run: {look}"]
    lines += job.summary_lines(metrics, baselines, outputs)
    lines.append(f"model folder: {outputs.model_folder.resolve()}")
    lines.append(job.usage(str(outputs.model_folder.resolve())))
    lines.append(RULE)
    print("\n".join(lines))


def metric_table(
    metrics: dict[str, float], names: list[str], baselines: list, header="test metric"
) -> list[str]:
    """One line per test metric (the model's, then each baseline's), under a header line."""
    width = max(max(len(n) for n in names) + 2, len(header))
    columns = ["model", *(b.name for b in baselines)]
    col = max(14, *(len(c) for c in columns)) + 2
    lines = [f"{header:<{width}}" + "".join(f"{c:>{col}}" for c in columns)]
    for name in names:
        keys = [f"test/{name}"] + [f"test/{b.name}_{name}" for b in baselines]
        lines.append(f"{name:<{width}}" + "".join(f"{metrics.get(k, float('nan')):>{col}.4f}" for k in keys))
    return lines + [f"{b.name}: {b.description}" for b in baselines]
