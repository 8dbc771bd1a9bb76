"""Sequence classification on the UEA/UCR archive's default split (issue 27): our classifier, 3 seeds.

    python benchmarks/classification.py                                   # JapaneseVowels, 4 variants x 3 seeds
    python benchmarks/classification.py --datasets JapaneseVowels,OSULeaf --results benchmarks/RESULTS_classification.md
    python benchmarks/classification.py --variants cls-ls0.1 --seeds 0 --epochs 2   # a quick check

Each row is an ordinary `train.run` of `experiment=<set>` (the same config as `python train.py
experiment=japanese_vowels ...`; no logger, outputs under a temporary folder): trained on 80% of the
train file's series, checkpointed and early-stopped on the other 20% (validation log loss, stratified,
seeded), tested on EVERY series of the archive's test file. Variants: `cls` or `mean` pooling x label
smoothing 0.1 or 0 (`ls0.1`, `ls0`). Hyperparameters come from `--set` (Hydra overrides shared by
every row) and are chosen on the validation log loss (the `val log loss` column), never on test.
Beside each row: the two baselines of the task on the same test series (majority class, logistic
regression on per-channel summaries). The MiniRocket / MultiRocket peers are measured separately
(`benchmarks/classification_peers.py`, their own environment).

The table is printed and, with `--results`, written as a markdown file: measured rows only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tsformer.train import compose_config, run

EXPERIMENTS = {
    "JapaneseVowels": "japanese_vowels", "OSULeaf": "osuleaf", "BasicMotions": "basic_motions",
    "GunPoint": "gun_point", "ItalyPowerDemand": "italy_power_demand", "ACSF1": "acsf1",
}  # fmt: skip
# published accuracies on the default split (SOURCE.md of the data folder): the targets of issue 27
TARGETS = {"JapaneseVowels": ("TST (Zerveas et al. 2021)", 0.984), "OSULeaf": ("InceptionTime", 0.921)}
VARIANTS = {
    "cls-ls0.1": ["model.pooling=cls", "model.label_smoothing=0.1"],
    "cls-ls0": ["model.pooling=cls", "model.label_smoothing=0.0"],
    "mean-ls0.1": ["model.pooling=mean", "model.label_smoothing=0.1"],
    "mean-ls0": ["model.pooling=mean", "model.label_smoothing=0.0"],
}
METRICS = ["accuracy", "balanced_accuracy", "macro_f1", "log_loss", "ece"]


def quiet_run(overrides: list[str], epochs: int, patience: int, output_dir: Path):
    """One `train.run` of `overrides` with `epochs` and early-stopping `patience`, no logger, no CSV,
    its outputs in `output_dir`: (RunResult, seconds)."""
    overrides = [
        *overrides,
        f"trainer.max_epochs={epochs}",
        f"callbacks.early_stopping.patience={patience}",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "logger=none",
        "forecasts_file=null",
    ]
    start = time.perf_counter()
    result = run(compose_config(overrides, output_dir))
    return result, time.perf_counter() - start


def scores(result, seconds: float) -> dict:
    """A classification run's row: validation log loss, the test metrics and the baselines' accuracy."""
    m = result.metrics
    return {
        "val_log_loss": result.best_val,
        "seconds": seconds,
        **{k: m[f"test/{k}"] for k in METRICS},
        "baseline_accuracy": m["test/baseline_accuracy"],
        "logistic_accuracy": m["test/logistic_accuracy"],
    }


def one_run(dataset: str, variant: str, seed: int, args) -> dict:
    overrides = [f"experiment={EXPERIMENTS[dataset]}", *VARIANTS[variant], f"seed={seed}", *args.set]
    with tempfile.TemporaryDirectory() as tmp:
        result, seconds = quiet_run(overrides, args.epochs, args.patience, Path(tmp) / "out")
    return {"dataset": dataset, "variant": variant, "seed": seed, **scores(result, seconds)}


def table(rows: list[dict]) -> list[str]:
    """One line per dataset x variant: mean (min..max) over the seeds."""
    lines = [
        (
            "| data set | variant | seeds | test accuracy mean (min..max) | balanced acc. | macro F1 | log loss "
            "| ECE | val log loss | majority acc. | logistic acc. | target | s/run |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["variant"]), []).append(r)
    for (dataset, variant), rs in groups.items():

        def mean(key, rs=rs):
            return statistics.fmean(r[key] for r in rs)

        acc = [r["accuracy"] for r in rs]
        name, target = TARGETS.get(dataset, ("", float("nan")))
        vs = f"{target:.3f} {name} ({mean('accuracy') - target:+.3f})" if name else ""
        lines.append(
            f"| {dataset} | {variant} | {len(rs)} | {mean('accuracy'):.4f} ({min(acc):.4f}..{max(acc):.4f}) | "
            f"{mean('balanced_accuracy'):.4f} | {mean('macro_f1'):.4f} | {mean('log_loss'):.4f} | "
            f"{mean('ece'):.4f} | {mean('val_log_loss'):.4f} | {mean('baseline_accuracy'):.4f} | "
            f"{mean('logistic_accuracy'):.4f} | {vs} | {mean('seconds'):.0f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", default="JapaneseVowels")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--patience", type=int, default=15, help="early stopping on the validation log loss")
    parser.add_argument("--set", nargs="*", default=[], help="Hydra overrides for every row")
    parser.add_argument("--results", help="write the table (markdown) to this file")
    args = parser.parse_args()

    rows = []
    for dataset in args.datasets.split(","):
        for variant in args.variants.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                rows.append(one_run(dataset, variant, seed, args))
                r = rows[-1]
                print(
                    f"{dataset} {variant} seed {seed}: test accuracy {r['accuracy']:.4f}, "
                    f"val log loss {r['val_log_loss']:.4f} ({r['seconds']:.0f} s)",
                    flush=True,
                )
    lines = table(rows)
    header = [
        f"Measured {dt.date.today()} on {platform.processor() or platform.machine()} "
        f"({torch.get_num_threads()} threads), torch {torch.__version__}: "
        f"`python benchmarks/classification.py --datasets {args.datasets} --variants {args.variants} "
        f"--seeds {args.seeds} --epochs {args.epochs} --patience {args.patience}"
        + (f" --set {' '.join(args.set)}" if args.set else "")
        + "`",
        "",
    ]
    print("\n".join(["", *header, *lines]))
    if args.results:
        Path(args.results).write_text("\n".join(header + lines) + "\n")


if __name__ == "__main__":
    main()
