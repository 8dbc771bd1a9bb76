"""The fleet on Spark against predict.py in one process: a simulated fleet scored both ways, in one run.

    OMP_NUM_THREADS=1 python benchmarks/fleet.py                          # 1,000 / 3,000 / 10,000 series x 1,000 rows
    OMP_NUM_THREADS=1 python benchmarks/fleet.py --series 100 300 --steps 200   # a quick run

A forecaster (the default `model=enc_dec`: 30 steps of history, 70 ahead; trained for a few steps,
since its speed does not depend on its weights) forecasts every series of a simulated plant fleet
(`simulate_plant`, seed 1; each series' last 70 rows hold the known inputs only). For each fleet size,
in fresh processes, from the same Parquet file:
- `tsformer.serving.fleet.score_fleet` on `local[2]` (Spark's defaults otherwise); its time (the session
  started before), and the peak resident memory of the driver's Python process, of the JVM (the
  driver and, in local mode, the executor) and of the largest Python worker (an executor's process
  that answers series);
- `tsformer-predict` (predict.py) in one process: its time from start to the CSV written, its peak.
Rows/s counts the input rows. The answers' row counts are checked equal. Compare the ratios: the
machine is shared, so absolute times mean little.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HORIZON = 70  # the default enc_dec's


def peak_mb(pid: int | str = "self") -> float:
    """The peak resident memory (VmHWM) of a live process, MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def train_model(folder: Path) -> Path:
    from tsformer.train import compose_config, run

    overrides = [
        "model=enc_dec",
        "logger=none",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=20",
        "trainer.limit_val_batches=2",
        "trainer.enable_progress_bar=false",
        "forecasts_file=null",
        "n_plot_windows=1",
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        return run(compose_config(overrides, folder / "run")).model_folder


def write_fleets(folder: Path, sizes: list[int], steps: int) -> dict[int, Path]:
    """One Parquet file per fleet size: the first N series of one simulated fleet."""
    import numpy as np

    from tsformer.data import simulate_plant

    table = simulate_plant(n_series=max(sizes), n_steps=steps, freq="1min", seed=1)
    future = table.groupby("series_id").cumcount(ascending=False) < HORIZON
    table.loc[future, ["dynamic_temperature", "dynamic_pressure"]] = np.nan
    files = {}
    for n in sizes:
        files[n] = folder / f"fleet_{n}.parquet"
        table[table["series_id"] < n].to_parquet(files[n], index=False)
    return files


def child_fleet(model: str, data: str, output: str) -> dict:
    """In a fresh process: the session started, then the fleet timed; the processes' peaks."""
    import psutil

    from tsformer.serving.fleet import score_fleet
    from tsformer.serving.spark import spark_session

    started = time.perf_counter()
    spark = spark_session("local[2]", {"spark.ui.enabled": "false"})
    session_s = time.perf_counter() - started
    started = time.perf_counter()
    result = score_fleet(spark, model, data, output)
    seconds = time.perf_counter() - started
    jvm = next(p for p in psutil.Process().children() if "java" in p.name())
    workers = [p for p in jvm.children(recursive=True) if "python" in p.name()]  # the daemon and its forks
    out = {
        "seconds": seconds,
        "session_s": session_s,
        "rows_out": result.n_rows,
        "driver_mb": peak_mb(),
        "jvm_mb": peak_mb(jvm.pid),
        "worker_mb": max(peak_mb(p.pid) for p in workers),
        "n_workers": len(workers),
    }
    spark.stop()
    return out


def child_predict(model: str, data: str, output: str) -> dict:
    """In a fresh process: predict.py from its start (imports included) to its CSV written."""
    started = time.perf_counter()
    from tsformer.predict import main

    with contextlib.redirect_stdout(io.StringIO()):
        assert main([model, data, "--output", output]) == 0
    seconds = time.perf_counter() - started
    with open(output) as f:
        rows_out = sum(1 for _ in f) - 1
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across execve, so a child would report its parent's peak
    return {"seconds": seconds, "rows_out": rows_out, "peak_mb": peak_mb()}


def in_child(kind: str, model: Path, data: Path, output: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, str(model), str(data), str(output)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--series", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--steps", type=int, default=1000, help="rows per series")
    parser.add_argument(
        "--workdir", help="where the model, data and answers go (default: a temporary folder)"
    )
    parser.add_argument(
        "--child", nargs=4, metavar=("KIND", "MODEL", "DATA", "OUTPUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        kind, *paths = args.child
        print(json.dumps((child_fleet if kind == "fleet" else child_predict)(*paths)))
        return

    import pyspark
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        print(
            f"fleet benchmark: {args.series} series x {args.steps} rows, local[2]; cpus={os.cpu_count()} "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} torch={torch.__version__} "
            f"pyspark={pyspark.__version__}; load average at start {load()}",
            flush=True,
        )
        model = train_model(work)
        files = write_fleets(work, args.series, args.steps)
        rows = []
        for n, data in files.items():
            fleet = in_child("fleet", model, data, work / f"answers_{n}")
            predict = in_child("predict", model, data, work / f"forecasts_{n}.csv")
            assert fleet["rows_out"] == predict["rows_out"], (fleet, predict)
            n_in = n * args.steps
            rows.append((n, n_in, fleet, predict))
            print(
                f"  {n} series done: fleet {fleet['seconds']:.1f} s, predict.py {predict['seconds']:.1f} s",
                flush=True,
            )
    print(f"load average at end {load()}\n")
    print(
        "| series | input rows | fleet s | fleet rows/s | predict.py s | predict.py rows/s | fleet / predict.py "
        "speed | driver peak MB | JVM peak MB | Python worker peak MB | predict.py peak MB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, n_in, f, p in rows:
        print(
            f"| {n:,} | {n_in:,} | {f['seconds']:.1f} | {n_in / f['seconds']:,.0f} | {p['seconds']:.1f} | "
            f"{n_in / p['seconds']:,.0f} | {p['seconds'] / f['seconds']:.2f} | {f['driver_mb']:.0f} | "
            f"{f['jvm_mb']:.0f} | {f['worker_mb']:.0f} | {p['peak_mb']:.0f} |"
        )
    sessions = ", ".join(f"{f['session_s']:.1f}" for _, _, f, _ in rows)
    workers = ", ".join(str(f["n_workers"]) for _, _, f, _ in rows)
    print(
        f"\nSpark session start (not in the fleet's time): {sessions} s; Python processes under the JVM: {workers}"
    )


if __name__ == "__main__":
    main()
