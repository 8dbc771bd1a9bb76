"""`python train.py [overrides]`: data -> model -> fit -> test -> forecasts CSV, tracked in MLflow.

Every object is built from the config (`conf/`) with `hydra.utils.instantiate`; this file only puts
them together in order:
1. the settings are checked (`settings.py`), the data module validates and windows the data: bad
   input or settings fail here, before any MLflow run exists (`main` prints one line, exit status 2);
2. the task (family) is built with the input/output sizes of the data;
3. Lightning fits it (checkpoints, early stopping) and tests the best checkpoint;
4. the test forecasts go to a CSV in original units (a classifier's: the classes and probabilities
   of every test sample, `classification_outputs.py`; `Job` is where the two jobs part); the model
   folder (weights, data contract, scalers: what `predict.py` needs) is written beside it. The callback `callbacks.MLflowRun` owns
   the loggers and the MLflow run: it logs figures, scalers, the checkpoint, the CSV and a pyfunc
   model, and ends the run FINISHED, KILLED on SIGTERM or Ctrl+C, or FAILED on any error.
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
from collections.abc import Callable
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
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict

from tsformer import classification_outputs, init_from, pretraining_outputs, resume, settings, tracking
from tsformer.callbacks import MLflowRun
from tsformer.config import command_line, config_dir
from tsformer.data.schema import DataValidationError
from tsformer.export import forecasts_frame, paths_frame, select_levels, write_csv, write_parquet
from tsformer.forecaster import Forecaster, ModelInfo, example_table, save_model_folder
from tsformer.settings import SettingError
from tsformer.tasks.base import WindowTask

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


def _instantiate_group(group: DictConfig | None) -> list:
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


@dataclass
class RunOutputs:
    """The files a run writes after its test, and the example table its model folder was checked on."""

    csv_path: Path | None
    forecasts: pd.DataFrame | None
    paths_path: Path | None
    model_folder: Path
    example: pd.DataFrame  # a table from the data, as predict.py takes it
    example_forecasts: pd.DataFrame  # the saved model folder's forecasts of it
    use: tuple[str, str] = WindowTask.use  # how predict.py uses the model: what it does, its options


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


def _forecast_sizes(datamodule) -> dict:
    """What a forecasting (or reconstruction) task takes from its data."""
    return {
        "d_target": datamodule.d_target,
        "d_known": datamodule.d_known,
        "d_observed": datamodule.d_observed,
        "d_static_num": datamodule.d_static_num,
        "static_vocab_sizes": datamodule.static_vocab_sizes,
        "target_names": datamodule.target_names,
    }


@dataclass(frozen=True)
class Job:
    """What differs between the application's jobs after the data module is set up: the sizes the
    task takes from the data, the files written after the test, how they are logged (the run's
    `MLflowRun` first) and the printed summary. The data module says which job it feeds (`job`)."""

    task_sizes: Callable[..., dict]
    write_outputs: Callable[..., object]
    log_outputs: Callable[..., None]
    print_summary: Callable[..., None]
    task_kind: str  # what `model=` must build for it, for the error message
    prepare_task: Callable[..., None] = lambda task, datamodule: None  # after it is built


def job_of(datamodule) -> Job:
    """The one place the jobs part: classification data (`tsformer.data.sequences`) or windows."""
    return JOBS[getattr(datamodule, "job", "forecasting")]


def build_task(model_cfg: DictConfig, datamodule, baselines: list | None = None):
    """The task (LightningModule) of `model_cfg`, sized for the set-up `datamodule`'s channels and
    prepared by its job (a forecaster gets the target scaling of its metrics in original units);
    `baselines`: extra ones, beside the naive baseline (forecasting and reconstruction)."""
    job = job_of(datamodule)
    sizes = job.task_sizes(datamodule)
    extra = {"baselines": baselines} if job is JOBS["forecasting"] else {}
    try:
        task = _instantiate_settings(
            model_cfg,
            _convert_="all",  # plain dicts and lists in the hyperparameters: checkpoints load with weights_only
            **sizes,
            **extra,
        )
    except InstantiationException as err:
        cause = err.__cause__  # a model of another job refuses the sizes of this data
        if isinstance(cause, TypeError) and any(f"'{k}'" in str(cause) for k in sizes):
            raise SettingError(
                f"model: {model_cfg.get('_target_')} does not take the data of data={datamodule.name} "
                f"({job.task_kind}); {err.__cause__}"
            ) from err
        raise
    if getattr(datamodule, "allow_empty_targets", False) and not task.learns_around_missing_targets:
        raise SettingError(
            f"data.allow_empty_targets=true: {type(task).__name__} would learn from empty target cells; only "
            "model=enc_only_masked trains on them (fill the table with it first: predict.py --impute)"
        )
    job.prepare_task(task, datamodule)
    return task


def run(cfg: DictConfig) -> RunResult | None:
    """Train, test and export one configuration, or continue the interrupted run `cfg.resume` names.

    None in the processes other than the global-zero one of a multi-process fit (DDP).
    """
    if cfg.get("anomaly") is not None:  # anomaly detection is a job of its own (tsformer.anomaly.job)
        from tsformer.anomaly import job as anomaly_job

        _refuse_used_output_folder(cfg)
        return anomaly_job.run(cfg)
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
    if source is not None:
        features = getattr(datamodule, "features", None)  # classification data has no static embeddings
        vocabularies = features.static_vocabularies if features is not None else None
        loaded = init_from.load_into(task, source, vocabularies)  # before the MLflow run: a misfit stops it
        if cfg.get("init_from_freeze"):
            init_from.freeze(task, loaded["taken"])
    job = job_of(datamodule)
    tags = source.tags() if source is not None else {}
    recorder = MLflowRun(cfg, _run_name(task.family, datamodule.name), resumed, tags)
    trainer = _instantiate_trainer(cfg, recorder)

    with resume.stop_on_sigterm(), tracking.restore_env("MLFLOW_TRACKING_URI"), recorder.recording():
        best_ckpt, best_val = _fit(trainer, task, datamodule, resumed)
        tester = _one_process_for_test(trainer, cfg, recorder.loggers)
        if tester is None:
            return None
        metrics = _test(tester, task, datamodule, best_ckpt, keep_paths=bool(cfg.get("paths_file")))
        outputs = job.write_outputs(cfg, task, datamodule, recorder.run_id)
        job.log_outputs(recorder, task, datamodule, outputs, best_ckpt)

    job.print_summary(recorder.logger if recorder.opened else None, metrics, task.baselines, outputs)
    return RunResult(
        metrics=metrics,
        run_id=recorder.run_id,
        best_val=best_val,
        model_folder=outputs.model_folder,
        csv_path=outputs.csv_path,
        forecasts=outputs.forecasts,
        paths_path=outputs.paths_path,
    )


def _init_source(cfg: DictConfig) -> init_from.Source | None:
    """The model `cfg.init_from` names, loaded before the data is read (None without init_from); a run
    id is looked up in the run's own tracking URI."""
    if not cfg.get("init_from"):
        return None
    with tracking.restore_env("MLFLOW_TRACKING_URI"):  # a download sets it for the whole process
        found = tracking.mlflow_logger_entry(cfg)
        uri = tracking.absolute_sqlite_uri(found[1].tracking_uri) if found is not None else None
        return init_from.resolve(str(cfg.init_from), uri)


