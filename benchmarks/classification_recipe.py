"""Choose the classifier's default recipe on VALIDATION series only (issues 35, 42): candidates x data sets
x seeds.

    python benchmarks/classification_recipe.py --datasets OSULeaf,GunPoint --candidates conv,conv-shift
    python benchmarks/classification_recipe.py --candidates conv-shift,multiscale-shift --seeds 0,1,2 \
        --steps 4000 --rows recipe.json
    python benchmarks/classification_recipe.py --merge a.json,b.json     # tabulate earlier rows
    python benchmarks/classification_recipe.py --list

Each candidate is a list of Hydra overrides on top of `experiment=<set>`. A run trains on 80 % of the
archive's TRAIN file (stratified, seeded) for a fixed budget of `--steps` optimiser steps (or `--epochs`
epochs, the issue-35 protocol) and keeps the last weights (`callbacks=last_weights`: no early stopping, no
best checkpoint, as the recipe's final runs on every series); its model folder then classifies the other
20 %, the validation series, read back from the TRAIN file: validation accuracy and log loss are what this
script prints. The archive's TEST file is never read to choose (train.run scores it, and this script drops
that figure). The table ends with each candidate's mean over the sets it ran on (each set's mean over
its seeds first), the figures the rule in RESULTS_classification.md reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from classification import EXPERIMENTS

from tsformer.data.sequences import SequenceDataModule, archive_file
from tsformer.jobs.classification.classifier import Classifier
from tsformer.train import compose_config, run

# what every candidate shares, unless it says otherwise (the archive experiments' own augmentation reset)
COMMON = {
    "model.patch_len": "null", "model.patch_stride": "null", "model.net.embedding": "conv",
    "model.net.dropout": 0, "model.pooling": "mean", "model.net.d_model": 64, "model.net.n_layers": 1,
    "model.net.conv_stride": 4, "model.net.positional": "none", "model.augment.shift": 0.0,
}  # fmt: skip


def candidate(**changes) -> list[str]:
    """Hydra overrides: COMMON with `changes` (keys with `__` for dots)."""
    settings = COMMON | {k.replace("__", "."): v for k, v in changes.items()}
    return [f"{k}={v}" for k, v in settings.items()]


CANDIDATES = {
    "linear-sin": candidate(model__net__embedding="linear", model__net__positional="sinusoidal"),
    "conv": candidate(),
    "conv-rope": candidate(model__net__positional="rope"),
    "conv-sin": candidate(model__net__positional="sinusoidal"),
    "conv-s2": candidate(model__net__conv_stride=2),
    "conv-2layers": candidate(model__net__n_layers=2),
    "conv-shift": candidate(model__augment__shift=0.2),
    "conv-cshift": candidate(model__augment__shift=0.5, model__augment__circular="true"),
    "conv-jitter-scale": candidate(model__augment__jitter=0.03, model__augment__scaling=0.1),
    "conv-warp": candidate(model__augment__window_warp=0.1),
    "conv-mixup": candidate(model__augment__mixup=0.2),
    "conv-ls": candidate(model__label_smoothing=0.1),
    "conv-rope-shift": candidate(model__net__positional="rope", model__augment__shift=0.2),
    "conv-shift-mixup": candidate(model__augment__shift=0.2, model__augment__mixup=0.2),
    "conv-relbias": candidate(model__net__positional="relative_bias"),
    "conv-relbias-shift": candidate(model__net__positional="relative_bias", model__augment__shift=0.2),
    # issue 42: InceptionTime's modules as the stem (nn/multiscale_embedding.py), with the recipe's shift
    "multiscale-shift": candidate(model__net__embedding="multiscale", model__augment__shift=0.2),
}


def validation_series(dataset: str, seed: int) -> pd.DataFrame:
    """The TRAIN file's rows of the validation series a run of `seed` holds out (data.val_fraction=0.2)."""
    train = pd.read_csv(archive_file(dataset, "TRAIN"))
    dm = SequenceDataModule(train, train, seed=seed, val_fraction=0.2)  # a test file: no test_fraction cut
    dm.setup()
    return train[train.series_id.isin(set(dm.sample_info("val").series_id))]


def budget(steps: int | None, epochs: int | None) -> list[str]:
    """The training budget's overrides: optimiser steps (the steps decide), or epochs."""
    if steps is not None:
        return [f"trainer.max_steps={steps}", "trainer.max_epochs=-1"]
    return ["trainer.max_steps=-1", f"trainer.max_epochs={epochs}"]


def budget_name(limit: list[str]) -> str:
    """'4000 steps' or '200 epochs', from `budget`'s overrides."""
    steps, epochs = (item.split("=")[1] for item in limit)
    return f"{steps} steps" if steps != "-1" else f"{epochs} epochs"


