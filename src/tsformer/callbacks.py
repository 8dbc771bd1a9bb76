"""The run's own Lightning callbacks: `MLflowRun`, which owns a training run's loggers and its MLflow run,
`LastWeights`, the checkpoint of a fixed budget (`callbacks=last_weights`), and two every run has:
`ValidationAtStepBudget` (a `trainer.max_steps` shorter than an epoch validates when it ends) and
`ModelTable` (Lightning's model summary without the FLOPs it did not count).

`MLflowRun`:

Built once from the run's config (`train.run`), it
- fills in the logger entries (run name, absolute sqlite URI, a resumed run's id) and instantiates
  the loggers, in the first process only (under DDP the others would race creating the database);
- opens the MLflow run when the fit starts (config, tags, `n_params`, the data as MLflow datasets:
  `data_inputs`) or reopens a resumed one;
- logs `fit/seconds` and `fit/steps` when the fit ends;
- logs the outputs after the test (`log_outputs`: the CSV, best checkpoint, what the run's job logs
  (`tsformer.jobs`: figures, metrics), the pyfunc model) and ends the run FINISHED;
- ends it KILLED (SIGTERM, Ctrl+C: `resume.stopped_on_request`) or FAILED on any error raised inside
  `recording()`. Lightning's `on_exception` cannot do this: Lightning calls it before its own
  `logger.finalize("failed")`, which would turn KILLED into FAILED, and it never sees the errors
  after `trainer.test` returns (export, model folder, uploads).
"""

from __future__ import annotations

import importlib.util
import logging
import time
from contextlib import contextmanager
from pathlib import Path

from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ModelSummary, RichModelSummary
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.model_summary.model_summary import (
    _format_summary_table,
    get_human_readable_count,
)
from omegaconf import DictConfig, OmegaConf, open_dict

from tsformer import resume, tracking
from tsformer.data_inputs import log_datasets
from tsformer.serving.pyfunc_logging import log_pyfunc_model

