"""MLflow: what a run records besides Lightning's per-epoch metrics.

Lightning's `MLFlowLogger` creates the run and logs the metrics. Here: the resolved config (as
flattened params, by this one path only, and as a YAML artifact since params are truncated), tags
(family, data set, git commit, where the outputs and checkpoints are), figures and files, and the
final status (FINISHED, KILLED or FAILED). A resumed run (`resume.py`) logs into its original run.
These are the steps; `callbacks.MLflowRun` takes them in a training run's order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from tsformer.config import checkout_root

if TYPE_CHECKING:  # Lightning takes seconds to import: `predict.py` checks a server without it
    from lightning.pytorch.loggers import MLFlowLogger

log = logging.getLogger(__name__)

# MLflow's experiment tag for what an experiment is for: model training, not a GenAI app
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"


def absolute_sqlite_uri(uri: str | None) -> str | None:
    """`sqlite:///mlflow.db` -> `sqlite:////abs/path/mlflow.db`, anchored to the current folder now.

    MLflow caches its database connection per URI string: a relative URI used again from another
    folder in the same process would write to the first folder's database.
    """
    prefix = "sqlite:///"
    if uri and uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri.removeprefix(prefix)).resolve())
    return uri


def prepare_sqlite_store(uri: str | None, experiment_name: str | None) -> None:
    """Create the MLflow database of an absolute `sqlite:////...` URI and its experiment, one process at a time.

    MLflow creates the tables of a new database when a process first opens it. Processes that open
    the same new database at once (runs started together: a parallel sweep launcher, two terminals,
    benchmark processes) race through its schema migrations, and all but one fail ("table experiments
    already exists", "Online migration expected to match one row"); those that find no experiment
    of the name at once race creating it. Here both happen under a lock (a file in the temporary
    folder, named after the database): one process creates, the others find. Other URIs (servers,
    which migrate once at their start): nothing to do.

    A new experiment keeps its runs' files and logged models in `mlruns/` beside the database. MLflow's
    default is `./mlruns` of the folder the experiment happened to be created from: a database given by
    its path (`sqlite:////data/mlflow.db`, a test's temporary one) would otherwise scatter them into
    whichever folder a run started in.
    """
    prefix = "sqlite:///"
    if not uri or not uri.startswith(prefix):
        return
    from filelock import FileLock
    from mlflow import MlflowClient
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    database = uri.removeprefix(prefix)
    lock = (
        Path(tempfile.gettempdir())
        / f"tsformer-mlflow-{hashlib.sha256(database.encode()).hexdigest()[:16]}.lock"
    )
    with FileLock(lock):
        client = MlflowClient(uri)  # opening the database creates its tables when there are none
        if experiment_name and client.get_experiment_by_name(experiment_name) is None:
            # MLflow's layout (`mlruns/<experiment id>/`), rooted beside the database
            SqlAlchemyStore(uri, artifact_root(uri)).create_experiment(experiment_name)


def artifact_root(sqlite_uri: str) -> str:
    """Where the experiments of a `sqlite:///` database keep their artifacts (runs' files, logged
    models), each in a folder named by its id: `mlruns/` beside the database."""
    return str(Path(sqlite_uri.removeprefix("sqlite:///")).resolve().parent / "mlruns")


@contextmanager
def restore_env(name: str):
    """Put the environment variable `name` back as it was when the block ends.

    Used for $MLFLOW_TRACKING_URI around a run: Lightning's MLFlowLogger calls
    `mlflow.set_tracking_uri`, which also sets the variable for the rest of the process (and its
    children), so a second run started from another folder in the same process (a script, a test, a
    sweep) would otherwise log into the first run's database.
    """
    before = os.environ.get(name)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextmanager
def tracking_uri_for(uri: str):
    """MLflow's process-wide tracking URI set to `uri` inside the block, and put back after it with
    $MLFLOW_TRACKING_URI: a model fetched in a training (init_from) or a test must not move the
    runs that follow into that database."""
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    with restore_env("MLFLOW_TRACKING_URI"), _use_tracking_uri(uri):
        yield


def find_mlflow_logger(loggers) -> MLFlowLogger | None:
    from lightning.pytorch.loggers import MLFlowLogger

    return next((lg for lg in loggers if isinstance(lg, MLFlowLogger)), None)


def mlflow_logger_entry(cfg: DictConfig) -> tuple[str, DictConfig] | None:
    """(key, entry) of the config's MLflow logger (`logger.mlflow`), or None without one."""
    for key, entry in (cfg.get("logger") or {}).items():
        if isinstance(entry, DictConfig) and "tracking_uri" in entry:
            return key, entry
    return None


# -- a tracking server that does not answer ---------------------------------------------------------

# for the one request made before anything else (see require_reachable): a tracking server answers
# it in well under a second, and a host that does not answer at all costs this much before the stop
REACHABLE_TIMEOUT_S = 5

TRAIN_WITHOUT_SERVER = (
    "start the server, correct the URI, or train without it (logger=csv or logger=none). Nothing was trained."
)


class TrackingServerUnreachable(RuntimeError):
    pass


def require_reachable(uri: str | None, setting: str, what_to_do: str) -> None:
    """Stop at once, naming the URI, the `setting` it came from and `what_to_do`, when the tracking server
    at `uri` does not answer.

    A run (or `predict.py` fetching a model) asks the server once before anything else: otherwise an
    unreachable server is found when the run opens (after data loading), or, with MLflow's default
    retries (7, with backoff: minutes per request), much later. This one request is made without
    retries and with a short timeout; the requests of the real work keep MLflow's retries (the
    user's `MLFLOW_HTTP_REQUEST_*` settings), for hiccups during a long run. Only http(s) URIs are
    checked: a local sqlite database is always there.
    """
    if not uri or uri.split(":", 1)[0].lower() not in ("http", "https"):
        return
    from mlflow import MlflowClient

    with http_retries(0, REACHABLE_TIMEOUT_S):
        try:
            MlflowClient(uri).search_experiments(max_results=1)  # any answer of the tracking API will do
        except Exception as err:
            reason = str(err).strip().splitlines()[0][:500] if str(err).strip() else type(err).__name__
            raise TrackingServerUnreachable(
                f"cannot use the MLflow tracking server at {uri} ({reason}). The URI comes from {setting}: "
                f"{what_to_do}"
            ) from err


@contextmanager
def http_retries(max_retries: int, timeout_s: int):
    """MLflow's HTTP requests made in the block: at most `max_retries` retries (MLflow's default: 7,
    with backoff, about 4 minutes for a server that is down) and `timeout_s` seconds each."""
    with restore_env("MLFLOW_HTTP_REQUEST_MAX_RETRIES"), restore_env("MLFLOW_HTTP_REQUEST_TIMEOUT"):
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(max_retries)
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(timeout_s)
        yield


def require_reachable_servers(cfg: DictConfig) -> None:
    """`require_reachable` for the config's MLflow logger, if it has one."""
    found = mlflow_logger_entry(cfg)
    if found is not None:
        key, entry = found
        setting = f"logger.{key}.tracking_uri (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)"
        require_reachable(entry.tracking_uri, setting, TRAIN_WITHOUT_SERVER)


def git_commit() -> str:
    """The commit of the code that ran (with '-dirty' for uncommitted changes), or 'unknown'."""
    here = checkout_root()
    if here is None:  # an installed package: a repository around its folder is another project's
        return "unknown"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            check=True,
            timeout=5,  # a failed status is not "clean"
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# the characters MLflow allows in a param's name
PARAM_NAME = re.compile(r"^[\w\-. :/]+$")


def param_safe(config):
    """`config` with each mapping that has a key MLflow refuses in a param name (a column name such as
    `LV ActivePower (kW)` in `data.units`) turned into one value, its JSON: Lightning flattens the
    mappings into the params' names."""
    if not isinstance(config, Mapping):
        return config
    if not all(PARAM_NAME.match(str(key)) for key in config):
        return json.dumps(config, ensure_ascii=False, default=str)
    return {key: param_safe(value) for key, value in config.items()}


def start_run(
    logger: MLFlowLogger, config: dict, tags: dict[str, str], system_metrics: dict | None = None
) -> str:
    """Create the run now (so a failure later still has a run to mark), log the resolved `config` and
    `tags`; mark its experiment as one of model training, unless it says already what it is for."""
    client, run_id = logger.experiment, logger.run_id
    if EXPERIMENT_KIND_TAG not in client.get_experiment(logger.experiment_id).tags:
        client.set_experiment_tag(logger.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    logger.log_hyperparams(param_safe(config))  # flattened by Lightning: "model/net/d_model" etc.
    client.log_text(run_id, OmegaConf.to_yaml(config), "config/resolved.yaml")
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    start_system_metrics(logger, system_metrics)
    return run_id


def resume_run(logger: MLFlowLogger, tags: dict[str, str], system_metrics: Mapping | None = None) -> str:
    """Reopen the run a resumed run continues (left RUNNING by SIGKILL, or KILLED, FAILED): RUNNING
    again until it ends. Its params and config were logged when it started; they are not logged
    again (MLflow refuses a param logged twice with different values)."""
    client, run_id = logger.experiment, logger.run_id
    client.update_run(run_id, status="RUNNING")
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    start_system_metrics(logger, system_metrics, resume=True)

    # The resumed run repeats the epoch the run was killed in, from its start: what that epoch had
    # logged already (the learning rate at its start, say) is not logged a second time at the same step.
    keys = client.get_run(run_id).data.metrics
    logged = {(key, m.step) for key in keys for m in client.get_metric_history(run_id, key)}
    log_metrics = logger.log_metrics

    def log_new_metrics(metrics, step=None):
        new = {k: v for k, v in metrics.items() if (k, step or 0) not in logged}
        if new:
            log_metrics(new, step)

    logger.log_metrics = log_new_metrics
    return run_id


def log_files(logger: MLFlowLogger, files: list[tuple[str, Path]]) -> None:
    """files: (artifact folder, local file) pairs."""
    for folder, path in files:
        logger.experiment.log_artifact(logger.run_id, str(path), folder)


def log_figure(logger: MLFlowLogger, fig, artifact_file: str, folder: Path | None = None) -> None:
    """Log `fig` as the run's artifact `artifact_file` (`plots/x.png`), and write it as
    `folder`/`artifact_file` too when given (the run's output folder, beside its CSV)."""
    import matplotlib.pyplot as plt

    # Drawn once, then the file logged: MLflow's own log_figure draws the figure again (a second
    # layout pass, about as long as the first)
    folder_in_artifact = artifact_file.rpartition("/")[0]
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(folder if folder is not None else scratch) / artifact_file
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
        logger.experiment.log_artifact(logger.run_id, str(path), folder_in_artifact or None)
    plt.close(fig)  # logged: no need to keep it (pyplot keeps every open figure alive)


def end_run(logger: MLFlowLogger, status: str) -> None:
    """Never leave a run RUNNING: FINISHED on success, KILLED when stopped (SIGTERM, Ctrl+C), FAILED on any
    error."""
    stop_system_metrics(logger)
    try:
        logger.experiment.set_terminated(logger.run_id, status)
    except Exception as err:  # noqa: BLE001 (the tracking server may be what failed; say so, keep the first error)
        log.warning("could not set the MLflow run status: %s", err)


# -- system metrics ---------------------------------------------------------------------------------

_system_monitors: dict[str, object] = {}  # run id -> the SystemMetricsMonitor logging to it


def start_system_metrics(logger: MLFlowLogger, settings: Mapping | None, resume: bool = False) -> None:
    """MLflow's system metrics (CPU, memory, disk, network, and GPU with nvidia-ml-py) for the run,
    when `system_metrics.enabled` (conf/train.yaml).

    Lightning's MLFlowLogger opens the run through the client, not `mlflow.start_run`, so MLflow's
    own switch (`start_run(log_system_metrics=True)`) never sees it: MLflow's monitor is started
    here on the run id. It stops by itself once the run is no longer RUNNING (Lightning's logger
    marks it FINISHED when fitting ends), at `end_run` at the latest. A background thread samples every
    `sampling_interval` seconds and logs the mean of `samples_before_logging` samples as one step
    (`system/cpu_utilization_percentage`, ...); a resumed run continues its steps.
    """
    if not settings or not settings.get("enabled"):
        return
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(
        logger.run_id,
        sampling_interval=float(settings["sampling_interval"]),
        samples_before_logging=int(settings["samples_before_logging"]),
        resume_logging=resume,
        tracking_uri=logger.experiment.tracking_uri,
    )
    monitor.start()
    _system_monitors[logger.run_id] = monitor


def stop_system_metrics(logger: MLFlowLogger) -> None:
    """Stop the run's monitor and log what it holds (no-op without one)."""
    monitor = _system_monitors.pop(logger.run_id, None)
    if monitor is not None:
        monitor.finish()
