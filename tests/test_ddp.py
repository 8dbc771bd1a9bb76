"""Multi-process training: `python train.py trainer=ddp` on 2 CPU processes (gloo), end to end.

The fit is shared by the processes; the test, the CSV, the model folder and the MLflow run belong to
the global-zero process alone (train.py `_one_process_for_test`). The samplers shard the
one-process order (`EpochShuffle`, `EvalShard`), so 2 processes with batch b / 2 each take the same
optimizer steps as one process with batch b: the test metrics then match a one-process run up to
the order of float32 sums (gradients averaged over the processes instead of summed in one batch).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import lightning as L
import numpy as np
import pandas as pd
import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from mlflow import MlflowClient
from omegaconf import open_dict, read_write

from conftest import REPO, TINY
from tsformer.data.datamodule import EpochShuffle, EvalShard
from tsformer.train import _refuse_ddp_launch_in_a_sweep, compose_config, run

BATCH = 32  # one process's batch; 2 processes take BATCH // 2 each
# float32 sums in another order (DDP's all-reduce of 2 half-batch mean gradients vs one batch mean),
# through 3 AdamW steps: measured relative differences of ~1e-7 in the test metrics; 1e-5 leaves room
# and is far below what another data order or another model gives (differences of 1e-3 and more)
RTOL = 1e-5


# 3 series: 63 val and test windows, an odd count that 2 processes cannot split evenly
SETTINGS = ["model=enc_dec", "data.source.n_series=3", "data.source.n_steps=600", "data.eval_batch_size=64"]


def train(cwd, overrides, launcher=()):
    """`python train.py` (or `<launcher> train.py`) from `cwd`, logging to its ./mlflow.db."""
    cwd.mkdir()
    script = [*(launcher or [sys.executable]), str(REPO / "train.py")]
    cmd = [*script, *TINY, *SETTINGS, *overrides, "hydra.run.dir=out"]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# what train.py's Hydra adds to a run's output folder, beside what the run writes
HYDRA_FILES = [".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "train.log"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The one-process run with batch BATCH, in this process (train.py's `run`; a process of its own
    would add only its imports): its folder, its MLflow database ./mlflow.db there."""
    folder = tmp_path_factory.mktemp("ddp") / "one"
    folder.mkdir()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()):
        mp.chdir(folder)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        run(compose_config([*TINY, *SETTINGS, f"data.batch_size={BATCH}"], folder / "out"))
    return folder


