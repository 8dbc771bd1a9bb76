"""`python train.py [overrides]`: data -> model -> fit -> test -> forecasts CSV, tracked in MLflow.

Every object is built from the config (`conf/`) with `hydra.utils.instantiate`; this file only puts
them together in order:
1. the data module validates and windows the data (bad input fails here, before any run exists);
2. the task (family) is built with the input/output sizes of the data;
3. Lightning fits it (checkpoints, early stopping) and tests the best checkpoint;
4. the test forecasts go to a CSV in original units; the model folder (weights, data contract,
   scalers: what `predict.py` needs) is written beside it; figures, scalers, the checkpoint, the CSV
   and a pyfunc model are logged to the MLflow run, which ends FINISHED, KILLED on SIGTERM, or
   FAILED on any error.
`resume=<run id | output folder | checkpoint>` continues an interrupted run instead (`resume.py`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
import joblib
import lightning as L
import pandas as pd
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor
from omegaconf import DictConfig, OmegaConf, open_dict

from tsformer import resume, sweep, tracking
from tsformer.export import forecasts_frame, write_csv
from tsformer.forecaster import Forecaster, ModelInfo, example_table, save_model_folder
from tsformer.plots import error_by_step_figure, forecast_windows_figure

log = logging.getLogger(__name__)

# conf/ sits at the top of the repository: found from this file, so any working directory works.
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")


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
    return [instantiate(entry) for entry in group.values() if isinstance(entry, DictConfig) and "_target_" in entry]


@dataclass
class RunResult:
    """What one run produced (for scripts and sweeps; the CLI prints a summary of it)."""

    metrics: dict[str, float]  # test/* metrics of the model and the baselines
    forecasts: pd.DataFrame  # the exported CSV's rows (original units)
    baseline_forecasts: pd.DataFrame  # the naive baseline's, same layout
    csv_path: Path
    model_folder: Path  # what predict.py and Forecaster.load read
    best_val: float | None  # best monitored validation metric (val/mse by default)
    run_id: str | None
    n_params: int
    fit_seconds: float


def run(cfg: DictConfig) -> RunResult:
    """Train, test and export one configuration, or continue the interrupted run `cfg.resume` names."""
    tracking.require_reachable_servers(cfg)  # before anything else: an unreachable server stops the run now
    resumed = resume.resolve(cfg) if cfg.get("resume") else None
    if resumed is not None:
        # The original run's config, output folder included (not Hydra's new one): the checkpoints
        # and outputs of one run stay together, and ModelCheckpoint keeps its record of the best
        # epoch so far only when its folder is unchanged.
        cfg = resumed.config
    if cfg.trainer.get("limit_test_batches", 1.0) != 1.0:
        raise ValueError(
            f"trainer.limit_test_batches={cfg.trainer.limit_test_batches}: every test window is evaluated "
            "and exported, so it must stay 1.0 (use smaller data or data.eval_stride to test faster)"
        )
    L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    task = instantiate(
        cfg.model,
        _convert_="all",  # plain dicts and lists in the hyperparameters: checkpoints load with weights_only
        d_target=datamodule.d_target,
        d_known=datamodule.d_known,
        d_observed=datamodule.d_observed,
        d_static_num=datamodule.d_static_num,
        static_vocab_sizes=datamodule.static_vocab_sizes,
        target_names=datamodule.target_names,
        baselines=_instantiate_group(cfg.get("baselines")),  # extra ones, beside the naive baseline
    )
    output_dir = Path(cfg.paths.output_dir)

    with open_dict(cfg):
        for entry in (cfg.get("logger") or {}).values():
            if "run_name" in entry and entry.run_name is None:  # a run without a name: <family>-<data set>
                entry.run_name = f"{task.family}-{datamodule.name}"
            if "tracking_uri" in entry:
                entry.tracking_uri = tracking.absolute_sqlite_uri(entry.tracking_uri)
                if resumed is not None:
                    entry.run_id = resumed.run_id
    loggers = _instantiate_group(cfg.get("logger"))
    mlflow_logger = tracking.find_mlflow_logger(loggers)
    callbacks = _instantiate_group(cfg.get("callbacks"))
    callbacks.append(resume.ResumeState(OmegaConf.to_container(cfg, resolve=True)))
    if not loggers:  # nothing to report learning rates to (Lightning refuses the monitor then)
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    trainer = instantiate(cfg.trainer, logger=loggers or False, callbacks=callbacks)

    with resume.stop_on_sigterm(), tracking.restore_env("MLFLOW_TRACKING_URI"):
        try:
            if mlflow_logger is not None:
                _open_mlflow_run(mlflow_logger, cfg, task, datamodule, trainer, resumed)
            start = time.perf_counter()
            ckpt_path = str(resumed.checkpoint) if resumed is not None else None
            trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
            fit_seconds = time.perf_counter() - start
            best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
            trainer.test(task, datamodule=datamodule, ckpt_path=best or None, weights_only=True, verbose=False)
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}

            outputs = task.test_outputs
            forecasts = forecasts_frame(datamodule, "test", outputs["pred"], outputs["true"], outputs["valid"])
            csv_path = write_csv(forecasts, output_dir / cfg.forecasts_file)
            baseline = forecasts_frame(datamodule, "test", outputs["baseline"], outputs["true"], outputs["valid"])
            run_id = mlflow_logger.run_id if mlflow_logger is not None else None
            info = ModelInfo(family=task.family, dataset=datamodule.name, run_id=run_id, git_commit=tracking.git_commit())
            model_folder = save_model_folder(output_dir / "model", task, datamodule, info)
            # a round trip through the saved folder, as predict.py does it: fails the run, not a user later
            example = example_table(datamodule)
            example_forecasts = Forecaster.load(model_folder).predict(example, source="example from the data")
            if mlflow_logger is not None:
                _log_outputs(mlflow_logger, cfg, datamodule, forecasts, baseline, csv_path, best, output_dir)
                registry_name = (cfg.get("model_registry") or {}).get("name")
                tracking.log_pyfunc_model(mlflow_logger, model_folder, example, example_forecasts, registry_name)
                tracking.end_run(mlflow_logger, "FINISHED")
        except BaseException as err:
            if mlflow_logger is not None:
                tracking.end_run(mlflow_logger, "KILLED" if resume.stopped_by_sigterm(err) else "FAILED")
            raise

    _print_summary(mlflow_logger, metrics, [b.name for b in task.baselines], csv_path, model_folder)
    score = trainer.checkpoint_callback.best_model_score if trainer.checkpoint_callback else None
    return RunResult(
        metrics=metrics,
        forecasts=forecasts,
        baseline_forecasts=baseline,
        csv_path=csv_path,
        model_folder=model_folder,
        best_val=float(score) if score is not None else None,
        run_id=mlflow_logger.run_id if mlflow_logger is not None else None,
        n_params=sum(p.numel() for p in task.net.parameters()),
        fit_seconds=fit_seconds,
    )


def _open_mlflow_run(logger, cfg, task, datamodule, trainer, resumed: resume.Resume | None) -> None:
    """A new run: its config and tags, among them where its checkpoints are (resume=<run id> finds
    last.ckpt there, even after SIGKILL). A resumed run: its original MLflow run, reopened."""
    if resumed is None:
        tags = {"family": task.family, "dataset": datamodule.name, "git_commit": tracking.git_commit()}
        tags.update(sweep.trial_tags())  # in a sweep: its folder, the trial, the sweep's parent run
        tags["output_dir"] = str(cfg.paths.output_dir)
        if trainer.checkpoint_callback:
            tags["checkpoint_dir"] = str(trainer.checkpoint_callback.dirpath)
        tracking.start_run(logger, cfg, tags)
    else:
        tags = {"resumed_from": f"{resumed.checkpoint} (written in epoch {resumed.epoch})"}
        tracking.resume_run(logger, tags, cfg.get("system_metrics"))
    # in the log from the start: the id to resume the run with if it is killed
    log.info("MLflow run id: %s, outputs in %s", logger.run_id, cfg.paths.output_dir)


def _log_outputs(logger, cfg, datamodule, forecasts, baseline, csv_path, best_ckpt, output_dir: Path) -> None:
    scaler_dir = output_dir / "scalers"
    scaler_dir.mkdir(parents=True, exist_ok=True)
    files = [("forecasts", csv_path)]  # (artifact folder, local file)
    for name in ("target_scaler", "covariate_scaler"):
        scaler = getattr(datamodule, name)
        if scaler is not None:
            joblib.dump(scaler, scaler_dir / f"{name}.joblib")
            files.append(("scalers", scaler_dir / f"{name}.joblib"))
    if best_ckpt:
        files.append(("checkpoints", Path(best_ckpt)))
    tracking.log_files(logger, files)

    history = datamodule.frame.rename(columns={datamodule.schema.time_col: "time"})
    if datamodule.schema.series_col:
        history = history.rename(columns={datamodule.schema.series_col: "series_id"})
    else:
        history = history.assign(series_id=0)
    fig = forecast_windows_figure(forecasts, history, cfg.n_plot_windows)
    tracking.log_figure(logger, fig, "plots/test_windows.png")
    fig = error_by_step_figure(forecasts, baseline)
    tracking.log_figure(logger, fig, "plots/error_by_step.png")


def _print_summary(logger, metrics: dict[str, float], baselines: list[str], csv_path: Path, model_folder: Path) -> None:
    """The run id, each test metric of the model beside the baselines' (`baseline` = the naive one),
    where the CSV is, and how to forecast with the model."""
    names = ["mse", "mae", "mae_orig", "rmse_orig"]
    names += sorted(k.removeprefix("test/") for k in metrics if k.startswith("test/mae_orig/"))
    width = max(len(n) for n in names) + 2
    columns = ["model", *baselines]
    lines = ["", "=" * 72]
    if logger is not None:
        lines.append(f"MLflow run id: {logger.run_id}   (tracking URI: {logger.experiment.tracking_uri})")
    col = max(14, *(len(c) for c in columns)) + 2
    lines.append(f"{'test metric':<{width}}" + "".join(f"{c:>{col}}" for c in columns))
    for name in names:
        keys = [f"test/{name}"] + [f"test/{b}_{name}" for b in baselines]
        lines.append(f"{name:<{width}}" + "".join(f"{metrics.get(k, float('nan')):>{col}.4f}" for k in keys))
    lines.append(f"forecasts CSV: {csv_path.resolve()}")
    ref = logger.run_id if logger is not None else model_folder.resolve()
    lines.append(f"forecast new data: python predict.py {ref} <table.csv> --output forecasts.csv")
    lines.append("=" * 72)
    print("\n".join(lines))


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Returns the best validation metric, which Hydra's sweepers optimise."""
    log.debug("config:\n%s", OmegaConf.to_yaml(cfg))
    return run(cfg).best_val


if __name__ == "__main__":
    main()