def _instantiate_data_and_task(cfg: DictConfig, source: init_from.Source | None = None):
    """The set-up data module (scaled as `source`'s model in a refit) and the task sized for it; refuses
    `paths_file` for a family that samples no paths."""
    datamodule = _instantiate_settings(cfg.data)
    if source is not None:
        init_from.keep_scalers(datamodule, source, cfg.model)
    datamodule.setup()
    task = build_task(cfg.model, datamodule, baselines=_instantiate_group(cfg.get("baselines")))
    head = getattr(task, "head", None)  # classification has no forecast head
    if cfg.get("paths_file") and not (head is not None and head.probabilistic and task.autoregressive):
        raise SettingError(
            f"paths_file={cfg.paths_file}: only dec_only and enc_dec with a distribution head (head=gaussian, "
            f"student_t or quantile) sample paths; this run is {task.family} with "
            f"head={getattr(head, 'kind', None)}"
        )
    return datamodule, task


def _instantiate_trainer(cfg: DictConfig, recorder: MLflowRun) -> L.Trainer:
    """The Trainer with the config's callbacks, the checkpoints' `ResumeState` and `recorder`."""
    callbacks = _instantiate_group(cfg.get("callbacks"))
    callbacks.append(resume.ResumeState(OmegaConf.to_container(cfg, resolve=True)))
    if not recorder.loggers:  # nothing to report learning rates to (Lightning refuses the monitor then)
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    trainer = instantiate(cfg.trainer, logger=recorder.loggers or False, callbacks=[*callbacks, recorder])
    _refuse_ddp_launch_in_a_sweep(trainer)
    return trainer


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
    """Test the best checkpoint (the last weights without one): the test/* and calibration/* metrics."""
    task.keep_test_paths = keep_paths
    tester.test(task, datamodule=datamodule, ckpt_path=best_ckpt or None, weights_only=True, verbose=False)
    return {
        k: float(v) for k, v in tester.callback_metrics.items() if k.startswith(("test/", "calibration/"))
    }


def _write_outputs(cfg: DictConfig, task, datamodule, run_id: str | None) -> RunOutputs:
    """The forecasts CSV, sampled paths (Parquet) and the model folder, checked by a round trip."""
    output_dir = Path(cfg.paths.output_dir)
    tested = task.test_outputs
    forecasts = csv_path = paths_path = None
    if cfg.forecasts_file:
        quantiles = _quantiles(task, task.head.levels)
        forecasts = forecasts_frame(
            datamodule, "test", tested["pred"], tested["true"], tested["valid"], *quantiles
        )
        csv_path = write_csv(forecasts, output_dir / cfg.forecasts_file)
    if cfg.get("paths_file"):
        paths_path = write_parquet(
            paths_frame(datamodule, "test", tested["paths"]), output_dir / cfg.paths_file
        )
    info = ModelInfo(
        family=task.family, dataset=datamodule.name, run_id=run_id, git_commit=tracking.git_commit()
    )
    model_folder = save_model_folder(output_dir / "model", task, datamodule, info)
    # a round trip through the saved folder, as predict.py does it: fails the run, not a user later
    example = example_table(datamodule)
    example_forecasts = Forecaster.load(model_folder).predict(example, source="example from the data")
    return RunOutputs(csv_path, forecasts, paths_path, model_folder, example, example_forecasts, task.use)


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


