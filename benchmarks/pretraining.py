"""Does masked pre-training help the classifier (issue 28)? Scratch vs pre-trained then fine-tuned, 3 seeds.

    python benchmarks/pretraining.py --results benchmarks/RESULTS_pretraining.md     # every data set, 3 seeds
    python benchmarks/pretraining.py --datasets OSULeaf --seeds 0 --pretrain-set model.mask_ratio=0.3
    python benchmarks/pretraining.py --protocol recipe --datasets OSULeaf    # the classifier's default recipe

Each row is ordinary `train.run`s (`benchmarks/classification.py`'s `quiet_run`: no logger, outputs
under a temporary folder), per seed:
- `scratch`: `python train.py experiment=<set> seed=<s>`, the experiment's settings as they are;
- `pretrained`: `python train.py experiment=<set> pretrain=masked seed=<s>` (masked fill-in on the
  training samples, labels ignored; the seed draws the same validation samples, which it never sees),
  then the scratch command with `init_from=<that run's model folder>`: the same fine-tuning settings.
JapaneseVowels and OSULeaf: the archive's split, 80/20 stratified train/val of the train file
(`PROTOCOL`: the experiments' own fixed budget on every series is replaced by issue 28's early
stopping on the validation series), every test series. plant_regime (`experiment=plant_regime`): `data.label_fraction=0.1` in both arms, so the
classifier learns from a stratified 10 % of the training windows' labels, and pre-training reads every
training window without its label. Pre-training runs up to `--pretrain-steps` optimizer steps (the
same budget for small and large data sets; early-stopped on the validation masked MSE); its settings
(`--pretrain-set`, `--pretrain-steps`) are chosen on the fine-tuned validation log loss, never on test.

`--protocol recipe` (archive sets only): the classifier as its default recipe runs in both arms (issue
35: `python train.py experiment=<set> seed=<s>`, every training series, the experiment's fixed budget
of epochs, the last weights; `--epochs` and `--patience` unused), pre-training as a user runs it
(`python train.py experiment=<set> pretrain=masked seed=<s>`: its own validation series, early-stopped
on their masked MSE), then `python train.py experiment=<set> seed=<s> init_from=<its model folder>`.
The classifier validates no series: the rows give its test figures only.

The table is printed and, with `--results`, written as a markdown file: measured rows only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import tempfile
from pathlib import Path

import classification
import torch
from classification import EXPERIMENTS

SETS = {**EXPERIMENTS, "plant_regime": "plant_regime"}
# issue 28's protocol in both arms: validation series held out of the train file, early stopping on them
# (the archive experiments train on every series for a fixed budget otherwise)
PROTOCOL = ["data.val_fraction=0.2", "callbacks=default"]
METRICS = ["accuracy", "balanced_accuracy", "macro_f1", "log_loss", "ece"]


def quiet_run(overrides: list[str], epochs: int | None, patience: int | None, output_dir: Path):
    """`classification.quiet_run` with `epochs` and early-stopping `patience` (None: the run's own):
    (RunResult, seconds)."""
    budget = [] if epochs is None else [f"trainer.max_epochs={epochs}"]
    budget += [] if patience is None else [f"callbacks.early_stopping.patience={patience}"]
    return classification.quiet_run([*overrides, *budget], output_dir)


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


EXTRA = {"plant_regime": ["data.label_fraction=0.1"]}  # both arms: the semi-supervised case
ARMS = ("scratch", "pretrained")


def one_seed(dataset: str, seed: int, args) -> list[dict]:
    """The scratch and the pre-trained row of one data set and seed."""
    recipe = args.protocol == "recipe"
    if recipe and dataset not in EXPERIMENTS:
        raise SystemExit(
            f"error: --protocol recipe is the archive sets' ({', '.join(EXPERIMENTS)}), not {dataset}"
        )
    protocol = PROTOCOL if dataset in EXPERIMENTS else []  # plant_regime keeps its own split in time
    # the recipe: the experiment's own split (every series) and budget; pretrain=masked holds out its own
    common = [f"experiment={SETS[dataset]}", f"seed={seed}", *([] if recipe else protocol)]
    common += [*EXTRA.get(dataset, []), *args.set]
    epochs, patience = (None, None) if recipe else (args.epochs, args.patience)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        result, seconds = quiet_run(common, epochs, patience, Path(tmp) / "scratch")
        rows.append({"dataset": dataset, "arm": "scratch", "seed": seed, **scores(result, seconds)})
        pre, pre_seconds = quiet_run(  # a budget of optimizer steps, whatever the number of samples
            [
                *common,
                "pretrain=masked",
                f"trainer.max_steps={args.pretrain_steps}",
                *args.pretrain_set,
            ],
            -1,
            args.pretrain_patience,
            Path(tmp) / "pretrain",
        )
        tuned, seconds = quiet_run(
            [*common, f"init_from={pre.model_folder}"], epochs, patience, Path(tmp) / "tuned"
        )
    pretraining = {
        "pre_val_mse": pre.best_val,
        "pre_test_mse": pre.metrics["test/mse"],
        "pre_test_interpolation_mse": pre.metrics["test/baseline_mse"],
        "pre_seconds": pre_seconds,
    }
    rows.append(
        {"dataset": dataset, "arm": "pretrained", "seed": seed, **scores(tuned, seconds), **pretraining}
    )
    return rows


def mean_of(rs: list[dict], key: str) -> float | None:
    """The mean of `key` over the rows; None where a row has none (no validation series: the recipe's
    classifier)."""
    values = [r[key] for r in rs]
    return None if None in values else statistics.fmean(values)


def figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def table(rows: list[dict]) -> list[str]:
    """One line per data set and arm (mean (min..max) over the seeds), then one verdict per data set."""
    lines = [
        (
            "| data set | arm | seeds | test accuracy mean (min..max) | balanced acc. | log loss "
            "| val log loss | pre-training val masked MSE | test masked MSE (interpolation) "
            "| s/run (pre-training) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["arm"]), []).append(r)
    for (dataset, arm), rs in groups.items():

        def mean(key, rs=rs):
            return mean_of(rs, key)

        acc = [r["accuracy"] for r in rs]
        pre = arm == "pretrained"
        lines.append(
            f"| {dataset} | {arm} | {len(rs)} | {mean('accuracy'):.4f} ({min(acc):.4f}..{max(acc):.4f}) | "
            f"{mean('balanced_accuracy'):.4f} | {mean('log_loss'):.4f} | {figure(mean('val_log_loss'))} | "
            + (f"{figure(mean('pre_val_mse'))} | " if pre else "| ")
            + (f"{mean('pre_test_mse'):.4f} ({mean('pre_test_interpolation_mse'):.4f}) | " if pre else "| ")
            + f"{mean('seconds'):.0f}"
            + (f" ({mean('pre_seconds'):.0f})" if pre else "")
            + " |"
        )
    lines.append("")
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        lines.append(
            f"- {verdict(groups.get((dataset, 'scratch'), []), groups.get((dataset, 'pretrained'), []))}"
        )
    return lines


def verdict(scratch: list[dict], tuned: list[dict]) -> str:
    """Whether pre-training helped one data set: by the mean test accuracy, with the validation log loss
    (where there are validation series; the recipe has none: the test accuracy alone)."""
    if not scratch or not tuned:
        return "incomplete"
    dataset = scratch[0]["dataset"]
    gain = mean_of(tuned, "accuracy") - mean_of(scratch, "accuracy")
    overlap = min(r["accuracy"] for r in tuned) <= max(r["accuracy"] for r in scratch)
    spread = ", within the seeds' spread (their ranges overlap)" if overlap else ""
    if mean_of(scratch, "val_log_loss") is None:
        answer = ("pre-training helps" + spread) if gain > 0 else "pre-training does not help"
        return (
            f"**{dataset}: {answer}**: test accuracy {gain:+.4f} (pre-trained minus scratch, means of the "
            "seeds; no validation series)"
        )
    val = mean_of(tuned, "val_log_loss") - mean_of(scratch, "val_log_loss")
    if gain > 0 and val < 0:
        answer = "pre-training helps" + spread
    elif gain <= 0 and val >= 0:
        answer = "pre-training does not help"
    else:
        answer = "no clear effect (test accuracy and validation log loss disagree)"
    return (
        f"**{dataset}: {answer}**: test accuracy {gain:+.4f}, validation log loss {val:+.4f} "
        "(pre-trained minus scratch, means of the seeds)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", default="JapaneseVowels,OSULeaf,plant_regime")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=100, help="classifier (scratch and fine-tuning)")
    parser.add_argument("--patience", type=int, default=15, help="early stopping on the validation log loss")
    parser.add_argument("--pretrain-steps", type=int, default=3000, help="optimizer steps of pre-training")
    parser.add_argument("--pretrain-patience", type=int, default=15, help="on the validation masked MSE")
    parser.add_argument("--set", nargs="*", default=[], help="Hydra overrides for every run")
    parser.add_argument("--pretrain-set", nargs="*", default=[], help="Hydra overrides for pre-training")
    parser.add_argument("--results", help="write the table (markdown) to this file")
    parser.add_argument(
        "--protocol",
        choices=["early-stopping", "recipe"],
        default="early-stopping",
        help="the module docstring",
    )
    args = parser.parse_args()

    rows = []
    for dataset in args.datasets.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            rows += one_seed(dataset, seed, args)
            for r in rows[-2:]:
                print(
                    f"{dataset} {r['arm']} seed {seed}: test accuracy {r['accuracy']:.4f}, "
                    f"val log loss {figure(r['val_log_loss'])} ({r['seconds']:.0f} s)"
                    + (
                        f"; pre-training val masked MSE {figure(r['pre_val_mse'])}"
                        if "pre_val_mse" in r
                        else ""
                    ),
                    flush=True,
                )
    command = (
        f"python benchmarks/pretraining.py --protocol {args.protocol} --datasets {args.datasets} "
        f"--seeds {args.seeds} "
        + ("" if args.protocol == "recipe" else f"--epochs {args.epochs} --patience {args.patience} ")
        + f"--pretrain-steps {args.pretrain_steps} --pretrain-patience {args.pretrain_patience}"
        + (f" --set {' '.join(args.set)}" if args.set else "")
        + (f" --pretrain-set {' '.join(args.pretrain_set)}" if args.pretrain_set else "")
    )
    machine = platform.processor() or platform.machine()
    threads, version = torch.get_num_threads(), torch.__version__
    when = f"Measured {dt.date.today()} on {machine} ({threads} threads), torch {version}"
    header = [f"{when}: `{command}`", ""]
    lines = table(rows)
    print("\n".join(["", *header, *lines]))
    if args.results:
        Path(args.results).write_text("\n".join(header + lines) + "\n")


if __name__ == "__main__":
    main()