log = logging.getLogger(__name__)


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
        # the tables it reads (a resumed run logged them when it started: none twice)
        data = OmegaConf.to_container(self.cfg.data, resolve=True) if "data" in self.cfg else {}
        log_datasets(self.logger, data, trainer.datamodule)
        # in the log from the start: the id to resume the run with if it is killed
        log.info("MLflow run id: %s, outputs in %s", self.logger.run_id, self.cfg.paths.output_dir)

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.opened:
            client, run_id = self.logger.experiment, self.logger.run_id
            client.log_metric(run_id, "fit/seconds", time.perf_counter() - self._fit_start)
            client.log_metric(run_id, "fit/steps", trainer.global_step)  # early stopping may end it sooner

    # -- after the test ---------------------------------------------------------------------------

    def log_outputs(self, job, task, datamodule, outputs, best_ckpt: str) -> None:
        """Log the run's outputs (`jobs.RunOutputs`: its CSV and paths; the best checkpoint, the job's
        own metrics, its figures where `figures` is true, and its model) and end the run FINISHED (no
        MLflow run: nothing)."""
        if not self.opened:
            return
        files = [(outputs.logged_under, f) for f in (outputs.csv_path, outputs.paths_path) if f is not None]
        if best_ckpt:
            files.append(("checkpoints", Path(best_ckpt)))
        tracking.log_files(self.logger, files)
        job.log_outputs(self.logger, self.cfg, task, datamodule, outputs)
        if self.cfg.get("figures", True):  # figures=false: none drawn (sweeps, benchmarks)
            beside_csv = Path(self.cfg.paths.output_dir)  # in MLflow, and in the run's output folder
            for name, figure in job.figures(self.cfg, task, datamodule, outputs).items():
                tracking.log_figure(self.logger, figure, name, beside_csv)
        if outputs.example is None:  # no pyfunc model: the folder as the run's artifacts `model`
            self.logger.experiment.log_artifacts(self.logger.run_id, str(outputs.model_folder), "model")
        else:
            registry_name = (self.cfg.get("model_registry") or {}).get("name")
            log_pyfunc_model(
                self.logger,
                outputs.model_folder,
                outputs.example,
                outputs.example_forecasts,
                registry_name,
                params={param.name: param.unset for param in job.prediction.params},
                example_params=outputs.example_params,
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
            "family": task.family,  # the network's; `job` (in self.tags) says what it does
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


class LastWeights(ModelCheckpoint):
    """The weights at the end of a fixed budget (`conf/callbacks/last_weights.yaml`): written when the fit
    ends, and every `every_n_train_steps` steps before (a checkpoint to look at while it runs), never at
    each epoch's end. A budget of optimiser steps gives a set of 40 series 1600 epochs of 3 batches: a
    checkpoint at every epoch's end cost a quarter of the fit's time there
    (benchmarks/RESULTS_classification.md, "Speed")."""

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        if trainer.fast_dev_run:
            return
        path = self.format_checkpoint_name({})  # the config's file name: no metric in it
        # every process calls it (DDP: the first one writes); weights_only given, as Lightning logs a line else
        trainer.save_checkpoint(path, weights_only=self.save_weights_only)
        self.best_model_path = self.last_model_path = path  # what the run tests and logs


class ValidationAtStepBudget(Callback):
    """A step budget (`trainer.max_steps`) that ends inside the first epoch validates when it ends.
    Lightning validates at an epoch's end (`val_check_interval=1.0`), which such a budget never reaches:
    early stopping and the best checkpoint would then find no `val/...` metric and stop the run with
    Lightning's traceback. Every `max_steps x accumulate_grad_batches` batches is the same validation
    point as the end of the budget (the training stops there)."""

    def on_train_start(self, trainer, pl_module) -> None:
        budget = trainer.max_steps * trainer.accumulate_grad_batches  # in batches
        if trainer.global_step == 0 and 0 < budget < trainer.num_training_batches:  # inf: no length
            trainer.val_check_batch = min(trainer.val_check_batch, budget)


class ModelTable(ModelSummary):
    """The model table a run prints (`trainer.enable_model_summary`), in place of Lightning's: its rows,
    drawn with rich where rich is installed (as Lightning chooses), without the FLOPs column and total
    when none were counted. Lightning counts them by running the task's `example_input_array`, which no
    task here has, and printed `Total FLOPs: 0` and a 0 per layer."""

    @staticmethod
    def summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops, **summarize_kwargs) -> None:  # fmt: skip
        rich = importlib.util.find_spec("rich") is not None
        if total_flops:  # counted: Lightning's own table
            (RichModelSummary if rich else ModelSummary).summarize(
                summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                total_flops, **summarize_kwargs,
            )  # fmt: skip
            return
        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        if not rich:
            table = _format_summary_table(
                total_parameters, trainable_parameters, model_size, total_training_modes, 0, *columns
            )
            lines = [line for line in table.splitlines() if not line.rstrip().endswith("Total Flops")]
            logging.getLogger(ModelSummary.__module__).info(
                "\n" + "\n".join(lines)
            )  # where Lightning logs it
            return
        from rich import get_console
        from rich.table import Table

        table = Table(header_style="bold magenta")
        for name, _ in columns:
            table.add_column(name, justify="right" if name.startswith("Params") else "left")
        for row in zip(*(values for _, values in columns), strict=True):
            table.add_row(*map(str, row))
        totals = {
            "Trainable params": get_human_readable_count(trainable_parameters),
            "Non-trainable params": get_human_readable_count(total_parameters - trainable_parameters),
            "Total params": get_human_readable_count(total_parameters),
            "Total estimated model params size (MB)": f"{model_size:,.3f}",
            "Modules in train mode": total_training_modes["train"],
            "Modules in eval mode": total_training_modes["eval"],
        }
        console = get_console()
        console.print(table)
        console.print("\n".join(f"[bold]{name}[/]: {value}" for name, value in totals.items()))
