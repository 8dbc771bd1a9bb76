"""Sweeps (`python train.py -m ...`): every trial an MLflow run, nested under one parent run for the sweep.

Hydra runs the sweep: its basic sweeper for grids (`-m model=enc_only,dec_only,enc_dec`),
hydra-optuna-sweeper for `-m hparams_search=optuna`. The Hydra callback `MLflowSweep`
(conf/hydra/default.yaml) records it in MLflow:
- when the sweep starts, it checks the tracking server (one that does not answer stops the sweep
  before its first trial: Hydra would only warn about a callback's exception, so it exits), then
  opens the parent run (`sweep-<sweeper>`, tagged with the sweep folder,
  the command line's overrides, the sweeper's config as an artifact) and writes its id into the sweep
  folder, where each trial finds it (`trial_tags`, read when `callbacks.MLflowRun` opens the trial's
  run).
  `mlflow.parentRunId` is what makes `mlflow ui` show the trials under their sweep;
- after each trial, it logs the value the sweeper received (`sweep/objective`) to the trial's run or,
  for a trial that crashed, the error (tag `error`; the traceback goes to the trial's log). A trial
  that crashed before its run was opened (a setting the model cannot be built with) gets a FAILED run
  of its own, with its overrides as params: every trial of a sweep is in MLflow;
- when the sweep ends, it ends the parent FINISHED with the number of finished and failed trials and,
  for Optuna, the best value and its parameters. A sweep that stops with an error (the basic sweeper
  re-raises a failed job's error once all jobs ran) leaves the parent FAILED.
"""

from __future__ import annotations

import atexit
import logging
import time
import traceback
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from tsformer import tracking

log = logging.getLogger(__name__)

PARENT_RUN_FILE = "mlflow_parent_run_id"  # in the sweep folder: the parent run's id, for the trials
OBJECTIVE = "sweep/objective"  # the trial's metric: the value train.py returned to the sweeper
# (retries, timeout in s) of the sweep's own MLflow requests: a server that went down costs seconds
# per trial, not MLflow's default 4 minutes per request
BOOKKEEPING_RETRIES = (2, 30)


def trial_tags() -> dict[str, str]:
    """Tags for the MLflow run of a sweep's trial (none outside a sweep): the sweep folder, the trial's
    number and overrides, and its parent run when the sweep has one."""
    if not HydraConfig.initialized():
        return {}
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return {}
    sweep_dir = Path(hydra_cfg.sweep.dir).resolve()
    tags = {
        "sweep": str(sweep_dir),
        "sweep_trial": str(hydra_cfg.job.num),
        "sweep_overrides": " ".join(hydra_cfg.overrides.task)[:5000],  # MLflow's limit on a tag's value
    }
    parent = sweep_dir / PARENT_RUN_FILE
    if parent.exists():
        tags["mlflow.parentRunId"] = parent.read_text().strip()
    return tags