def only_run(folder):
    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "tsformer"]
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def check_like_one_process(ddp, one, tmp_path):
    """One FINISHED MLflow run with the one-process run's metrics; its CSV has every test window once."""
    run, reference = only_run(ddp), only_run(one)  # no other process created a run
    assert run.info.status == "FINISHED"
    assert run.data.params["trainer/strategy"] == "ddp" and run.data.params["trainer/devices"] == "2"
    test_metrics = {k: v for k, v in reference.data.metrics.items() if k.startswith("test/")}
    assert len(test_metrics) > 8
    for name, value in test_metrics.items():
        assert run.data.metrics[name] == pytest.approx(value, rel=RTOL), name
    # validation over both processes, each window once (EvalShard): the one-process value
    assert run.data.metrics["val/mse"] == pytest.approx(reference.data.metrics["val/mse"], rel=RTOL)

    csv = pd.read_csv(ddp / "out" / "forecasts.csv")
    dm = instantiate(compose_config([*TINY, *SETTINGS], tmp_path / "check").data)
    dm.setup()
    assert len(csv) == dm.n_windows("test") * dm.horizon * dm.d_target
    assert not csv.duplicated(["series_id", "origin_time", "step", "variable"]).any()
    expected = pd.read_csv(one / "out" / "forecasts.csv")
    pd.testing.assert_frame_equal(csv.drop(columns="y_pred"), expected.drop(columns="y_pred"))
    scale = expected.y_pred.abs().max()
    np.testing.assert_allclose(csv.y_pred, expected.y_pred, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.slow
def test_two_processes_give_one_run_every_window_once_and_the_one_process_metrics(tmp_path, one_process):
    ddp = tmp_path / "ddp"
    proc = train(ddp, ["trainer=ddp", f"data.batch_size={BATCH // 2}"])  # Lightning starts process 1
    assert "Starting with 2 processes" in proc.stderr + proc.stdout
    check_like_one_process(ddp, one_process, tmp_path)

    # the output folder: what one process writes, and rank 1's log only, which names no MLflow run
    assert files(ddp / "out") == sorted(
        [*files(one_process / "out"), *HYDRA_FILES, "train_ddp_process_1.log"]
    )
    assert "MLflow run id" in (ddp / "out" / "train.log").read_text()
    assert "MLflow run id" not in (ddp / "out" / "train_ddp_process_1.log").read_text()


@pytest.mark.slow
def test_torchrun_starts_the_processes_the_same_run(tmp_path, one_process):
    # both processes start at once: only the first may create the MLflow database
    ddp = tmp_path / "ddp"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    train(ddp, ["trainer=ddp", f"data.batch_size={BATCH // 2}"], launcher=torchrun)
    check_like_one_process(ddp, one_process, tmp_path)


def test_epoch_shuffle_shards_the_one_process_order():
    windows = list(range(103))
    epoch, b = 3, 8
    single = EpochShuffle(windows, seed=7)
    shards = [EpochShuffle(windows, seed=7, num_replicas=2, rank=r) for r in range(2)]
    for sampler in [single, *shards]:
        sampler.set_epoch(epoch)
    order = list(single)
    assert sorted(order) == windows  # one process: each window once per epoch
    assert order == np.random.default_rng([7, epoch]).permutation(len(windows)).tolist()
    parts = [list(s) for s in shards]
    assert len(parts[0]) == len(parts[1]) == len(shards[0]) == 52  # padded to an even share
    assert sorted(parts[0] + parts[1]) == sorted(windows + order[:1])  # the first window repeated
    half = b // 2
    for step in range(len(windows) // b):  # the full batches: together, one process's batch
        together = parts[0][step * half : (step + 1) * half] + parts[1][step * half : (step + 1) * half]
        assert sorted(together) == sorted(order[step * b : (step + 1) * b])


def test_eval_shard_evaluates_every_window_once_in_the_given_order():
    windows = list(range(11))
    order = np.random.default_rng(0).permutation(11)
    shards = [EvalShard(windows, order, num_replicas=3, rank=r) for r in range(3)]
    parts = [list(s) for s in shards]
    assert [len(s) for s in shards] == [len(p) for p in parts] == [4, 4, 3]
    assert sorted(w for part in parts for w in part) == windows
    assert parts[1] == order[1::3].tolist()


def test_testing_on_several_processes_is_refused(tmp_path):
    cfg = compose_config([*TINY, "model=enc_only"], tmp_path)
    dm = instantiate(cfg.data)
    dm.setup()
    sizes = {"d_target": dm.d_target, "d_known": dm.d_known, "d_observed": dm.d_observed}
    task = instantiate(cfg.model, _convert_="all", **sizes)

    class TwoProcesses:  # what on_test_start reads of a DDP trainer
        world_size = 2

    task._trainer = TwoProcesses()
    with pytest.raises(RuntimeError, match="test on one process, not 2"):
        task.on_test_start()


def test_a_sweep_refuses_to_launch_ddp_processes_itself(tmp_path):
    # Lightning's launcher would re-run the whole `-m` command line in every other process
    compose_config(TINY, tmp_path)  # Hydra's config as `python train.py` has it, then as under -m
    ddp = L.Trainer(strategy="ddp", devices=2, accelerator="cpu", logger=False)  # launches at fit only
    _refuse_ddp_launch_in_a_sweep(ddp)  # a single run: fine
    with read_write(HydraConfig.get()), open_dict(HydraConfig.get()):
        HydraConfig.get().mode = RunMode.MULTIRUN
    with pytest.raises(ValueError, match=r"2 processes in a sweep \(-m\): Lightning would start each other"):
        _refuse_ddp_launch_in_a_sweep(ddp)
    _refuse_ddp_launch_in_a_sweep(L.Trainer(devices=1, accelerator="cpu", logger=False))  # one process: fine
