"""One process against DDP on CPU processes: test metrics and fit time, measured in one run.

    python benchmarks/ddp.py                      # enc_dec on the plant, 2 epochs, seeds 0 1 2
    python benchmarks/ddp.py --epochs 4 --seeds 0,1,2,3,4 --model dec_only
    python benchmarks/ddp.py --quick              # tiny settings, one seed: checks the script runs

Rows (each an ordinary `python train.py` run in a subprocess, logged to ./mlflow.db, experiment
"ddp-benchmark"):
- `1 process, batch B`: the reference, over the seeds (their spread is the seed-to-seed noise);
- `2 processes, batch B/2 each`: the same optimizer steps as one process (the samplers shard the
  one-process order), so the same test metrics up to float32 sums in another order;
- `2 processes, batch B each`: what `trainer=ddp` alone does: an effective batch of 2B, half the
  optimizer steps per epoch, the same learning-rate schedule over them; compared with the seed spread.

On a machine with fewer cores than processes x threads, DDP is no faster: the fit-time ratios say
what this machine gave, not what GPUs give.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from mlflow import MlflowClient

REPO = Path(__file__).resolve().parents[1]
QUICK = [
    "model.net.d_model=16",
    "model.net.n_heads=2",
    "model.net.n_layers=1",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=2",
    "data.source.n_series=2",
    "data.source.n_steps=800",
]
METRICS = ["test/mse", "test/mae", "test/mae_orig", "val/mse"]


def train(folder: Path, overrides: list[str]) -> tuple[dict[str, float], float]:
    """One `train.py` run from `folder` (its ./mlflow.db): the run's metrics, and the wall time of
    the whole command (start-up, processes launched, fit, test, export)."""
    cmd = [sys.executable, str(REPO / "train.py"), *overrides, f"hydra.run.dir={folder / 'out'}"]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # ./mlflow.db of the folder
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("ddp-benchmark")
    (run,) = client.search_runs([experiment.experiment_id])
    return {k: run.data.metrics[k] for k in METRICS}, wall


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--model", default="enc_dec")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="one process's batch size B")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")][: 1 if args.quick else None]
    common = [
        f"model={args.model}",
        f"trainer.max_epochs={1 if args.quick else args.epochs}",
        "callbacks.early_stopping.patience=1000",  # the same number of epochs in every row
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "logger.mlflow.experiment_name=ddp-benchmark",
        *(QUICK if args.quick else []),
    ]
    B = args.batch
    rows = {
        f"1 process, batch {B}": [f"data.batch_size={B}"],
        f"2 processes, batch {B // 2} each (effective {B})": ["trainer=ddp", f"data.batch_size={B // 2}"],
        f"2 processes, batch {B} each (effective {2 * B})": ["trainer=ddp", f"data.batch_size={B}"],
    }
    results: dict[str, list[tuple[dict, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in rows.items():
            for seed in seeds:
                folder = Path(tmp) / f"{len(results)}-{seed}"
                folder.mkdir()
                results.setdefault(name, []).append(train(folder, [*common, *overrides, f"seed={seed}"]))
                print(f"{name}, seed {seed}: {results[name][-1]}", flush=True)

    print(f"\n{args.model}, {common[1]}, seeds {seeds}; mean ± sd over seeds,", end=" ")
    print("wall s per run (start-up and test included)\n")
    print("| run | " + " | ".join(METRICS) + " | wall s |")
    print("|---" * (len(METRICS) + 2) + "|")
    for name, runs in results.items():
        cells = []
        for key in METRICS:
            values = np.array([m[key] for m, _ in runs])
            cells.append(
                f"{values.mean():.4f} ± {values.std(ddof=1):.4f}" if len(values) > 1 else f"{values[0]:.4f}"
            )
        walls = np.array([w for _, w in runs])
        print(f"| {name} | " + " | ".join(cells) + f" | {walls.mean():.0f} |")

    reference, sharded, doubled = (results[name] for name in rows)
    print("\nper seed, relative difference of test/mse against 1 process:")
    for i, seed in enumerate(seeds):
        ref = reference[i][0]["test/mse"]
        print(
            f"  seed {seed}: batch {B // 2} x 2: {abs(sharded[i][0]['test/mse'] - ref) / ref:.2e}; "
            f"batch {B} x 2: {abs(doubled[i][0]['test/mse'] - ref) / ref:.2e}"
        )
    if len(seeds) > 1:
        spread = np.array([m["test/mse"] for m, _ in reference])
        print(f"  seed-to-seed sd / mean of 1 process: {spread.std(ddof=1) / spread.mean():.2e}")
    ratio = np.mean([w for _, w in sharded]) / np.mean([w for _, w in reference])
    print(f"wall time, 2 processes (batch {B // 2} each) / 1 process: {ratio:.2f}x")


if __name__ == "__main__":
    main()
