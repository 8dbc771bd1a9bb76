"""`python train.py [overrides]`: data -> model -> fit -> test -> forecasts CSV, tracked in MLflow.

Every object is built from the config (`conf/`) with `hydra.utils.instantiate`; this file only puts
them together in order:
1. the settings are checked (`settings.py`), the data module validates and windows the data: bad
   input or settings fail here, before any MLflow run exists (`main` prints one line, exit status 2);
2. the run's job (`tsformer.jobs`: the one that runs the model's task class) sizes the task from the data;
3. Lightning fits it (checkpoints, early stopping), the job finishes it (`Job.finish_task`: a classifier
   fits its probabilities' temperature) and the best checkpoint is tested;
4. the job writes its outputs (a CSV in original units, the model folder `predict.py` reads) and its
   figures; the callback `callbacks.MLflowRun` owns the loggers and the MLflow run: it logs the files,
   the checkpoint and a pyfunc model, and ends the run FINISHED, KILLED on SIGTERM or Ctrl+C, or
   FAILED on any error; `jobs.print_summary` prints the summary.
`resume=<run id | output folder | checkpoint>` continues an interrupted run instead (`resume.py`);
`init_from=<run id | output folder | model folder>` starts from a saved model's weights (`init_from.py`).
With several processes (`trainer=ddp`) only the fit is shared; the rest is done by the global-zero
process alone (`_one_process_for_test`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import lightning as L
import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict

from tsformer import init_from, resume, settings, tracking
from tsformer.callbacks import MLflowRun, ModelTable, ValidationAtStepBudget
from tsformer.config import config_dir
from tsformer.data.schema import DataValidationError
from tsformer.jobs import JOBS, Job, RunOutputs, job_of_task, print_summary
from tsformer.jobs.base import Fitted
from tsformer.quiet import quiet_library_chatter
from tsformer.serving.predictor import Predictor
from tsformer.settings import SettingError
from tsformer.tasks.setting_groups import task_settings

log = logging.getLogger(__name__)

# absolute (as Hydra needs), so any working directory works: the checkout's conf/, else the wheel's
CONFIG_DIR = str(config_dir())
# What the user's data or settings got wrong: `main` prints the message alone (it names the file,
# column and row, or the setting) and exits 2, as predict.py does; any other error keeps its traceback.
USER_ERRORS = (DataValidationError, SettingError, FileNotFoundError, tracking.TrackingServerUnreachable)


def compose_config(overrides: list[str], output_dir: str | Path) -> DictConfig:
    """The config `python train.py <overrides>` would run, for scripts and tests calling `run`.

    Hydra's runtime is set so that `${hydra:runtime.output_dir}` resolves to `output_dir`.
    """
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]  # as in hydra.main: the job's config without Hydra's own section
    return cfg


def instantiate_group(group: DictConfig | None) -> list:
    """Instantiate every entry with a `_target_` of a callbacks/logger group (none: empty list)."""
    if not group:
        return []
    return [
        instantiate(entry)
        for entry in group.values()
        if isinstance(entry, DictConfig) and "_target_" in entry
    ]


@dataclass
class RunResult:
    """What one run produced, for scripts and sweeps (the CLI prints a summary of it). Figures such as
    the fit's duration or each test window's error are in the MLflow run (`callbacks.MLflowRun`)."""

    metrics: dict[str, float]  # test/* metrics of the model and the baselines
    run_id: str | None  # the MLflow run; None without an MLflow logger
    best_val: float | None  # best monitored validation metric (val/mse by default): what sweeps optimise
    model_folder: Path  # what predict.py and Forecaster.load read
    csv_path: Path | None  # the forecasts CSV; None: forecasts_file=null
    forecasts: pd.DataFrame | None  # the CSV's rows (original units)
    paths_path: Path | None = None  # sampled paths (Parquet), with paths_file
    outputs: RunOutputs | None = None  # all the job wrote (the example table its model folder predicted)


def _instantiate_settings(node: DictConfig, **kwargs):
    """`instantiate(node)`, where a ValueError of a constructor is a setting of `node` it refuses:
    a `SettingError` naming the config group, not Hydra's wrapper around it."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, ValueError) and not isinstance(cause, USER_ERRORS):
            raise SettingError(f"{node._key()}: {cause}") from err
        raise  # `main` finds a user error behind Hydra's wrapper


