"""`MLflowRun`: the Lightning callback that owns a training run's loggers and its MLflow run.

Built once from the run's config (`train.run`), it
- fills in the logger entries (run name, absolute sqlite URI, a resumed run's id) and instantiates
  the loggers, in the first process only (under DDP the others would race creating the database);
- opens the MLflow run when the fit starts (config, tags, `n_params`) or reopens a resumed one;
- logs `fit/seconds` and `fit/steps` when the fit ends;
- logs the outputs after the test (`log_outputs`: forecasts, the fitted feature pipeline
  `scalers/features.json`, best checkpoint, figures, each test window's MSE, the pyfunc model) and
  ends the run FINISHED;
- ends it KILLED (SIGTERM, Ctrl+C: `resume.stopped_on_request`) or FAILED on any error raised inside
  `recording()`. Lightning's `on_exception` cannot do this: Lightning calls it before its own
  `logger.finalize("failed")`, which would turn KILLED into FAILED, and it never sees the errors
  after `trainer.test` returns (export, model folder, uploads).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict

from tsformer import resume, tracking
from tsformer.data.features import FeaturePipeline
from tsformer.export import SplitView, forecasts_frame, mae_by_step, select_levels, write_json
from tsformer.plots import attention_figure, error_by_step_figure, fan_chart_figure, forecast_windows_figure
from tsformer.tasks.probabilistic import BAND_LEVELS

log = logging.getLogger(__name__)

WINDOW_MSE = "test/window_mse.csv"  # artifact: each test window's MSE (scaled units), in window order


class MLflowRun(Callback):
    """The run's loggers (`loggers`) and the lifecycle of its MLflow run (see the module docstring)."""

    def __init__(
        self, cfg: DictConfig, run_name: str, resumed: resume.Resume | None, tags: dict | None = None
    ):
        _fill_in_loggers(cfg, run_name, resumed)  # in place: the checkpoints keep the filled-in config
        self.loggers: list = []
        if rank_zero_only.rank == 0:  # rank the launcher gave; `trainer.is_global_zero` decides later
            if (found := tracking.mlflow_logger_entry(cfg)) is not None:  # other runs may be creating it
                tracking.prepare_sqlite_store(found[1].tracking_uri, found[1].experiment_name)
            self.loggers = [instantiate(e) for e in (cfg.get("logger") or {}).values() if "_target_" in e]
        self.logger = tracking.find_mlflow_logger(self.loggers)
        self.cfg = cfg
        self.resumed = resumed
        self.tags = dict(tags or {})  # a new run's extra tags (init_from: where its weights came from)
        self.opened = False  # True once the MLflow run may exist: from then on it is never left RUNNING
        self._fit_start = 0.0

    @property
    def run_id(self) -> str | None:
        return self.logger.run_id if self.opened else None

    # -- Lightning hooks --------------------------------------------------------------------------

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or self.logger is None or not trainer.is_global_zero or self.opened:
            return
        self.opened = True
        self._fit_start = time.perf_counter()
        if self.resumed is None:
            self._start(trainer, pl_module)
        else:
            tags = {"resumed_from": f"{self.resumed.checkpoint} (written in epoch {self.resumed.epoch})"}
            tracking.resume_run(self.logger, tags, self.cfg.get("system_metrics"))
        # in the log from the start: the id to resume the run with if it is killed
        log.info("MLflow run id: %s, outputs in %s", self.logger.run_id, self.cfg.paths.output_dir)

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.opened:
            client, run_id = self.logger.experiment, self.logger.run_id
            client.log_metric(run_id, "fit/seconds", time.perf_counter() - self._fit_start)
            client.log_metric(run_id, "fit/steps", trainer.global_step)  # early stopping may end it sooner

    # -- after the test ---------------------------------------------------------------------------

    def log_outputs(self, task, datamodule, outputs, best_ckpt: str) -> None:
        """Log the run's outputs (`train.RunOutputs`) and end the run FINISHED (no MLflow run: nothing)."""
        if not self.opened:
            return
        tested = task.test_outputs  # pred, true, valid, baseline arrays in window order
        files = [("forecasts", f) for f in (outputs.csv_path, outputs.paths_path) if f is not None]
        files += _scaler_files(datamodule.features, Path(self.cfg.paths.output_dir) / "scalers")
        if best_ckpt:
            files.append(("checkpoints", Path(best_ckpt)))
        tracking.log_files(self.logger, files)
        client, run_id = self.logger.experiment, self.logger.run_id
        client.log_metric(run_id, "test/n_windows", len(tested["pred"]))
        window_mse = datamodule.window_info("test").assign(mse=_window_mse(tested))
        client.log_text(run_id, window_mse.to_csv(index=False), WINDOW_MSE)
        self._log_figures(task, datamodule)
        registry_name = (self.cfg.get("model_registry") or {}).get("name")
        tracking.log_pyfunc_model(
            self.logger, outputs.model_folder, outputs.example, outputs.example_forecasts, registry_name
        )
        tracking.end_run(self.logger, "FINISHED")

    @contextmanager
    def recording(self):
        """Ends an opened MLflow run KILLED or FAILED when the block raises (the error goes on)."""
        try:
            yield
        except BaseException as err:
            if self.opened:
                tracking.end_run(self.logger, "KILLED" if resume.stopped_on_request(err) else "FAILED")
            raise

    # -- helpers ----------------------------------------------------------------------------------

    def _start(self, trainer, task) -> None:
        """A new run: its config and tags, among them where its checkpoints are (resume=<run id> finds
        last.ckpt there, even after SIGKILL), and the network's parameter count."""
        from tsformer import sweep  # sweep.py imports tracking, as this module does

        tags = {
            "family": task.family,
            "dataset": trainer.datamodule.name,
            "git_commit": tracking.git_commit(),
        }
        tags.update(sweep.trial_tags())  # in a sweep: its folder, the trial, the sweep's parent run
        tags["output_dir"] = str(self.cfg.paths.output_dir)
        tags.update(self.tags)
        if trainer.checkpoint_callback:
            tags["checkpoint_dir"] = str(trainer.checkpoint_callback.dirpath)
        config = OmegaConf.to_container(self.cfg, resolve=True)  # plain values: tracking never sees the cfg
        tracking.start_run(self.logger, config, tags, config.get("system_metrics"))
        n_params = sum(p.numel() for p in task.net.parameters())
        self.logger.experiment.log_param(self.logger.run_id, "n_params", n_params)

    def _log_figures(self, task, datamodule) -> None:
        """Test windows, error by step, attention and (distribution heads) the fan chart, drawn from
        the test arrays without the CSV-sized frame."""
        tested = task.test_outputs
        n_plot = self.cfg.n_plot_windows
        shown = _plot_windows(len(tested["pred"]), n_plot)
        view = SplitView.of(datamodule, "test")
        windows = forecasts_frame(view, tested["pred"], tested["true"], tested["valid"], windows=shown)
        reconstruction = datamodule.horizon == 0  # the figures say "reconstruction", not "forecast"
        history = _history(datamodule)
        units = view.units
        figures = {
            "plots/test_windows.png": forecast_windows_figure(windows, history, n_plot, reconstruction, units)
        }
        model_mae = mae_by_step(view, tested["pred"], tested["true"], tested["valid"])
        baseline_mae = mae_by_step(view, tested["baseline"], tested["true"], tested["valid"])
        figures["plots/error_by_step.png"] = error_by_step_figure(
            model_mae, baseline_mae, reconstruction, view.freq, units
        )
        figures["plots/attention.png"] = attention_figure(task, view, datamodule.datasets["test"])
        if task.head.probabilistic:
            quantiles = select_levels(tested["quantiles"], task.report_levels, BAND_LEVELS)
            args = (tested["pred"], tested["true"], tested["valid"], quantiles, BAND_LEVELS)
            bands = forecasts_frame(view, *args, windows=shown)
            figures["plots/fan_chart.png"] = fan_chart_figure(bands, history, n_plot, units)
        for name, fig in figures.items():  # in MLflow, and beside the forecasts CSV
            tracking.log_figure(self.logger, fig, name, Path(self.cfg.paths.output_dir))


