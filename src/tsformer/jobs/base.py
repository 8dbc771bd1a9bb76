"""`Job`: what one of the application's jobs does after its task is built, and the summary envelope
every run prints (`print_summary`). See `tsformer.jobs` for the registry and how a job is added."""

from __future__ import annotations

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
from tsformer.model_folder import FolderKind


@dataclass
class RunOutputs:
    """The files a run writes after its test."""

    model_folder: Path  # what predict.py and the job's `load` read
    csv_path: Path | None = None  # the test outputs' CSV (None: none, or forecasts_file=null)
    forecasts: pd.DataFrame | None = None  # the CSV's rows
    paths_path: Path | None = None  # sampled paths (Parquet), with paths_file
    # a table from the data as predict.py takes it, and the saved folder's answer to it (`train.run`, through
    # the `Predictor` of the folder: a round trip that fails the run, not a user later): the pyfunc model's
    # signature (None: the job has no pyfunc model; its folder is logged as the artifacts `model`)
    example: pd.DataFrame | None = None
    example_forecasts: pd.DataFrame | None = None
    example_params: dict = field(default_factory=dict)  # the params `example_forecasts` answers with
    # the job's own test metrics from its outputs (`test/...`: anomaly detection's alarms against labels),
    # which `train.run` adds to the test's; the job's `log_outputs` logs them
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)  # what else the job hands on to log_outputs
    logged_under: str = "forecasts"  # the MLflow run's artifact folder of the CSV (and paths): the job's


# `forecasts_file`'s default (conf/train.yaml): the CSV takes its job's own name (`csv_file`)
JOB_FILE = "default"


def csv_file(cfg: DictConfig, job_file: str) -> str | None:
    """The name of a run's test-outputs CSV: the setting `forecasts_file`, where it is `default` the job's
    own (`job_file`: forecasts.csv, classes.csv); None: none (forecasts_file=null)."""
    name = cfg.get("forecasts_file")
    if not name:
        return None
    return job_file if name == JOB_FILE else str(name)


def _nothing(*args) -> None:
    return None


def _no_figures(*args) -> dict:
    return {}


@dataclass(frozen=True)
class Param:
    """An option of a use of a model: predict.py's `--<name>` (dashes for underscores), a key of the
    `params` of a tsformer-serve request and of the pyfunc model's `predict`."""

    name: str
    help: str
    kind: type = str  # str (None or "": not given) or bool (a switch; False: not given)
    required: bool = False  # a switch the job's model answers only with (a use that gives another table)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def unset(self):
        """The value of a param not given (the pyfunc signature's default)."""
        return False if self.kind is bool else ""


ORIGIN = Param(
    "origin",
    "forecast from this time for every series (default: each series' last row with all targets "
    "observed); later targets are ignored",
)
TIME_FORMAT = Param(
    "time_format",
    "strftime format of the table's text times, e.g. '%d/%m/%Y %H:%M' (default: the training "
    "data's data.time_format)",
)


@dataclass(frozen=True)
class Prediction:
    """How a job's model answers a table: the one function behind predict.py, tsformer-serve and the
    pyfunc model (`serving.predictor.Predictor`), the options it takes, and predict.py's report."""

    # (model, table as pd.read_csv gives it, params: every one of `params` with its value, source name for
    # messages) -> the answer table; tables to write beside it go in its attrs["beside"] ({name: frame})
    answer: Callable[[Any, pd.DataFrame, dict, str], pd.DataFrame]
    # (model, answer, the files predict.py wrote: the answer's CSV, then those beside it) -> what it prints
    report: Callable[[Any, pd.DataFrame, list[Path]], str]
    params: tuple[Param, ...] = (TIME_FORMAT,)
    # predict.py writes the answer as the training file was written (separator, decimal mark, encoding,
    # time format): the answer is the input table itself, completed
    written_as_read: bool = False
    # answer columns of ids that count across the table answered (an event's number): answering each
    # series alone (tsformer-fleet) counts them from 0 within each series
    per_series_ids: tuple[str, ...] = ()
    # a job whose model answers rows as they arrive (tsformer-serve's streams): (model, its state of the
    # stream or None for a new one, the new rows, params, source) -> (answer, next state); it bounds the state
    stream: Callable[[Any, Any, pd.DataFrame, dict, str], tuple[pd.DataFrame, Any]] | None = None
    # tsformer-serve's model threads a process when `--threads` is not given: 1 where a typical request is
    # short Python between small tensor operations (two threads take turns at the GIL and answer fewer
    # requests than one), more where it is long tensor work that releases the GIL
    # (benchmarks/RESULTS_serve.md, run 6)
    serve_threads: int = 1