def job_of(model_cfg: DictConfig, datamodule) -> Job:
    """The job of a run (`tsformer.jobs.JOBS`): the one that runs the task `model_cfg` builds, which
    must take `datamodule`'s data."""
    target = model_cfg.get("_target_")
    try:
        job = job_of_task(get_class(str(target)))
    except (ImportError, ValueError) as err:
        raise SettingError(f"model._target_: {target!r} is not a class ({err})") from err
    if job is None:
        known = sorted(f"{cls.__module__}.{cls.__qualname__}" for j in JOBS.values() for cls in j.tasks)
        raise SettingError(f"model._target_: {target} is no task of a job of tsformer; known: {known}")
    if not job.takes_data(datamodule):
        takers = [j.name for j in JOBS.values() if j.takes_data(datamodule)]
        wanted = f" (it feeds {', '.join(takers)})" if takers else ""
        raise SettingError(
            f"model: {target} does not take the data of data={datamodule.name}{wanted}; {job.name} takes {job.data}"
        )
    return job


def build_task(model_cfg: DictConfig, datamodule, baselines: list | None = None):
    """The task (LightningModule) of `model_cfg`, sized for the set-up `datamodule`'s channels and
    prepared by its job (a forecaster gets the target scaling of its metrics in original units);
    `baselines`: extra ones, beside the naive baseline, for the tasks that take them."""
    job = job_of(model_cfg, datamodule)
    sizes = job.task_sizes(datamodule)
    takes_baselines = "baselines" in task_settings(get_class(model_cfg._target_))
    extra = {"baselines": baselines} if takes_baselines else {}
    task = _instantiate_settings(
        model_cfg,
        _convert_="all",  # plain dicts and lists in the hyperparameters: checkpoints load with weights_only
        **sizes,
        **extra,
    )
    job.prepare_task(task, datamodule)
    return task


def run(cfg: DictConfig) -> RunResult | None:
    """Train, test and export one configuration, or continue the interrupted run `cfg.resume` names.

    None in the processes other than the global-zero one of a multi-process fit (DDP).
    """
    quiet_library_chatter()  # Lightning's tips and the like: nothing a user can act on
    settings.check(cfg)  # first: a setting that cannot work stops the run before data or MLflow
    tracking.require_reachable_servers(cfg)  # before anything else: an unreachable server stops the run now
    resumed = resume.resolve(cfg) if cfg.get("resume") else None
    if resumed is not None:
        # The original run's config, output folder included (not Hydra's new one): the checkpoints
        # and outputs of one run stay together, and ModelCheckpoint keeps its record of the best
        # epoch so far only when its folder is unchanged.
        cfg = resumed.config
    elif rank_zero_only.rank == 0:  # the other processes of a DDP run share the first one's folder
        _refuse_used_output_folder(cfg)
    source = _init_source(cfg) if resumed is None else None  # a resumed run's checkpoint has its weights
    # quiet: the seed is in the config and the run's params, and a data error stays one line
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule, task = _instantiate_data_and_task(cfg, source)
    _start_from(task, datamodule, source, cfg)  # before the MLflow run: a misfit stops it
    job = job_of(cfg.model, datamodule)
    tags = {"job": job.name, **(source.tags() if source is not None else {})}
    recorder = MLflowRun(cfg, _run_name(job.name, task.family, datamodule.name), resumed, tags)
    trainer = _instantiate_trainer(cfg, recorder)

    with resume.stop_on_sigterm(), tracking.restore_env("MLFLOW_TRACKING_URI"), recorder.recording():
        best_ckpt, best_val = _fit(trainer, task, datamodule, resumed)
        tester = _one_process_for_test(trainer, cfg, recorder.loggers)
        if tester is None:
            return None
        job.finish_task(task, datamodule, _fitted(cfg, best_ckpt, source if resumed is None else None))
        metrics = _test(tester, task, datamodule, best_ckpt, keep_paths=bool(cfg.get("paths_file")))
        outputs = job.write_outputs(cfg, task, datamodule, recorder.run_id)
        if outputs.example is not None:  # what the pyfunc model will answer: the saved folder's answer
            outputs.example_params = {p.name: True for p in job.prediction.params if p.required}
            predictor = Predictor.of_folder(outputs.model_folder)
            outputs.example_forecasts = predictor.predict(
                outputs.example, outputs.example_params, source="example from the data"
            )
        recorder.log_outputs(job, task, datamodule, outputs, best_ckpt)
        metrics |= outputs.metrics  # the job's own, from its outputs

    print_summary(job, recorder.logger if recorder.opened else None, metrics, task.baselines, outputs)
    return RunResult(
        metrics=metrics,
        run_id=recorder.run_id,
        best_val=best_val,
        model_folder=outputs.model_folder,
        csv_path=outputs.csv_path,
        forecasts=outputs.forecasts,
        paths_path=outputs.paths_path,
        outputs=outputs,
    )