def one_run(dataset: str, candidate: str, seed: int, limit: list[str], extra: list[str]) -> dict:
    overrides = [
        f"experiment={EXPERIMENTS[dataset]}", *CANDIDATES[candidate], *extra, f"seed={seed}",
        "data.val_fraction=0.2", "callbacks=last_weights", *limit,
        "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "logger=none",
        "forecasts_file=null",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = run(compose_config(overrides, Path(tmp) / "out"))
        seconds = time.perf_counter() - start
        model = Classifier.load(result.model_folder)
        val = validation_series(dataset, seed)
        frame = model.predict(val)
    proba = frame[[f"p_{c}" for c in model.classes]].to_numpy()
    truth = np.array([model.classes.index(str(y)) for y in frame.y_true])
    return {
        "dataset": dataset, "candidate": candidate, "seed": seed, "seconds": seconds,
        "val_accuracy": float((proba.argmax(axis=1) == truth).mean()),
        "val_log_loss": float(-np.log(np.clip(proba[np.arange(len(truth)), truth], 1e-15, None)).mean()),
        "n_val": len(truth), "budget": budget_name(limit),
    }  # fmt: skip


def table(rows: list[dict]) -> list[str]:
    """Per candidate and set: the mean over seeds; then per candidate the mean over its sets."""
    lines = ["| candidate | budget | data set | seeds | val accuracy (min..max) | val log loss | s/run |"]
    lines.append("|---|---|---|---|---|---|---|")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["candidate"], r.get("budget", "-"), r["dataset"]), []).append(r)
    means: dict[tuple, list[tuple[float, float]]] = {}
    for (candidate, limit, dataset), rs in groups.items():
        accs = [r["val_accuracy"] for r in rs]
        acc, loss = statistics.fmean(accs), statistics.fmean(r["val_log_loss"] for r in rs)
        secs = statistics.fmean(r["seconds"] for r in rs)
        means.setdefault((candidate, limit), []).append((acc, loss))
        lines.append(
            f"| {candidate} | {limit} | {dataset} | {len(rs)} | {acc:.4f} ({min(accs):.4f}..{max(accs):.4f}) "
            f"| {loss:.4f} | {secs:.0f} |"
        )
    lines += [
        "",
        "| candidate | budget | sets | mean val accuracy | mean val log loss |",
        "|---|---|---|---|---|",
    ]
    for (candidate, limit), pairs in means.items():
        acc, loss = statistics.fmean(p[0] for p in pairs), statistics.fmean(p[1] for p in pairs)
        lines.append(f"| {candidate} | {limit} | {len(pairs)} | {acc:.4f} | {loss:.4f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", default="OSULeaf,GunPoint,JapaneseVowels")
    parser.add_argument("--candidates", default="conv")
    parser.add_argument("--seeds", default="0")
    limit = parser.add_mutually_exclusive_group()
    limit.add_argument(
        "--steps", type=int, help="optimiser steps per run (the recipe's budget since issue 42)"
    )
    limit.add_argument("--epochs", type=int, help="epochs per run instead (issue 35's protocol)")
    parser.add_argument("--set", nargs="*", default=[], help="Hydra overrides for every run")
    parser.add_argument("--rows", help="write the per-run rows (JSON) here after every run")
    parser.add_argument("--merge", help="comma-separated --rows files: tabulate them, run nothing")
    parser.add_argument("--list", action="store_true", help="print the candidates and exit")
    args = parser.parse_args()
    if args.list:
        for name, overrides in CANDIDATES.items():
            print(f"{name}: {' '.join(overrides)}")
        return
    if args.merge:
        print(
            "\n".join(
                table([r for path in args.merge.split(",") for r in json.loads(Path(path).read_text())])
            )
        )
        return
    steps = args.steps if args.steps is not None or args.epochs is not None else 4000
    limit = budget(steps, args.epochs)
    rows = []
    for candidate in args.candidates.split(","):
        for dataset in args.datasets.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                r = one_run(dataset, candidate, seed, limit, args.set)
                rows.append(r)
                if args.rows:  # after every run: an interrupted invocation keeps what it measured
                    Path(args.rows).write_text(json.dumps(rows))
                print(
                    f"{dataset} {candidate} seed {seed}: val accuracy {r['val_accuracy']:.4f}, "
                    f"val log loss {r['val_log_loss']:.4f} ({r['n_val']} series, {r['seconds']:.0f} s)",
                    flush=True,
                )
    budget_flag = f"--steps {steps}" if args.epochs is None else f"--epochs {args.epochs}"
    print(f"\n`python benchmarks/classification_recipe.py --datasets {args.datasets} --candidates "
          f"{args.candidates} --seeds {args.seeds} {budget_flag}"
          + (f" --set {' '.join(args.set)}" if args.set else "") + "`\n")  # fmt: skip
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