def _fill_in_loggers(cfg: DictConfig, run_name: str, resumed: resume.Resume | None) -> None:
    """The logger entries' run name where unset, sqlite URIs made absolute, a resumed run's id."""
    with open_dict(cfg):
        for entry in (cfg.get("logger") or {}).values():
            if "run_name" in entry and entry.run_name is None:
                entry.run_name = run_name
            if "tracking_uri" in entry:
                entry.tracking_uri = tracking.absolute_sqlite_uri(entry.tracking_uri)
                if resumed is not None:
                    entry.run_id = resumed.run_id


def _scaler_files(features: FeaturePipeline, folder: Path) -> list[tuple[str, Path]]:
    """The fitted feature pipeline (scalers as numbers, vocabularies) as `folder`/features.json:
    (artifact folder, local file) pairs."""
    path = write_json(features.to_dict(), folder / "features.json")
    return [("scalers", path)]


def _window_mse(outputs: dict[str, np.ndarray]) -> np.ndarray:
    """`(W,)`: the squared error of each test window averaged over its valid steps and variables (a
    masked fill-in run predicts its hidden values only: its other y_pred are NaN and not counted)."""
    sq = (outputs["pred"] - outputs["true"]) ** 2  # (W, T, Dy)
    scored = outputs["valid"][..., None] & ~np.isnan(sq)
    return np.where(scored, sq, 0.0).sum(axis=(1, 2)) / np.maximum(scored.sum(axis=(1, 2)), 1)


def _plot_windows(n_windows: int, n_plot: int) -> np.ndarray:
    """Indices of the test windows the figures show: `n_plot` spread evenly over the test period."""
    return np.linspace(0, n_windows - 1, min(n_plot, n_windows)).round().astype(int)


def _history(datamodule) -> pd.DataFrame:
    """The validated data with the columns `series_id`, `time` and the targets, for the figures."""
    history = datamodule.frame.rename(columns={datamodule.schema.time_col: "time"})
    if datamodule.schema.series_col:
        return history.rename(columns={datamodule.schema.series_col: "series_id"})
    return history.assign(series_id=0)