@dataclass
class Trained:
    """A task trained and tested as `run` does it, without the run's outputs (`fit_task`)."""

    task: L.LightningModule  # with the best checkpoint's weights, after its test
    datamodule: L.LightningDataModule
    metrics: dict[str, float]  # the test's
    best_val: float | None


def fit_task(cfg: DictConfig, source=None) -> Trained:
    """The fit and test of `run` (the same settings check, seeding, data, task, trainer, callbacks and
    checkpoint) with no MLflow run and no outputs written: for benchmarks that train a job's task on
    many tables. `source` (a DataFrame) replaces `cfg.data.source`."""
    settings.check(cfg)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule, task = _instantiate_data_and_task(cfg, table=source)
    callbacks = [c for c in _run_callbacks(cfg) if not isinstance(c, LearningRateMonitor)]
    trainer = instantiate(cfg.trainer, logger=False, callbacks=callbacks)
    best_ckpt, best_val = _fit(trainer, task, datamodule, None)
    job_of(cfg.model, datamodule).finish_task(task, datamodule, _fitted(cfg, best_ckpt, None))
    metrics = _test(trainer, task, datamodule, best_ckpt, keep_paths=False)
    return Trained(task, datamodule, metrics, best_val)


def _start_from(task, datamodule, source: init_from.Source | None, cfg: DictConfig) -> None:
    """`source`'s weights into `task` (frozen with `init_from_freeze`); nothing without a source."""
    if source is None:
        return
    features = getattr(datamodule, "features", None)  # data without static embeddings has none
    vocabularies = features.static_vocabularies if features is not None else None
    loaded = init_from.load_into(task, source, vocabularies)
    if cfg.get("init_from_freeze"):
        init_from.freeze(task, loaded["taken"])


def _fitted(cfg: DictConfig, best_ckpt: str, source: init_from.Source | None) -> Fitted:
    """The run's fit as its job's `finish_task` takes it: `fit_again` trains a new task of the run's
    config on another data module as the run's task was trained (from `source`, or `cfg.init_from`'s
    model, looked up on first use: a resumed run has not loaded it)."""
    sources = [source] if source is not None or not cfg.get("init_from") else []

    def fit_again(datamodule, seed: int):
        if not sources:
            sources.append(_init_source(cfg))
        L.seed_everything(seed, workers=True, verbose=False)
        task = build_task(cfg.model, datamodule)
        _start_from(task, datamodule, sources[0], cfg)
        trainer = instantiate(
            cfg.trainer, logger=False, callbacks=[], enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, strategy="auto", devices=1, num_nodes=1,  # one process, as the test
        )  # fmt: skip
        trainer.fit(task, datamodule=datamodule)
        return task

    return Fitted(best_ckpt, int(cfg.seed), fit_again)