@dataclass(frozen=True)
class Fitted:
    """A run's fit, as its job finishes the task after it (`Job.finish_task`), before the test."""

    best_checkpoint: str  # the weights the test takes ("": the task's own, the last)
    seed: int  # the run's
    # (data module, seed) -> a new task of the run's config trained on that data as the run's task was
    # (its init_from, its trainer settings; one process, no logger, no checkpoint): a classifier's
    # cross-fitted networks for its temperature
    fit_again: Callable[[Any, int], Any]


def refuses(why: Callable[[Any], str]) -> Prediction:
    """The `Prediction` of a job whose model answers nothing (`why(model)`: the one line saying so)."""

    def answer(model, table: pd.DataFrame, params: dict, source: str) -> pd.DataFrame:
        raise ValueError(why(model))

    return Prediction(answer=answer, report=lambda model, answer, written: "", params=())


@dataclass(frozen=True)
class Job:
    """One job of the application: everything about a run that is not the task itself.

    Training (`train.run`) calls, in this order: `takes_data`, `task_sizes` (what the task's constructor
    takes from the data), `prepare_task` (after it is built), `finish_task` (after the fit, before the
    test: a classifier fits its probabilities' temperature), `write_outputs` (after the test),
    `log_outputs` (its metrics and files, in the run's MLflow run), `figures` (drawn and logged by the
    run's MLflow callback only when the setting `figures` is true) and `summary_lines`. predict.py,
    tsformer-serve and the pyfunc model load its folder by its kind (`folders`), then call
    `prediction.answer` (through `serving.predictor.Predictor`). The fields are plain functions, so that a job is a module with a
    `JOB` (`job_of_module`: the module's functions of these names).
    """

    name: str  # the run name's first word and the MLflow tag `job`
    tasks: tuple[type, ...]  # the task classes it runs (their subclasses too): how a run finds its job
    data: str  # the data it takes, for the error naming a model and data that do not go together
    data_class: type  # the data module class it takes (`takes_data`)
    task_sizes: Callable[[Any], dict]  # datamodule -> the task's constructor arguments from the data
    write_outputs: Callable[[DictConfig, Any, Any, str | None], RunOutputs]  # cfg, task, datamodule, run id
    log_outputs: Callable[
        [Any, DictConfig, Any, Any, RunOutputs], None
    ]  # logger, cfg, task, datamodule, outputs
    summary_lines: Callable[[dict, list, RunOutputs], list[str]]  # metrics, baselines, outputs
    folders: tuple[FolderKind, ...]  # the kinds of model folder its runs write (`model_folder`)
    prediction: Prediction  # how the inference object answers a table (predict.py, tsformer-serve, pyfunc)
    usage: Callable[[str], str]  # the summary's line saying how to use the model folder (its path)
    prepare_task: Callable[[Any, Any], None] = _nothing  # task, datamodule
    finish_task: Callable[[Any, Any, Fitted], None] = _nothing  # task, datamodule, the fit
    data_filter: Callable[[Any], bool] = lambda datamodule: True  # what else its data module must be
    # cfg, task, datamodule, outputs -> {artifact file ("plots/x.png"): matplotlib figure}: the run's
    # figures, which `callbacks.MLflowRun` draws and logs only when `figures` is true (a job never logs one)
    figures: Callable[[DictConfig, Any, Any, RunOutputs], dict] = _no_figures

    def takes_data(self, datamodule) -> bool:
        """Whether a set-up data module feeds it: one of `data_class`, passing `data_filter`."""
        return isinstance(datamodule, self.data_class) and self.data_filter(datamodule)


# the fields of `Job` a job module defines as functions of these names (`job_of_module`)
FUNCTIONS = ("data_filter", "task_sizes", "prepare_task", "finish_task", "write_outputs", "log_outputs")
FUNCTIONS += ("summary_lines", "figures")


def job_of_module(module_name: str, **fields) -> Job:
    """The `Job` whose functions are the module's of the fields' names (`FUNCTIONS`; `data_filter`,
    `prepare_task`, `finish_task` and `figures` may be left out), with the other `fields` given."""
    module = sys.modules[module_name]
    return Job(**{name: getattr(module, name) for name in FUNCTIONS if hasattr(module, name)}, **fields)


def predict_usage(what: str, *options: str) -> Callable[[str], str]:
    """`usage` of a job that predict.py runs on a table: '<what>: <the predict.py command>'."""
    return lambda ref: f"{what}: {command_line('predict', shlex.quote(ref), '<table.csv>', *options)}"


def made_by(model) -> str:
    """Who answered, for predict.py's report: '<family> model (run <id>, data <data set>)'."""
    return f"{model.info.family} model (run {model.info.run_id}, data {model.info.dataset})"


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
