"""Reproducibility and interrupted runs: same seed -> same results; a run killed (SIGKILL), stopped
(SIGTERM, Ctrl+C) or broken (NaN loss) ends in a clear MLflow status, and `resume=` continues it into the
same MLflow run with the test metrics and per-epoch history of a run that never stopped.

The interrupted runs stop themselves (`stop_callback.StopOnce`) at the second batch of epoch 1, after
epoch 0's last.ckpt: deterministic, unlike killing after a delay. Dropout is on, so the random
state after resume matters, not only the weights.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from mlflow import MlflowClient

from conftest import REPO, TINY
from tsformer.resume import Terminated, stop_on_sigterm
from tsformer.tasks.forecasting import EncoderDecoderForecaster
from tsformer.train import compose_config, run

RUN = [*TINY, "trainer.max_epochs=3", "model.net.dropout=0.1"]
PER_EPOCH = ["train/loss", "val/loss", "val/mse", "val/mae", "lr-AdamW"]


def train_py(cwd, overrides):
    path = [str(REPO / "src"), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]  # tests/: StopOnce
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    cmd = [sys.executable, str(REPO / "train.py"), *overrides]

    def ctrl_c_as_at_a_terminal():  # a shell's background job (CI) starts with SIGINT ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # then Python turns it into KeyboardInterrupt

    return subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )


def stop_at_epoch_1(sig, folder) -> list[str]:
    """Overrides: the run sends itself `sig` at the second batch of epoch 1 (once), output in folder/out."""
    return [
        *RUN,
        "+callbacks.stop._target_=stop_callback.StopOnce",
        "+callbacks.stop.epoch=1",
        f"+callbacks.stop.signal={int(sig)}",
        f"+callbacks.stop.marker={folder / 'stopped'}",
        "hydra.run.dir=out",
    ]


def client_in(folder) -> MlflowClient:
    return MlflowClient(f"sqlite:///{folder}/mlflow.db")


def all_runs(client):
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def history(client, run_id) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of every entry of the per-epoch metrics, in logging order."""
    return {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)] for key in PER_EPOCH}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The run that never stopped: its test metrics and per-epoch history."""
    folder = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        result = run(compose_config(RUN, folder / "out"))
    assert len(history(client_in(folder), result.run_id)["val/mse"]) == 3
    return {"metrics": result.metrics, "history": history(client_in(folder), result.run_id), "folder": folder}


def assert_same_as_reference(client, run_id, reference):
    finished = client.get_run(run_id)
    assert finished.info.status == "FINISHED"
    for key, value in reference["metrics"].items():
        assert finished.data.metrics[key] == value, key  # exact: same weights, same windows
    # every epoch once, at the steps and with the values of the run that never stopped
    assert history(client, run_id) == reference["history"]


@pytest.mark.slow
def test_same_seed_same_results(in_tmp, reference):
    result = run(compose_config(RUN, in_tmp / "out"))
    assert result.metrics == reference["metrics"]
    assert history(client_in(in_tmp), result.run_id) == reference["history"]


@pytest.mark.slow
def test_sigkill_then_resume_by_checkpoint_path(in_tmp, reference):
    """A killed run resumed by its last.ckpt's path (the run id is resumed after Ctrl+C below, the output
    folder after SIGTERM: each form finds the checkpoint and the run the same way whatever stopped it)."""
    proc = train_py(in_tmp, stop_at_epoch_1(signal.SIGKILL, in_tmp))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    client = client_in(in_tmp)
    (killed,) = all_runs(client)
    assert killed.info.status == "RUNNING"  # nothing runs after SIGKILL
    last = in_tmp / "out" / "checkpoints" / "last.ckpt"
    assert last.exists()
    (data,) = killed.inputs.dataset_inputs  # its data, recorded when it started

    result = run(compose_config([f"resume={last}"], in_tmp / "resume_log"))  # as train.py resume=<path>
    assert result.run_id == killed.info.run_id
    assert result.metrics == reference["metrics"]
    (resumed,) = all_runs(client)  # the same run, no new one
    assert resumed.info.run_id == killed.info.run_id
    assert_same_as_reference(client, resumed.info.run_id, reference)
    (kept,) = resumed.inputs.dataset_inputs  # kept, not recorded twice
    assert (kept.dataset.name, kept.dataset.digest, kept.tags[0].value) == (
        "plant",
        data.dataset.digest,
        "training",
    )
    # the outputs go where the original run's are
    assert (in_tmp / "out" / "forecasts.csv").exists()
    assert not (in_tmp / "resume_log" / "forecasts.csv").exists()
    artifacts = {a.path for a in client.list_artifacts(resumed.info.run_id, "checkpoints")}
    assert "checkpoints/best.ckpt" in artifacts


@pytest.mark.slow
def test_sigterm_marks_the_run_killed_and_it_resumes(in_tmp, reference):
    proc = train_py(in_tmp, stop_at_epoch_1(signal.SIGTERM, in_tmp))
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]  # as a process killed by SIGTERM
    (stopped,) = all_runs(client_in(in_tmp))
    assert stopped.info.status == "KILLED"
    last = in_tmp / "out" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["epoch"] == 0  # epoch 0's, whole

    result = run(compose_config([f"resume={in_tmp / 'out'}"], in_tmp / "resume_log"))  # by output folder
    assert result.run_id == stopped.info.run_id
    assert_same_as_reference(client_in(in_tmp), result.run_id, reference)


@pytest.mark.slow
def test_ctrl_c_marks_the_run_killed_and_it_resumes(in_tmp, reference):
    proc = train_py(in_tmp, stop_at_epoch_1(signal.SIGINT, in_tmp))
    assert proc.returncode == 1, proc.stderr[-3000:]  # Lightning's exit after a KeyboardInterrupt
    assert "KeyboardInterrupt" in proc.stderr
    (stopped,) = all_runs(client_in(in_tmp))
    assert stopped.info.status == "KILLED"  # stopped by its user, as MLflow's start_run marks it

    result = run(compose_config([f"resume={stopped.info.run_id}"], in_tmp / "resume_log"))
    assert result.run_id == stopped.info.run_id
    assert_same_as_reference(client_in(in_tmp), result.run_id, reference)


@pytest.mark.slow
def test_resume_refuses_other_settings_and_finished_runs(in_tmp, reference):
    last = reference["folder"] / "out" / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match=r"resume=.*also sets \['trainer.max_epochs=5'\]"):
        run(compose_config([f"resume={last}", "trainer.max_epochs=5"], in_tmp / "x"))
    with pytest.raises(ValueError, match="has finished"):
        run(compose_config([f"resume={last}"], in_tmp / "x"))
    with pytest.raises(FileNotFoundError, match="resume=nowhere: no such checkpoint file or run folder"):
        run(compose_config(["resume=nowhere"], in_tmp / "x"))
    with pytest.raises(ValueError, match="resume=0123456789abcdef0123456789abcdef: no such MLflow run"):
        run(compose_config(["resume=0123456789abcdef0123456789abcdef"], in_tmp / "x"))


@pytest.mark.slow
def test_nan_loss_names_the_step_and_fails_the_run(in_tmp, monkeypatch):
    training_loss = EncoderDecoderForecaster.training_loss

    def nan_from_step_2(self, batch):
        loss = training_loss(self, batch)
        return loss * float("nan") if self.training and self.global_step >= 2 else loss

    monkeypatch.setattr(EncoderDecoderForecaster, "training_loss", nan_from_step_2)
    with pytest.raises(FloatingPointError, match=r"training loss is nan at global step 2 \(epoch 0\)"):
        run(compose_config(TINY, in_tmp / "out"))
    (failed,) = all_runs(client_in(in_tmp))
    assert failed.info.status == "FAILED"


def test_sigterm_outside_the_trainer_stops_at_once():
    """During data setup, export or uploads there is no training loop to stop at: SIGTERM raises now."""
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as stopped, stop_on_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # interrupted long before
    assert stopped.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