class MLflowSweep(Callback):
    """Hydra callback: a parent MLflow run per sweep; each trial's outcome on its run (see module doc)."""

    def __init__(self) -> None:
        self.client = None  # MlflowClient of the sweep's tracking URI; None: the sweep logs no MLflow run
        self.parent_run_id: str | None = None
        self.sweep_dir: Path | None = None
        self.started = 0.0  # time.time() at the start of the sweep
        self.failed_trials: list[int] = []  # job numbers

    # -- the sweep ---------------------------------------------------------------------------------

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        settings = _mlflow_settings(config)
        if settings is None:  # logger=csv, logger=none: nothing to group
            return
        uri, experiment_name, _ = settings
        try:
            tracking.require_reachable_servers(config)  # the check every run makes, once for the sweep
        except tracking.TrackingServerUnreachable as err:
            # Hydra turns a callback's exceptions into warnings and goes on; an exit stops the sweep now
            log.error("%s", err)
            raise SystemExit(1) from err
        with tracking.http_retries(*BOOKKEEPING_RETRIES):
            self._open_parent_run(config, uri, experiment_name)

    def _open_parent_run(self, config: DictConfig, uri: str, experiment_name: str) -> None:
        from mlflow import MlflowClient

        tracking.prepare_sqlite_store(uri, experiment_name)  # another sweep or run may be creating it too
        self.client = MlflowClient(uri)
        self.started = time.time()
        self.sweep_dir = sweep_dir = Path(config.hydra.sweep.dir).resolve()
        (sweep_dir / PARENT_RUN_FILE).unlink(missing_ok=True)  # an earlier sweep's, in the same folder
        sweeper = _sweeper_name(config)
        tags = {
            "sweep": str(sweep_dir),
            "sweeper": sweeper,
            "sweep_overrides": " ".join(config.hydra.overrides.task)[:5000],
            "git_commit": tracking.git_commit(),
        }
        run = self.client.create_run(
            _experiment_id(self.client, experiment_name), run_name=f"sweep-{sweeper}", tags=tags
        )
        self.parent_run_id = run.info.run_id
        self.client.log_text(
            self.parent_run_id, OmegaConf.to_yaml(config.hydra.sweeper), "sweep/sweeper.yaml"
        )
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PARENT_RUN_FILE).write_text(self.parent_run_id + "\n")
        atexit.register(self._end_if_open)  # the sweep raised: Hydra exits without on_multirun_end
        log.info("MLflow parent run of the sweep: %s (tracking URI: %s)", self.parent_run_id, uri)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.parent_run_id is not None:
            atexit.unregister(self._end_if_open)
            with tracking.http_retries(*BOOKKEEPING_RETRIES):
                self._end("FINISHED")

    def _end_if_open(self) -> None:
        """At exit after the sweep raised (Hydra's basic sweeper re-raises a failed job's error once
        all its jobs ran; a sweep stopped by SIGTERM or by too many failures ends early)."""
        if self.parent_run_id is None:
            return
        try:
            failed = ", ".join(map(str, self.failed_trials)) or "none"
            with tracking.http_retries(*BOOKKEEPING_RETRIES):
                self.client.set_tag(
                    self.parent_run_id,
                    "error",
                    f"the sweep ended with an error (failed trials: {failed}; see its log)",
                )
                self._end("FAILED")
        except Exception as err:  # noqa: BLE001 (at exit, with the tracking server perhaps what failed)
            log.warning("could not end the sweep's MLflow run %s: %s", self.parent_run_id, err)

    def _end(self, status: str) -> None:
        try:
            self._summarise()
        finally:
            self.client.set_terminated(self.parent_run_id, status)
            self.parent_run_id = None

    def _summarise(self) -> None:
        """The parent's record of the sweep: trials by status and, for Optuna, the best trial."""
        children = self._children()
        statuses = [run.info.status for run in children]
        self.client.log_metric(self.parent_run_id, "sweep/trials_finished", statuses.count("FINISHED"))
        self.client.log_metric(self.parent_run_id, "sweep/trials_failed", statuses.count("FAILED"))
        results = self.sweep_dir / "optimization_results.yaml"  # written by hydra-optuna-sweeper at its end
        if not results.exists() or results.stat().st_mtime < self.started:  # none, or an earlier sweep's
            return
        self.client.log_artifact(self.parent_run_id, str(results), "sweep")
        best = OmegaConf.load(results)
        if "best_value" not in best:  # a multi-objective study: its Pareto front is in the artifact
            return
        self.client.log_metric(self.parent_run_id, "sweep/best_value", float(best.best_value))
        for name, value in best.best_params.items():
            self.client.set_tag(self.parent_run_id, f"best/{name}", str(value))
        best_runs = [r for r in children if r.data.metrics.get(OBJECTIVE) == float(best.best_value)]
        if best_runs:
            self.client.set_tag(self.parent_run_id, "best_run_id", best_runs[0].info.run_id)

    def _children(self) -> list:
        parent = self.client.get_run(self.parent_run_id)
        return self.client.search_runs(
            [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{self.parent_run_id}'"
        )

    # -- each trial --------------------------------------------------------------------------------

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        num = config.hydra.job.num
        # the trial's error is kept in the JobReturn (`.return_value` would print and raise it)
        error = job_return._return_value if job_return.status == JobStatus.FAILED else None
        value = None if error is not None else job_return.return_value
        if error is not None:  # in the trial's log (train.log in its folder) with its traceback
            log.error("trial %s failed:\n%s", num, _traceback(error))
            self.failed_trials.append(num)
        settings = _mlflow_settings(config)
        if settings is None:
            return
        try:  # bookkeeping: a tracking hiccup here must not stop the sweep (the trial's run has its metrics)
            with tracking.http_retries(*BOOKKEEPING_RETRIES):
                self._record_trial(config, settings, num, job_return, value, error)
        except Exception as err:  # noqa: BLE001 (bookkeeping, see the try)
            log.warning("could not record trial %s of the sweep in MLflow: %s", num, err)

    def _record_trial(self, config, settings, num, job_return: JobReturn, value, error) -> None:
        from mlflow import MlflowClient

        uri, experiment_name, run_name = settings
        client = MlflowClient(uri)
        run_id = _trial_run_id(client, experiment_name, str(Path(config.hydra.sweep.dir).resolve()), num)
        if error is None:
            if run_id is not None and isinstance(value, (int, float)):
                client.log_metric(run_id, OBJECTIVE, float(value))
            return
        if run_id is None:  # crashed before train.py opened its run: one is opened here, FAILED
            run_id = self._failed_trial_run(client, config, experiment_name, run_name, job_return)
        client.set_tag(run_id, "error", f"{type(error).__name__}: {error}"[:5000])

    def _failed_trial_run(self, client, config, experiment_name, run_name, job_return: JobReturn) -> str:
        from mlflow.entities import Param

        choices = config.hydra.runtime.choices
        tags = {**trial_tags(), "git_commit": tracking.git_commit()}  # Hydra still holds the trial's config
        name = run_name or f"{choices.get('model')}-{choices.get('data')}"
        run = client.create_run(_experiment_id(client, experiment_name), run_name=name, tags=tags)
        # the overrides as params, under the names a finished trial's flattened config has (model/net/d_model)
        params = {}
        for override in job_return.overrides or []:
            key, _, value = override.lstrip("+~").partition("=")
            params[key.replace(".", "/")] = value[
                :6000
            ]  # a key given twice: the last value, as Hydra takes it
        if params:
            client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()])
        client.set_terminated(run.info.run_id, "FAILED")
        return run.info.run_id


def _mlflow_settings(config: DictConfig) -> tuple[str, str, str | None] | None:
    """(tracking URI, experiment name, run name) of the config's MLflow logger; None without one."""
    found = tracking.mlflow_logger_entry(config)
    if found is None:
        return None
    _, entry = found
    return tracking.absolute_sqlite_uri(entry.tracking_uri), entry.experiment_name, entry.get("run_name")


def _sweeper_name(config: DictConfig) -> str:
    target = str(config.hydra.sweeper.get("_target_", ""))
    return (
        "optuna"
        if "optuna" in target.lower()
        else "grid"
        if "BasicSweeper" in target
        else target.rsplit(".", 1)[-1]
    )


def _experiment_id(client, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    return experiment.experiment_id if experiment is not None else client.create_experiment(name)


def _trial_run_id(client, experiment_name: str, sweep_dir: str, num: int) -> str | None:
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.sweep = '{sweep_dir}' and tags.sweep_trial = '{num}'",
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def _traceback(err: BaseException) -> str:
    return "".join(traceback.format_exception(type(err), err, err.__traceback__))
