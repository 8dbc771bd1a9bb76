"""Interrupted runs: a clean stop on SIGTERM, and `resume=` to continue a run where it stopped.

Every checkpoint (`last.ckpt` is written at the end of every epoch) holds Lightning's state (weights,
optimizer, LR schedule, early stopping, best checkpoint so far, loop and logging step counters)
and a `tsformer` entry written by `ResumeState`:
- `config`: the run's resolved config: a resumed run is the same run, whatever the command line says;
- `run_id`: its MLflow run, which the resumed run goes on logging into;
- `rng`: the torch, numpy and python random states, put back when the next epoch starts, so that
  dropout draws what it would have drawn. The shuffle order depends on (seed, epoch) only
  (`data.datamodule.EpochShuffle`). Together: a resumed run ends as an uninterrupted one would.

`resume=` names the run by its MLflow run id (the run's tag `checkpoint_dir`, set when it starts,
says where its last.ckpt is: this works after SIGKILL, when nothing was logged at the end), by its
output folder (`<folder>/checkpoints/last.ckpt`), or by a checkpoint file.
"""

from __future__ import annotations

import random
import re
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from omegaconf import DictConfig, OmegaConf

from tsformer import tracking
from tsformer.settings import SettingError

CHECKPOINT_KEY = "tsformer"
LAST = ModelCheckpoint.CHECKPOINT_NAME_LAST + ModelCheckpoint.FILE_EXTENSION  # last.ckpt
RUN_ID = re.compile(r"[0-9a-f]{32}")  # MLflow's run ids


# -- what a checkpoint carries ---------------------------------------------------------------------


