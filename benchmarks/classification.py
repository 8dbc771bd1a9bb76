"""Sequence classification on the UEA/UCR archive's default split (issues 35, 42): ours beside MiniRocket,
MultiRocket and MiniRocket with a logistic head measured in the same run, 3 seeds, every test series.

    python benchmarks/classification.py --peers-python /tmp/aeon-venv/bin/python --results benchmarks/RESULTS_classification.md
    python benchmarks/classification.py --datasets GunPoint --seeds 0                 # ours only, a quick check
    python benchmarks/classification.py --datasets OSULeaf --set model.augment.shift=0   # another recipe
    python benchmarks/classification.py --datasets ACSF1 --rows acsf1.json              # one set per process,
    python benchmarks/classification.py --merge acsf1.json,others.json --results ...  # then one table

Each of our rows is an ordinary `train.run` of `experiment=<set>` (the same config as `python train.py
experiment=osuleaf seed=0`: the classifier's default recipe, conf/model/enc_only_classifier.yaml, the
same for every set; no logger, outputs in a temporary folder), tested on EVERY series of the archive's
test file. The recipe was chosen on validation series of the training files only
(`benchmarks/classification_recipe.py`); `--set` adds Hydra overrides to every row.

Peers: with `--peers-python` (a Python with aeon 1.6, which cannot share the project's environment:
`python3 -m venv /tmp/aeon-venv && /tmp/aeon-venv/bin/pip install "aeon==1.6.*"`),
`benchmarks/classification_peers.py` runs in that environment in the same invocation, on the same
splits and seeds, with the same threads (OMP_NUM_THREADS / NUMBA_NUM_THREADS are passed on).

Times (wall seconds, this machine, shared): ours `fit` is the whole `train.run` (data, fit, the
calibration's cross-fitted networks, test, outputs: an upper bound of the fit alone), `predict` is
`Classifier.load(model folder).predict(test table)` (scaling included); the peers' are their pipeline's
`fit` and `predict`. The table gives ours as multiples of MiniRocket's (ours / MiniRocket's, mean over
seeds).

Probabilities (issue 42): our log loss and ECE (15 bins) are those of the calibrated probabilities the
model folder gives (`uncalibrated`: T = 1, beside), the majority class's are the training class shares,
MiniRocket-logistic's its logistic head's (classification_peers.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from tsformer.data.sequences import archive_file
from tsformer.jobs.classification.classifier import Classifier
from tsformer.train import compose_config, run

HERE = Path(__file__).resolve().parent
EXPERIMENTS = {
    "JapaneseVowels": "japanese_vowels", "OSULeaf": "osuleaf", "BasicMotions": "basic_motions",
    "GunPoint": "gun_point", "ItalyPowerDemand": "italy_power_demand", "ACSF1": "acsf1",
}  # fmt: skip
# issue 42's targets (mean of 3 seeds): MiniRocket measured in the same run, less 0.01; OSULeaf at least
# this too
TARGETS = {"OSULeaf": 0.95}
SLACK = 0.01
PEERS = ("aeon-MiniRocket", "aeon-MultiRocket", "aeon-MiniRocket-logistic")


def quiet_run(overrides: list[str], output_dir: Path):
    """One `train.run` of `overrides`, no logger, no CSV, its outputs in `output_dir`: (RunResult, seconds)."""
    overrides = [
        *overrides,
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "logger=none",
        "forecasts_file=null",
    ]
    start = time.perf_counter()
    result = run(compose_config(overrides, output_dir))
    return result, time.perf_counter() - start


def one_run(dataset: str, seed: int, extra: list[str]) -> dict:
    overrides = [f"experiment={EXPERIMENTS[dataset]}", f"seed={seed}", *extra]
    test = pd.read_csv(archive_file(dataset, "TEST"))
    with tempfile.TemporaryDirectory() as tmp:
        result, fit_s = quiet_run(overrides, Path(tmp) / "out")
        model = Classifier.load(result.model_folder)
        start = time.perf_counter()
        frame = model.predict(test)
        predict_s = time.perf_counter() - start
    accuracy = float((frame.y_pred.astype(str) == frame.y_true.astype(str)).mean())
    assert abs(accuracy - result.metrics["test/accuracy"]) < 1e-6  # the folder is the run's model
    m = result.metrics
    return {
        "model": "tsformer", "dataset": dataset, "seed": seed, "accuracy": accuracy,
        "fit_s": fit_s, "predict_s": predict_s, "n_test": len(frame),
        "logistic_accuracy": m["test/logistic_accuracy"], "log_loss": m["test/log_loss"], "ece": m["test/ece"],
        "uncalibrated_log_loss": m["test/uncalibrated_log_loss"], "uncalibrated_ece": m["test/uncalibrated_ece"],
        "temperature": m["calibration/temperature"], "majority_log_loss": m["test/baseline_log_loss"],
        "majority_ece": m["test/baseline_ece"],
    }  # fmt: skip


def peer_rows(python: str, datasets: list[str], seeds: str) -> list[dict]:
    """classification_peers.py's per-seed rows, run by `python` (aeon's environment) in this invocation."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peers.json"
        env = {**os.environ, "NUMBA_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        cmd = [python, str(HERE / "classification_peers.py"), "--datasets", ",".join(datasets)]
        subprocess.run([*cmd, "--seeds", seeds, "--json", str(out)], check=True, env=env)
        return [r for r in json.loads(out.read_text()) if r["model"] in PEERS]


def mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


def table(rows: list[dict]) -> list[str]:
    """One line per data set: ours (mean, min..max), the peers, the target and the gap, the times."""
    lines = [
        (
            "| data set | tsformer mean (min..max) | MiniRocket | MultiRocket | logistic | target | ours - target "
            "| fit time / MiniRocket's | predict time / MiniRocket's | our fit s | our predict s |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        ours = [r for r in rows if r["dataset"] == dataset and r["model"] == "tsformer"]
        mini = [r for r in rows if r["dataset"] == dataset and r["model"] == "aeon-MiniRocket"]
        multi = [r for r in rows if r["dataset"] == dataset and r["model"] == "aeon-MultiRocket"]
        acc = [r["accuracy"] for r in ours]
        peer = {
            name: f"{mean(rs, 'accuracy'):.4f}" if rs else "-"
            for name, rs in (("mini", mini), ("multi", multi))
        }
        target, what = TARGETS.get(dataset), "issue 42"
        if mini and (target is None or mean(mini, "accuracy") - SLACK > target):
            target, what = mean(mini, "accuracy") - SLACK, "MiniRocket - 0.01"
        gap = f"{statistics.fmean(acc) - target:+.4f}" if target is not None else "-"
        goal = f"{target:.4f} ({what})" if target is not None else "-"
        fit = f"{mean(ours, 'fit_s') / mean(mini, 'fit_s'):.0f}x" if mini else "-"
        pred = f"{mean(ours, 'predict_s') / mean(mini, 'predict_s'):.1f}x" if mini else "-"
        lines.append(
            f"| {dataset} | {statistics.fmean(acc):.4f} ({min(acc):.4f}..{max(acc):.4f}) | {peer['mini']} | "
            f"{peer['multi']} | {mean(ours, 'logistic_accuracy'):.4f} | {goal} | {gap} | {fit} | {pred} | "
            f"{mean(ours, 'fit_s'):.0f} | {mean(ours, 'predict_s'):.2f} |"
        )  # fmt: skip
    return lines


def calibration_table(rows: list[dict]) -> list[str]:
    """Log loss and ECE per data set (means over seeds): ours calibrated and not, the majority class's,
    MiniRocket-logistic's; the temperatures."""
    header = (
        "| data set | tsformer log loss | ECE | uncalibrated log loss | uncalibrated ECE | temperatures "
        "| majority log loss | majority ECE | MiniRocket-logistic log loss | its ECE | its accuracy |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        ours = [r for r in rows if r["dataset"] == dataset and r["model"] == "tsformer" and "ece" in r]
        peer = [r for r in rows if r["dataset"] == dataset and r["model"] == "aeon-MiniRocket-logistic"]
        if not ours:
            continue
        temps = ", ".join(f"{r['temperature']:.2f}" for r in ours)
        theirs = (
            f"{mean(peer, 'log_loss'):.4f} | {mean(peer, 'ece'):.4f} | {mean(peer, 'accuracy'):.4f}"
            if peer else "- | - | -"
        )  # fmt: skip
        lines.append(
            f"| {dataset} | {mean(ours, 'log_loss'):.4f} | {mean(ours, 'ece'):.4f} | "
            f"{mean(ours, 'uncalibrated_log_loss'):.4f} | {mean(ours, 'uncalibrated_ece'):.4f} | {temps} | "
            f"{mean(ours, 'majority_log_loss'):.4f} | {mean(ours, 'majority_ece'):.4f} | {theirs} |"
        )
    return lines


def per_seed(rows: list[dict]) -> list[str]:
    lines = [
        "| model | data set | seed | accuracy | log loss | ECE | fit s | predict s | test series |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        probs = f"{r['log_loss']:.4f} | {r['ece']:.4f}" if "ece" in r else "- | -"
        lines.append(
            f"| {r['model']} | {r['dataset']} | {r['seed']} | {r['accuracy']:.4f} | {probs} | {r['fit_s']:.2f} | "
            f"{r['predict_s']:.2f} | {r['n_test']} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", default=",".join(EXPERIMENTS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--set", nargs="*", default=[], help="Hydra overrides for every row of ours")
    parser.add_argument(
        "--peers-python", help="a Python with aeon 1.6: MiniRocket and MultiRocket in this run"
    )
    parser.add_argument("--results", help="write the tables (markdown) to this file")
    parser.add_argument("--rows", help="write the per-seed rows (JSON) to this file")
    parser.add_argument(
        "--merge", help="comma-separated --rows files of earlier invocations: tabulate them, run nothing"
    )
    args = parser.parse_args()
    if args.merge:
        rows = [r for path in args.merge.split(",") for r in json.loads(Path(path).read_text())]
        lines = [*table(rows), "", *calibration_table(rows), "", "Per seed:", "", *per_seed(rows)]
        print("\n".join(lines))
        if args.results:
            Path(args.results).write_text("\n".join(lines) + "\n")
        return
    datasets = args.datasets.split(",")
    unknown = sorted(set(datasets) - set(EXPERIMENTS))
    if unknown:
        parser.error(f"--datasets: unknown {', '.join(unknown)}; choose from {', '.join(EXPERIMENTS)}")

    rows = []
    for dataset in datasets:
        for seed in (int(s) for s in args.seeds.split(",")):
            rows.append(one_run(dataset, seed, args.set))
            if args.rows:  # after every run: an interrupted invocation keeps what it measured
                Path(args.rows).write_text(json.dumps(rows))
            r = rows[-1]
            print(
                f"{dataset} seed {seed}: test accuracy {r['accuracy']:.4f} (fit {r['fit_s']:.0f} s, "
                f"predict {r['predict_s']:.2f} s)",
                flush=True,
            )
    if args.peers_python:
        rows += peer_rows(args.peers_python, datasets, args.seeds)
    command = (
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')} python benchmarks/classification.py "
        f"--datasets {args.datasets} --seeds {args.seeds}"
        + (f" --peers-python {args.peers_python}" if args.peers_python else "")
        + (f" --set {' '.join(args.set)}" if args.set else "")
    )
    header = [
        (
            f"Measured {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC on {platform.machine()} "
            f"({torch.get_num_threads()} torch threads), torch {torch.__version__}, numpy {np.__version__}:"
        ),
        "",
        f"`{command}`",
        "",
    ]
    if args.rows:
        Path(args.rows).write_text(json.dumps(rows))
    lines = [*header, *table(rows), "", *calibration_table(rows), "", "Per seed:", "", *per_seed(rows)]
    print("\n".join(["", *lines]))
    if args.results:
        Path(args.results).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