def _init_source(cfg: DictConfig) -> init_from.Source | None:
    """The model `cfg.init_from` names, loaded before the data is read (None without init_from); a run
    id is looked up in the run's own tracking URI."""
    if not cfg.get("init_from"):
        return None
    with tracking.restore_env("MLFLOW_TRACKING_URI"):  # a download sets it for the whole process
        found = tracking.mlflow_logger_entry(cfg)
        uri = tracking.absolute_sqlite_uri(found[1].tracking_uri) if found is not None else None
        return init_from.resolve(str(cfg.init_from), uri)


def _instantiate_data_and_task(cfg: DictConfig, source: init_from.Source | None = None, table=None):
    """The set-up data module (scaled as `source`'s model in a refit; reading `table`, a DataFrame, in
    place of `data.source` when given) and the task sized for it; refuses `paths_file` for a family
    that samples no paths."""
    datamodule = _instantiate_settings(cfg.data, **({"source": table} if table is not None else {}))
    if source is not None:
        init_from.keep_scalers(datamodule, source, cfg.model)
    datamodule.setup()
    task = build_task(cfg.model, datamodule, baselines=instantiate_group(cfg.get("baselines")))
    if cfg.get("paths_file") and not getattr(task, "samples_paths", False):
        head = getattr(task, "head", None)
        raise SettingError(
            f"paths_file={cfg.paths_file}: only dec_only and enc_dec with a distribution head (head=gaussian, "
            f"student_t or quantile) sample paths; this run is {task.family} with "
            f"head={getattr(head, 'kind', None)}"
        )
    return datamodule, task


def _instantiate_trainer(cfg: DictConfig, recorder: MLflowRun) -> L.Trainer:
    """The Trainer with the config's callbacks, the checkpoints' `ResumeState` and `recorder`."""
    callbacks = _run_callbacks(cfg)
    callbacks.append(resume.ResumeState(OmegaConf.to_container(cfg, resolve=True)))
    if not recorder.loggers:  # nothing to report learning rates to (Lightning refuses the monitor then)
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    trainer = instantiate(cfg.trainer, logger=recorder.loggers or False, callbacks=[*callbacks, recorder])
    _refuse_ddp_launch_in_a_sweep(trainer)
    return trainer


def _run_callbacks(cfg: DictConfig) -> list:
    """The config's callbacks and those every fit has: validation when a step budget shorter than an
    epoch ends, and the model table without uncounted FLOPs (in place of Lightning's own table)."""
    callbacks = [*instantiate_group(cfg.get("callbacks")), ValidationAtStepBudget()]
    if cfg.trainer.get("enable_model_summary", True):
        callbacks.append(ModelTable())
    return callbacks


def _fit(trainer: L.Trainer, task, datamodule, resumed: resume.Resume | None) -> tuple[str, float | None]:
    """Fit (from the resumed run's checkpoint, if any): (best checkpoint path or "", its score)."""
    ckpt_path = str(resumed.checkpoint) if resumed is not None else None
    trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    checkpoint = trainer.checkpoint_callback
    if not checkpoint:
        return "", None
    score = checkpoint.best_model_score
    return checkpoint.best_model_path, float(score) if score is not None else None


def _test(tester: L.Trainer, task, datamodule, best_ckpt: str, keep_paths: bool) -> dict[str, float]:
    """Test the best checkpoint (the last weights without one): the test/*, calibration/* and gate/*
    (model.linear_gate) metrics."""
    task.keep_test_paths = keep_paths
    tester.test(task, datamodule=datamodule, ckpt_path=best_ckpt or None, weights_only=True, verbose=False)
    return {
        k: float(v)
        for k, v in tester.callback_metrics.items()
        if k.startswith(("test/", "calibration/", "gate/"))
    }


