"""The application's jobs: what a run does after its task is built, and what predict.py does with
the model folder it wrote. `JOBS` is the one place that maps a run or a model folder to its job.

A job (`base.Job`) is a module holding
- `data_class` (with `data_filter(datamodule)`: `takes_data`) and `task_sizes(datamodule)`: the data
  it runs on and what the task's constructor takes from it (`prepare_task(task, datamodule)` after the task is built,
  `finish_task(task, datamodule, fitted)` after its fit, before its test: `base.Fitted`);
- `write_outputs(cfg, task, datamodule, run_id) -> RunOutputs`: the files after the test (the model
  folder always; a CSV, an example table for the pyfunc model where it has them; test metrics of its
  own, from those outputs, which the run adds to the test's);
- `log_outputs(logger, cfg, task, datamodule, outputs)`: its own metrics and files in the MLflow run
  (the files, the checkpoint, the model and the run's end are logged by `callbacks.MLflowRun`);
- `figures(cfg, task, datamodule, outputs) -> {"plots/<name>.png": figure}` (optional): its figures,
  which `callbacks.MLflowRun` draws and logs (and writes beside the CSV) only when `figures` is true;
- `summary_lines(metrics, baselines, outputs)` and `usage(model folder)`: its part of the printed
  summary (`base.print_summary` writes the rest);
- `folders` (the kinds of model folder it writes, `model_folder.FolderKind`: `FOLDER_KINDS` below
  collects them) and `prediction` (`base.Prediction`): how its inference object answers a table,
  with the options (`Param`) it takes: the one function behind predict.py, tsformer-serve and the
  pyfunc model (`serving.predictor.Predictor`).
Its `tasks` say which task classes it runs; the MLflow run is named and tagged (`job`) after `name`.
`base.job_of_module(__name__, name=..., tasks=..., data=..., usage=...)` makes the `JOB` of a module
that defines those functions; `dataclasses.replace` one from another job's (reconstruction, imputation).

Adding a job: docs/architecture.md, "Adding a job" (its package here with a `JOB`, one line in
`REGISTERED` below, its task and configs, its task classes in tests/contract.py). train.py, predict.py
and tsformer-serve do not change.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from tsformer.jobs.base import Job, Param, RunOutputs, print_summary
from tsformer.model_folder import (
    RESTORE,
    FolderKind,
    ModelFolderError,
    kind_of,
    read_config,
    task_class_of,
    unknown_task,
)

# the registered jobs: tsformer/jobs/<name>/job.py, each with a `JOB`; one line a job
REGISTERED = (
    "forecasting",
    "reconstruction",
    "imputation",
    "classification",
    "pretraining",
    "anomaly",
)
JOBS: dict[str, Job] = {
    job.name: job for job in (import_module(f"tsformer.jobs.{m}.job").JOB for m in REGISTERED)
}


def _kinds() -> dict[str, FolderKind]:
    """Every job's kinds of model folder by name; one name, one kind."""
    kinds: dict[str, FolderKind] = {}
    for job in JOBS.values():
        for kind in job.folders:
            if kinds.setdefault(kind.name, kind) is not kind:
                raise RuntimeError(f"two kinds of model folder are named {kind.name!r}")
    return kinds


FOLDER_KINDS = _kinds()  # the one registry of model folder kinds (`model_folder.FolderKind`)

__all__ = ["FOLDER_KINDS", "JOBS", "Job", "RunOutputs", "job_of_folder", "job_of_task", "load_model"]
__all__ += ["prediction_params", "print_summary"]


def prediction_params() -> dict[str, Param]:
    """Every job's options of a use of its model by name (`Prediction.params`): the options predict.py
    and tsformer-fleet take."""
    return {param.name: param for job in JOBS.values() for param in job.prediction.params}


def job_of_task(task_class: type) -> Job | None:
    """The job that runs `task_class` (the nearest registered base class decides); None: no job's."""
    by_class = {cls: job for job in JOBS.values() for cls in job.tasks}
    return next((by_class[cls] for cls in task_class.__mro__ if cls in by_class), None)


def job_of_folder(folder: str | Path) -> Job:
    """The job of the model in `folder`, by the task class its `tsformer.json` names (imported only
    from the tsformer package: a model folder never runs code), once its format is one this tsformer
    reads."""
    config, path = read_config(folder)
    kind_of(config, path, FOLDER_KINDS)
    if "task_class" not in config:
        raise ModelFolderError(f"{path}: key(s) ['task_class'] missing: {RESTORE}")
    name = config["task_class"]
    task_class = task_class_of(name)
    job = job_of_task(task_class) if task_class is not None else None
    if job is None:
        raise unknown_task(name, path)
    return job


def load_model(folder: str | Path):
    """The inference object of the model folder (a `Forecaster`, a `Classifier`, ...), checked as its
    kind says (its format)."""
    config, path = read_config(folder)
    return kind_of(config, path, FOLDER_KINDS).load(Path(folder))
