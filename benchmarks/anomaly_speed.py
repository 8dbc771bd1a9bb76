"""Speed of the anomaly detector on a wide table (issue 49, point 6): fit and score of a table of
`--rows` x `--channels` (25,000 x 38: 17 days of 1-minute rows of 38 server sensors, synthetic), beside
IsolationForest and the window memory fitted on the same train rows in the same run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/anomaly_speed.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/anomaly_speed.py --set model.score=hybrid
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/anomaly_speed.py --generic   # and the generic path, same run
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/anomaly_speed.py --scoring stride=4 stride=16,channel_groups=4

The detector is the recipe as benchmarks/anomaly.py trains it (`train.fit_task` on
`experiment=anomaly_benchmark`, `--set` overrides), on the table's first `--train-fraction` rows (their
last 20 % its validation rows). Printed: fit and score seconds and their ratios to IsolationForest's;
where scoring's time goes (the windows cut, the network's passes, the rows' scores from the windows);
windows scored per second, the network passes a window costs and their FLOPs (`torch.utils.flop_counter`
on one window), so the achieved FLOP rate says how much of scoring is the model's work; and the memory of
normal windows built on the train rows (its windows, bytes and time), whatever `model.score` is. The
score's CPU seconds (this process's) are printed beside its wall seconds: on a shared machine the wall
time also counts other jobs' turns.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from anomaly import _quiet_lightning
from imputation import machine

from tsformer.data.anomaly import series_rows
from tsformer.data.window_scores import covering_window_starts
from tsformer.jobs.anomaly.baselines import IsolationForestScore, WindowMemoryScore
from tsformer.train import compose_config, fit_task

SCORING_SETTINGS = ("stride", "channel_groups", "n_masks")  # read at scoring only (`--scoring`)


def server_table(rows: int, channels: int, seed: int = 0) -> pd.DataFrame:
    """`rows` x `channels` of server-like sensors: daily and hourly cycles shared in groups of channels,
    each with its own gain, offset and noise (1-minute rows)."""
    rng = np.random.default_rng(seed)
    t = np.arange(rows)
    daily, hourly = np.sin(2 * np.pi * t / 1440), np.sin(2 * np.pi * t / 60)
    load = np.convolve(rng.normal(size=rows), np.ones(30) / 30, mode="same")  # slow shared load
    gain = rng.uniform(0.5, 2.0, size=(3, channels))
    values = (
        daily[:, None] * gain[0]
        + hourly[:, None] * gain[1] * (rng.random(channels) < 0.5)
        + load[:, None] * gain[2]
    )
    values += rng.uniform(-5, 5, channels) + 0.1 * rng.normal(size=(rows, channels))
    return pd.DataFrame(values, columns=[f"sensor_{c:02d}" for c in range(channels)])


def timed(call, *args):
    start = time.perf_counter()
    out = call(*args)
    return out, time.perf_counter() - start


def window_flops(task, length: int) -> dict[str, int]:
    """FLOPs of one pass of one window through the network: restored with a mask, and embedded."""
    window = torch.zeros(1, length, len(task.channels))
    empty = window[..., :0]
    batch = {"hist_target": window, "hist_known": empty, "hist_observed": empty}
    hidden = torch.zeros_like(window, dtype=torch.bool)
    hidden[:, ::4] = True
    out = {}
    with torch.inference_mode():
        with FlopCounterMode(display=False) as counter:
            task.restore(batch, hidden)
        out["restore"] = counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            task.embed(window)
        out["embed"] = counter.get_total_flops()
    return out


def profile_score(task, table: pd.DataFrame) -> dict[str, float]:
    """Seconds of scoring's steps on `table` (one series): the windows cut, each part's network passes,
    the rows' scores from the windows."""
    values = task.standardised(table)
    starts = covering_window_starts(len(table), task.window_length, task.stride)
    out = {"windows": len(starts)}
    with torch.inference_mode():
        windows, out["cut s"] = timed(task.windows_of, values, starts)
        parts = {}
        if "restoration" in task.parts:
            parts["restoration"], out["restoration passes s"] = timed(task.restoration_contributions, windows)
        if "memory" in task.parts:
            parts["memory"], out["memory passes and search s"] = timed(task.memory_contributions, windows)
        start = time.perf_counter()
        for part in parts.values():
            task.to_rows(part, starts, len(table), False)
        out["windows to rows s"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=25_000)
    parser.add_argument("--channels", type=int, default=38)
    parser.add_argument("--train-fraction", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], help="Hydra overrides of the detector's config")
    parser.add_argument(
        "--generic", action="store_true", help="also score by the generic restoration (before the fast path)"
    )
    parser.add_argument(
        "--scoring", nargs="*", default=[], metavar="NAME=V[,NAME=V]",
        help="also score with each of these scoring settings of the model (stride, channel_groups, n_masks), "
        "same network and run (the time only: the error scales stay the fit's)",
    )  # fmt: skip
    args = parser.parse_args()
    table = server_table(args.rows, args.channels, args.seed)
    train_end = round(args.train_fraction * args.rows)
    print(f"{machine()}, torch threads {torch.get_num_threads()}; a table of {args.rows} x {args.channels}, "
          f"the first {train_end} rows normal; overrides {args.set or 'none'}")  # fmt: skip

    with tempfile.TemporaryDirectory() as folder:
        cfg = compose_config(
            ["experiment=anomaly_benchmark", f"seed={args.seed}", f"data.target_cols=[{','.join(table.columns)}]",
             f"data.train_end={train_end}", "data.name=speed", *args.set], folder)  # fmt: skip
        with _quiet_lightning():
            trained, fit_s = timed(fit_task, cfg, table)
    task = trained.task
    cpu = time.process_time()
    scores, score_s = timed(task.score, table)
    score_cpu = time.process_time() - cpu  # this process's CPU seconds: less swayed by other jobs than wall
    assert len(scores.score) == len(table)

    if args.generic:  # the same model, each pass through `restore_under` whole: the time before the fast path
        task.fast_path = lambda: False
        cpu = time.process_time()
        generic, generic_s = timed(task.score, table)
        generic_cpu = time.process_time() - cpu
        del task.fast_path
        gap = np.abs(generic.score - scores.score).max() / np.abs(generic.score).max()
        print(f"generic restoration (before): score {generic_s:.1f} s ({generic_cpu:.1f} s of CPU); the fast "
              f"path {generic_s / score_s:.2f}x faster (CPU {generic_cpu / score_cpu:.2f}x), scores within "
              f"{gap:.1e} of the largest")  # fmt: skip

    train = table.iloc[:train_end].to_numpy()
    forest, forest_fit = timed(IsolationForestScore(seed=args.seed).fit, train)
    _, forest_score = timed(forest.score, table.to_numpy())
    memory, memory_fit = timed(WindowMemoryScore().fit, train)
    _, memory_score = timed(memory.score, table.to_numpy())

    print(f"ours ({task.hparams.score}): fit {fit_s:.1f} s ({fit_s / forest_fit:.0f}x IsolationForest), score "
          f"{score_s:.1f} s ({score_cpu:.1f} s of CPU; {score_s / forest_score:.0f}x IsolationForest, {score_s / memory_score:.1f}x the "
          f"window memory); fit + score {(fit_s + score_s) / (forest_fit + forest_score):.0f}x IsolationForest")  # fmt: skip
    print(f"isolation_forest: fit {forest_fit:.2f} s, score {forest_score:.2f} s; window_memory: fit "
          f"{memory_fit:.2f} s, score {memory_score:.2f} s")  # fmt: skip

    fitted = {name: task.hparams[name] for name in SCORING_SETTINGS}
    for settings in args.scoring:  # scoring's time with other settings, beside IsolationForest's of this run
        for name, value in (item.split("=") for item in settings.split(",")):
            if name not in SCORING_SETTINGS:
                parser.error(f"--scoring {settings}: {name} is not one of {', '.join(SCORING_SETTINGS)}")
            task.hparams[name] = int(value)
        cpu = time.process_time()
        _, other_s = timed(task.score, table)
        windows = len(covering_window_starts(len(table), task.window_length, task.stride))
        passes = sum(len(kind) for kind in task.scoring_masks())
        print(f"  {settings}: {windows} windows x {passes} passes, score {other_s:.1f} s ({time.process_time() - cpu:.1f} "
              f"s of CPU; {other_s / forest_score:.0f}x IsolationForest, {score_s / other_s:.2f}x faster than the "
              f"fit's {fitted})")  # fmt: skip
        task.hparams.update(fitted)

    steps = profile_score(task, table)
    n_windows = steps.pop("windows")
    passes = sum(len(kind) for kind in task.scoring_masks()) if "restoration" in task.parts else 0
    flops = window_flops(task, task.window_length)
    work = n_windows * (passes * flops["restore"] + ("memory" in task.parts) * flops["embed"])
    network_s = sum(v for k, v in steps.items() if "passes" in k)
    print(f"scoring: {n_windows} windows (stride {task.stride}), {passes} restoration passes a window"
          f"{' + 1 embedding' if 'memory' in task.parts else ''}; {n_windows / score_s:.0f} windows/s; one whole "
          f"pass of one window {flops['restore'] / 1e6:.2f} MFLOP (the fast path does less), in all at most "
          f"{work / 1e9:.1f} GFLOP, "
          f"{work / 1e9 / max(network_s, 1e-9):.1f} GFLOP/s in the network's passes")  # fmt: skip
    print("  where the time goes (a second scoring, step by step): " + ", ".join(f"{k} {v:.2f}" for k, v in steps.items())
          + f"; the network's passes {network_s / sum(steps.values()):.0%} of it")  # fmt: skip

    normal = table.iloc[:train_end]
    if len(task.memory.keys) == 0:  # the recipe keeps no memory: build one as score=memory would
        _, build_s = timed(task.build_memory, [normal])
    else:
        build_s = float("nan")
    size = sum(b.numel() * b.element_size() for b in task.memory.buffers())
    rows = sum(len(r) for r in series_rows(normal).values())
    print(f"memory of normal windows on {rows} train rows: {len(task.memory.keys)} windows kept "
          f"(memory_size {task.hparams.memory_size}), {size / 1e6:.1f} MB, built in {build_s:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