def _refuse_used_output_folder(cfg: DictConfig) -> None:
    """A new run owns its output folder: another run's checkpoints there would be mixed with its own
    (`best-v1.ckpt`) and its model folder overwritten, and a run would log a model it did not train."""
    output_dir = Path(cfg.paths.output_dir)
    checkpoint_dir = OmegaConf.select(cfg, "callbacks.model_checkpoint.dirpath")
    places = [output_dir / "model", *([Path(checkpoint_dir)] if checkpoint_dir else [])]
    used = [p for p in places if p.is_dir() and any(p.iterdir())]
    if used:
        raise SettingError(
            f"output folder {output_dir} (hydra.run.dir) holds another run's outputs ({used[0]}): give "
            "each run a new folder (without hydra.run.dir every run gets one), or continue that run: "
            f"resume={output_dir}"
        )


def _run_name(job: str, family: str, dataset: str) -> str:
    """`<job>-<family>-<data file stem>-<HHMMSS>-<run tag>`: short, as MLflow's list cuts long names (a
    CSV's data set name is its path); the job tells apart runs of one network family (two jobs
    may share one); the start time and the tag of the run folder
    (`settings.run_tag`) tell apart runs started together."""
    return f"{job}-{family}-{Path(dataset).stem}-{time.strftime('%H%M%S')}-{settings.run_tag()}"


def _refuse_ddp_launch_in_a_sweep(trainer: L.Trainer) -> None:
    """Lightning's DDP launcher starts the other processes by running the same command line again
    with Hydra's run folder; under `-m` each of them starts the sweep again, in a sweep folder of its
    own (facebookresearch/hydra#2070)."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    launches = environment is not None and not environment.creates_processes_externally
    in_sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    if trainer.world_size > 1 and launches and in_sweep:
        raise SettingError(
            f"trainer.strategy={trainer.strategy.__class__.__name__} with {trainer.world_size} processes "
            "in a sweep (-m): Lightning would start each other process by re-running the whole sweep. Run "
            "the trials one by one (README, 'Several GPUs or machines')"
        )


def _one_process_for_test(trainer: L.Trainer, cfg: DictConfig, loggers: list) -> L.Trainer | None:
    """The Trainer that tests the best checkpoint: `trainer` itself after a one-process fit.

    After a multi-process fit (DDP) the test, the CSV, the model folder and the MLflow outputs
    belong to the global-zero process alone, on one device: under DDP, Lightning's test loader would
    repeat windows to even out the processes, and each process would hold the predictions of its
    share only. The process group is closed in every process first (nothing after the fit is a
    collective: the test metrics must not wait for processes that have left); the other processes
    get None and end.
    """
    if trainer.world_size == 1:
        return trainer
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if not trainer.is_global_zero:
        return None
    # the callbacks whose state the checkpoint holds (checkpointing, early stopping): idle in a test,
    # and Lightning warns when a checkpoint's callbacks are missing
    stateful = [c for c in trainer.callbacks if c.state_dict()]
    one_device = {"strategy": "auto", "devices": 1, "num_nodes": 1}
    return instantiate(cfg.trainer, **one_device, logger=loggers or False, callbacks=stateful)


def _user_error(err: BaseException) -> BaseException | None:
    """The data or setting error (`USER_ERRORS`) `err` is, or that Hydra's instantiate wrapped in it."""
    while err is not None:
        if isinstance(err, USER_ERRORS):
            return err
        err = err.__cause__ if isinstance(err, InstantiationException) else None
    return None


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Returns the best validation metric, which Hydra's sweepers optimise.

    A data or setting error of a single run is one line, `error: ...`, and exit status 2 (as in
    predict.py); HYDRA_FULL_ERROR=1 shows its traceback. In a sweep (-m) it stays the trial's error,
    which the sweep records and goes on.
    """
    log.debug("config:\n%s", OmegaConf.to_yaml(cfg))
    try:
        result = run(cfg)
    except Exception as err:
        user_error = _user_error(err)
        in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
        if user_error is None or in_sweep or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {user_error}", file=sys.stderr)
        sys.exit(2)
    return result.best_val if result is not None else None  # None: another process of a DDP fit


if __name__ == "__main__":
    main()