def rng_states() -> dict:
    """The global random states, as types `torch.load(weights_only=True)` accepts (no numpy arrays)."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [name, key.tolist(), int(pos), int(has_gauss), float(gauss)],
        "python": random.getstate(),
    }


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    name, key, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, np.array(key, dtype=np.uint32), pos, has_gauss, gauss))
    random.setstate(states["python"])


class ResumeState(Callback):
    """Writes the `tsformer` entry of every checkpoint; in a resumed run, puts the random states back."""

    def __init__(self, config: dict):
        self.config = config  # the run's resolved config, plain containers
        self._rng: dict | None = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        mlflow_logger = tracking.find_mlflow_logger(trainer.loggers)
        checkpoint[CHECKPOINT_KEY] = {
            "config": self.config,
            "run_id": mlflow_logger.run_id if mlflow_logger is not None else None,
            "rng": rng_states(),
        }

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self._rng = checkpoint.get(CHECKPOINT_KEY, {}).get("rng")

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        # Here, not at load time: the saved states are those this point had in the run that never
        # stopped, whatever the resumed run draws before it (Lightning isolates its sanity check's
        # draws today; a callback or a change there would otherwise shift dropout silently).
        if self._rng is not None:
            set_rng_states(self._rng)
            self._rng = None


# -- resume=<run id | output folder | checkpoint> --------------------------------------------------


@dataclass
class Resume:
    """What `resume=` names."""

    checkpoint: Path
    config: DictConfig  # the original run's resolved config (its `resume` is null)
    run_id: str | None  # its MLflow run; None when it ran without MLflow
    epoch: int  # the epoch (from 0, as Lightning counts) at whose end the checkpoint was written


def resolve(cfg: DictConfig) -> Resume:
    """The checkpoint and the config to continue the run that `cfg.resume` names."""
    target = str(cfg.resume)
    _refuse_other_overrides(target)
    checkpoint = _find_checkpoint(target, cfg)
    try:  # mmap: only the few small entries read here come from the disk
        state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:
        raise SettingError(f"resume={target}: cannot read {checkpoint} as a checkpoint: {err}") from err
    entry = state.get(CHECKPOINT_KEY)
    if entry is None:
        raise SettingError(
            f"resume={target}: the checkpoint {checkpoint} has no '{CHECKPOINT_KEY}' entry, so the config "
            "of its run is unknown (it was not written by tsformer's train.py, or by an older version)"
        )
    if RUN_ID.fullmatch(target) and entry["run_id"] != target:
        raise SettingError(
            f"resume={target}: {checkpoint} belongs to MLflow run {entry['run_id']}, not to {target} "
            "(another run wrote into the same folder); pass the path of a checkpoint of this run"
        )
    config = OmegaConf.create(entry["config"])
    if entry["run_id"] is not None:
        _refuse_finished(target, entry["run_id"], _tracking_uri(config))
    return Resume(checkpoint, config, entry["run_id"], int(state["epoch"]))


def _refuse_other_overrides(target: str) -> None:
    """A resumed run is the original run: its config is the one it started with, whole."""
    if not HydraConfig.initialized():  # `run` called with a config not composed by Hydra
        return
    others = [o for o in HydraConfig.get().overrides.task if o.split("=", 1)[0].lstrip("+~") != "resume"]
    if others:
        raise SettingError(
            f"resume={target} continues a run with the config it started with; the command line also sets "
            f"{others}: drop them (hydra.* settings may stay), or start a new run to change settings"
        )


def _tracking_uri(cfg: DictConfig) -> str | None:
    """The MLflow logger's tracking URI (the same choice of logger entry as train.py's)."""
    for entry in (cfg.get("logger") or {}).values():
        if isinstance(entry, DictConfig) and "tracking_uri" in entry:
            return tracking.absolute_sqlite_uri(entry.tracking_uri)
    return None


def _find_checkpoint(target: str, cfg: DictConfig) -> Path:
    path = Path(target)
    if path.is_file():
        return path
    if path.is_dir():
        checkpoint = path / "checkpoints" / LAST
        if not checkpoint.is_file():
            raise FileNotFoundError(
                f"resume={target}: the folder has no checkpoints/{LAST} (a run writes it at the end of its "
                "first epoch; a run stopped before has nothing to resume: start it again)"
            )
        return checkpoint
    if not RUN_ID.fullmatch(target):
        raise FileNotFoundError(
            f"resume={target}: no such checkpoint file or run folder, "
            "and not an MLflow run id (32 hex digits)"
        )
    uri = _tracking_uri(cfg)
    try:
        run = MlflowClient(uri).get_run(target)
    except MlflowException as err:
        raise SettingError(
            f"resume={target}: no such MLflow run in {uri} (run from the folder the run was started in, "
            "or set MLFLOW_TRACKING_URI)"
        ) from err
    folder = run.data.tags.get("checkpoint_dir")
    if folder is None:
        raise SettingError(
            f"resume={target}: the run has no 'checkpoint_dir' tag (it ran without checkpoints, or before "
            "resume support); pass the path of its last.ckpt instead"
        )
    checkpoint = Path(folder) / LAST
    if not checkpoint.is_file():
        raise FileNotFoundError(
            f"resume={target}: {checkpoint} does not exist (the run stopped before the end of its first "
            "epoch, or its folder moved: then pass the checkpoint's new path)"
        )
    return checkpoint


def _refuse_finished(target: str, run_id: str, uri: str | None) -> None:
    # Lightning marks the run FINISHED when fit ends: only the test metrics say the whole run did
    run = MlflowClient(uri).get_run(run_id)
    if run.info.status == "FINISHED" and "test/mse" in run.data.metrics:
        raise SettingError(
            f"resume={target}: MLflow run {run_id} has finished (test metrics logged): nothing to resume"
        )


# -- stopping a run: SIGTERM, Ctrl+C ---------------------------------------------------------------


class Terminated(SystemExit):
    """The run was stopped by SIGTERM; the process exits with 128 + SIGTERM, as if killed by it."""

    def __init__(self):
        super().__init__(128 + signal.SIGTERM)


def stopped_on_request(err: BaseException) -> bool:
    """True when the run was stopped, not broken: SIGTERM, or Ctrl+C (KILLED in MLflow, as MLflow's
    own `start_run` marks a KeyboardInterrupt). Lightning turns a Ctrl+C in fit or test into
    `sys.exit(1)` raised while it handles the KeyboardInterrupt, which is then the exit's context."""
    if isinstance(err, (Terminated, SIGTERMException, KeyboardInterrupt)):
        return True
    return isinstance(err, SystemExit) and isinstance(err.__context__, KeyboardInterrupt)


@contextmanager
def stop_on_sigterm():
    """SIGTERM (`kill`, a job scheduler) ends the run with `Terminated`, at a safe point.

    While Lightning fits or tests, its own handler (which calls this one too) sets a flag and stops
    at the end of the current batch: a checkpoint being written is finished first. Elsewhere (data
    setup, export, MLflow uploads) there is no loop to wait for: this handler raises at once.
    """

    def handler(signum, frame):
        if signal.getsignal(signal.SIGTERM) is handler:  # no Trainer running: stop now
            raise Terminated()

    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except SIGTERMException as err:  # Lightning's: a SystemExit without a code (exit status 0)
        raise Terminated() from err
    finally:
        signal.signal(signal.SIGTERM, previous)