def _run_name(family: str, dataset: str) -> str:
    """`<family>-<data file stem>-<HHMMSS>-<run tag>`: short, as MLflow's list cuts long names (a CSV's
    data set name is its path); the start time and the tag of the run folder (`settings.run_tag`)
    tell apart runs started together."""
    return f"{family}-{Path(dataset).stem}-{time.strftime('%H%M%S')}-{settings.run_tag()}"


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


def _quantiles(task, levels: list[float]) -> tuple:
    """(quantiles `(W, T, Dy, K)` of the test windows at `levels`, scaled; levels), or (None, None)
    for a point head: the extra arguments of `forecasts_frame`."""
    if not task.head.probabilistic:
        return None, None
    return select_levels(task.test_outputs["quantiles"], task.report_levels, levels), levels


def _print_summary(logger, metrics: dict[str, float], baselines: list, outputs: RunOutputs) -> None:
    """The run id, each test metric of the model beside the baselines' (the first is the naive one,
    `baseline`), what the columns and units are, where the CSV is, and how to forecast with the model."""
    lines = ["", "=" * 72]
    if logger is not None:
        lines.append(f"MLflow run id: {logger.run_id}   (tracking URI: {logger.experiment.tracking_uri})")
    lines += _metric_table(metrics, baselines)
    if "calibration/val_coverage_80_as_trained" in metrics:
        lines.append(
            "spread calibration (model.head.calibrate, calibration_window): the validation windows' 80% "
            f"interval covered {metrics['calibration/val_coverage_80_as_trained']:.3f} as trained; their "
            f"factor x{metrics['calibration/spread_scale_first_step']:.2f} at the first step, "
            f"x{metrics['calibration/spread_scale_last_step']:.2f} at the last"
        )
    lines += [f"{b.name}: {b.description}" for b in baselines]
    lines.append("*_orig rows: in the targets' own units; the others: on the targets as scaled for training")
    csv_path = outputs.csv_path
    lines.append(
        f"forecasts CSV: {csv_path.resolve()}" if csv_path else "forecasts CSV: none (forecasts_file=null)"
    )
    ref = logger.run_id if logger is not None else outputs.model_folder.resolve()
    what, options = outputs.use
    lines.append(f"{what}: {command_line('predict', str(ref), '<table.csv>', *options.split())}")
    lines.append("=" * 72)
    if outputs.paths_path is not None:
        lines.append(f"sampled paths: {outputs.paths_path.resolve()}")
    print("\n".join(lines))


def _metric_table(metrics: dict[str, float], baselines: list) -> list[str]:
    """One line per test metric (the model's, then each baseline's), under a header line."""
    names = ["mse", "mae", "mae_orig", "rmse_orig"]
    names += sorted(k.removeprefix("test/") for k in metrics if k.startswith("test/mae_orig/"))
    probabilistic = ("crps", "crps_orig", "pinball", "coverage_80", "width_80", "width_80_orig")
    names += [n for n in probabilistic if f"test/{n}" in metrics]
    width = max(len(n) for n in names) + 2
    columns = ["model", *(b.name for b in baselines)]
    col = max(14, *(len(c) for c in columns)) + 2
    lines = [f"{'test metric':<{width}}" + "".join(f"{c:>{col}}" for c in columns)]
    for name in names:
        keys = [f"test/{name}"] + [f"test/{b.name}_{name}" for b in baselines]
        lines.append(f"{name:<{width}}" + "".join(f"{metrics.get(k, float('nan')):>{col}.4f}" for k in keys))
    return lines


JOBS = {
    "forecasting": Job(
        _forecast_sizes,
        _write_outputs,
        MLflowRun.log_outputs,
        _print_summary,
        "a forecasting or "
        "reconstruction data config (data=plant, csv, ett, ...) with a model such as enc_dec",
        lambda task, datamodule: task.set_target_scaling(datamodule.features.target_scaler),
    ),
    "classification": Job(
        classification_outputs.task_sizes,
        classification_outputs.write_outputs,
        classification_outputs.log_outputs,
        classification_outputs.print_summary,
        "labelled sequences or streams, for model=enc_only_classifier",
    ),
    "pretraining": Job(
        pretraining_outputs.task_sizes,
        pretraining_outputs.write_outputs,
        pretraining_outputs.log_outputs,
        pretraining_outputs.print_summary,
        "labelled sequences or streams with a classifier's model config, for pretrain=masked",
    ),
}


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
