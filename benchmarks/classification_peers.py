"""Classification peers (issue 27): aeon's MiniRocket and MultiRocket on the UEA & UCR archive's split.

Runs in its own environment, not the project's (aeon 1.6 needs pandas < 3.1):

    python3 -m venv /tmp/aeon-venv && /tmp/aeon-venv/bin/pip install "aeon==1.6.*"
    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 /tmp/aeon-venv/bin/python benchmarks/classification_peers.py \
        --results benchmarks/RESULTS_classification_peers.md
    /tmp/aeon-venv/bin/python benchmarks/classification_peers.py --datasets BasicMotions --seeds 0
    /tmp/aeon-venv/bin/python benchmarks/classification_peers.py --data-dir /elsewhere/classification

Data: `<data-dir>/<name>/<name>_{TRAIN,TEST}.ts` (../shared/data/classification/SOURCE.md), read with
aeon's `load_from_ts_file`; the archive's default split: fit on TRAIN, score every TEST series.

Models (aeon 1.6, default settings: 10,000 kernels, RidgeClassifierCV over alphas 1e-3..1e3):
- aeon-MiniRocket: `MiniRocketClassifier(random_state=seed, n_jobs=1)`;
- aeon-MultiRocket: `MultiRocketClassifier(random_state=seed, n_jobs=1)`;
- aeon-MiniRocket-logistic (issue 42): aeon's `MiniRocket` transform (random_state=seed, n_jobs=1), its
  features standardised, then scikit-learn's `LogisticRegressionCV` (C over 1e-4..1e2, 7 values, chosen by
  the log loss of a stratified 5-fold cross-validation on TRAIN, at most as many folds as the rarest class
  has series): MiniRocket with probabilities, for the log loss and the ECE;
- majority-class: the most frequent TRAIN label predicted for every TEST series (its probabilities: the
  TRAIN class shares).
Rows with probabilities carry `log_loss` and `ece` (expected calibration error of the top class, 15 equal
bins of confidence, as the project's test/ece).

Unequal lengths (JapaneseVowels, 7-29 steps): neither classifier accepts unequal lengths, so both run in
aeon's `ClassifierPipeline([Padder(padded_length=P, fill_value=--pad-fill), classifier])`, P the longest
series of either split (the archive's own equal-length versions are padded the same way, to one length
for both files); padding reads only the lengths, never a label. Equal-length sets get no padder.

`fit_s`: wall seconds of the pipeline's `fit` on TRAIN (padding, kernel transform, ridge), `predict_s`
of its `predict` on every TEST series; numba's compilation is excluded by a warm-up fit and predict on
one series per class before the timed fits.
Set OMP_NUM_THREADS / NUMBA_NUM_THREADS to the threads you mean to use: they are recorded.

The results file (`--results`) is written whole from what this invocation measured: the command,
versions, machine, the per-seed table, and the mean over seeds beside the published figures of
SOURCE.md (typed in below as PUBLISHED, not measured here).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = REPO.parent / "shared" / "data" / "classification"
DATASETS = ("BasicMotions", "JapaneseVowels", "OSULeaf", "GunPoint", "ItalyPowerDemand", "ACSF1")
MODELS = ("aeon-MiniRocket", "aeon-MultiRocket", "aeon-MiniRocket-logistic")
ECE_BINS = 15
BASELINE = "majority-class"

# (dataset, method) -> (accuracy on the default split, where it is from); from SOURCE.md, not measured here
PUBLISHED = {
    ("JapaneseVowels", "MultiRocket"): (0.968, "ConvTran authors' results table"),
    ("JapaneseVowels", "TST"): (0.984, "Zerveas et al. 2021"),
    ("JapaneseVowels", "InceptionTime"): (0.970, "ConvTran authors' results table"),
    ("OSULeaf", "InceptionTime"): (0.921, "default split (0.953 mean of 30 resamples)"),
    ("OSULeaf", "HIVE-COTE 2"): (0.967, "aeon's shipped results files"),
    ("BasicMotions", "ROCKET"): (1.0, "multivariate bake-off, Ruiz et al. 2021"),
}


def load_split(data_dir: Path, name: str, split: str):
    """(X, y) of `<name>_<split>.ts`: X a 3D array (series, channels, steps) or, for unequal lengths, a
    list of (channels, steps) arrays; y the labels as strings."""
    from aeon.datasets import load_from_ts_file

    path = data_dir / name / f"{name}_{split}.ts"
    if not path.is_file():
        sys.exit(
            f"error: {path} not found; pass --data-dir, the folder holding <name>/<name>_TRAIN.ts "
            "(../shared/data/classification/SOURCE.md says where the files come from)"
        )
    return load_from_ts_file(str(path))


class MiniRocketLogistic:
    """[Padder ->] MiniRocket features -> standardised -> LogisticRegressionCV (module docstring)."""

    def __init__(self, seed: int, padder=None):
        self.seed, self.padder = seed, padder

    def _features(self, X, fit: bool):
        from aeon.transformations.collection.convolution_based import MiniRocket

        if self.padder is not None:
            X = self.padder.fit_transform(X) if fit else self.padder.transform(X)
        if fit:
            self.rocket = MiniRocket(random_state=self.seed, n_jobs=1).fit(X)
        return self.rocket.transform(X)

    def fit(self, X, y):
        import numpy as np
        from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
        from sklearn.model_selection import StratifiedKFold
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        rarest = int(np.unique(y, return_counts=True)[1].min())
        if rarest < 2:  # the warm-up's one series per class: nothing to cross-validate, C = 1
            logistic = LogisticRegression(max_iter=2000)
        else:
            cv = StratifiedKFold(min(5, rarest), shuffle=True, random_state=self.seed)
            logistic = LogisticRegressionCV(
                Cs=np.logspace(-4, 2, 7), cv=cv, scoring="neg_log_loss", max_iter=2000
            )
        self.model = make_pipeline(StandardScaler(), logistic).fit(self._features(X, fit=True), y)
        self.classes_ = self.model.classes_
        return self

    def predict_proba(self, X):
        return self.model.predict_proba(self._features(X, fit=False))

    def predict(self, X):
        return self.classes_[self.predict_proba(X).argmax(axis=1)]


def ece(proba, y_true, classes) -> float:
    """Expected calibration error of the top class: sum over `ECE_BINS` equal bins of confidence of
    |accuracy - mean confidence| x the bin's share of the samples."""
    import numpy as np

    confidence = proba.max(axis=1)
    correct = np.asarray(classes)[proba.argmax(axis=1)] == y_true
    which = np.clip(np.ceil(confidence * ECE_BINS).astype(int) - 1, 0, ECE_BINS - 1)
    total = 0.0
    for b in np.unique(which):
        inside = which == b
        total += inside.mean() * abs(correct[inside].mean() - confidence[inside].mean())
    return float(total)


def log_loss(proba, y_true, classes) -> float:
    import numpy as np

    index = {c: i for i, c in enumerate(classes)}
    p = proba[np.arange(len(y_true)), [index[y] for y in y_true]]
    return float(-np.log(np.clip(p, 1e-15, None)).mean())


def make_model(model: str, seed: int, padded_length: int | None, pad_fill: str | float):
    """The aeon estimator for `model`; behind a Padder when the set has unequal lengths."""
    from aeon.classification.compose import ClassifierPipeline
    from aeon.classification.convolution_based import MiniRocketClassifier, MultiRocketClassifier
    from aeon.transformations.collection.unequal_length import Padder

    if model == "aeon-MiniRocket-logistic":
        padder = None if padded_length is None else Padder(padded_length=padded_length, fill_value=pad_fill)
        return MiniRocketLogistic(seed, padder)

    classes = {"aeon-MiniRocket": MiniRocketClassifier, "aeon-MultiRocket": MultiRocketClassifier}
    classifier = classes[model](random_state=seed, n_jobs=1)
    if padded_length is None:
        return classifier
    return ClassifierPipeline([Padder(padded_length=padded_length, fill_value=pad_fill)], classifier)


def one_per_class(X, y):
    """The first series of each class: a warm-up set that compiles the same numba functions."""
    import numpy as np

    first = [int(np.flatnonzero(y == label)[0]) for label in np.unique(y)]
    return ([X[i] for i in first] if isinstance(X, list) else X[first]), y[first]


def run_dataset(data_dir: Path, name: str, models, seeds, pad_fill) -> tuple[list[dict], list[str]]:
    """Per-seed rows (majority-class first) for `models` on `name`, and its data notes."""
    import numpy as np

    X_train, y_train = load_split(data_dir, name, "TRAIN")
    X_test, y_test = load_split(data_dir, name, "TEST")
    lengths = [x.shape[-1] for x in [*X_train, *X_test]]
    padded_length = max(lengths) if min(lengths) != max(lengths) else None
    rows = []

    # np.unique sorts the labels and argmax takes the first of tied counts: a balanced train set's
    # "majority" is its first label in sorted order
    labels, counts = np.unique(y_train, return_counts=True)
    majority = labels[np.argmax(counts)]
    shares = np.tile(counts / counts.sum(), (len(y_test), 1))  # (S, C): the TRAIN class shares
    rows.append(
        {
            "model": BASELINE,
            "dataset": name,
            "seed": "-",
            "accuracy": float(np.mean(y_test == majority)),
            "fit_s": 0.0,
            "predict_s": 0.0,
            "n_test": len(y_test),
            "log_loss": log_loss(shares, y_test, labels),
            "ece": ece(shares, y_test, labels),
        }
    )

    X_warm, y_warm = one_per_class(X_train, y_train)
    for model in models:
        make_model(model, 0, padded_length, pad_fill).fit(X_warm, y_warm).predict(X_warm)
        for seed in seeds:
            estimator = make_model(model, seed, padded_length, pad_fill)
            start = time.perf_counter()
            estimator.fit(X_train, y_train)
            fit_s = time.perf_counter() - start
            start = time.perf_counter()
            proba = estimator.predict_proba(X_test) if hasattr(estimator, "predict_proba") else None
            y_pred = estimator.predict(X_test) if proba is None else estimator.classes_[proba.argmax(axis=1)]
            predict_s = time.perf_counter() - start
            assert len(y_pred) == len(y_test)  # every test series is scored
            row = {
                "model": model,
                "dataset": name,
                "seed": seed,
                "accuracy": float(np.mean(y_pred == y_test)),
                "fit_s": fit_s,
                "predict_s": predict_s,
                "n_test": len(y_test),
            }
            if model == "aeon-MiniRocket-logistic":  # the ridge's "probabilities" are no probabilities
                row |= {
                    "log_loss": log_loss(proba, y_test, estimator.classes_),
                    "ece": ece(proba, y_test, estimator.classes_),
                }
            print(
                f"  {model} {name} seed {seed}: accuracy {row['accuracy']:.4f}, fit {fit_s:.1f} s", flush=True
            )
            rows.append(row)
    return rows, data_notes(name, X_train, X_test, y_train, padded_length)


def data_notes(name: str, X_train, X_test, y_train, padded_length: int | None) -> list[str]:
    """What a reader of the table needs about this set: its padding and a tied majority class."""
    import numpy as np

    notes = []
    if padded_length is not None:
        train, test = ([x.shape[-1] for x in X] for X in (X_train, X_test))
        notes.append(
            f"- {name}: unequal lengths (train {min(train)}-{max(train)}, test {min(test)}-{max(test)} "
            f"steps), every series padded at its end to {padded_length} steps."
        )
    labels, counts = np.unique(y_train, return_counts=True)
    if (counts == counts.max()).sum() > 1:
        notes.append(
            f"- {name}: the train set's most frequent classes tie ({counts.max()} series each); "
            f"majority-class predicts the first in sorted order, '{labels[np.argmax(counts)]}'."
        )
    return notes


def table(rows: list[dict]) -> str:
    lines = [
        "| model | dataset | seed | accuracy | fit_s | predict_s | n_test |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['dataset']} | {r['seed']} | {r['accuracy']:.4f} | {r['fit_s']:.2f} "
            f"| {r['predict_s']:.2f} | {r['n_test']} |"
        )
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """Mean (min-max) accuracy over seeds per model and data set, then the published figures."""
    lines = ["| dataset | method | accuracy | source |", "|---|---|---|---|"]
    for name in dict.fromkeys(r["dataset"] for r in rows):
        for model in dict.fromkeys(r["model"] for r in rows if r["dataset"] == name):
            accs = [r["accuracy"] for r in rows if r["dataset"] == name and r["model"] == model]
            fits = [r["fit_s"] for r in rows if r["dataset"] == name and r["model"] == model]
            spread = f" ({min(accs):.4f}-{max(accs):.4f})" if len(accs) > 1 else ""
            source = f"measured, {len(accs)} seed(s), mean fit {sum(fits) / len(fits):.1f} s"
            if model == BASELINE:
                source = "measured"
            lines.append(f"| {name} | {model} | {sum(accs) / len(accs):.4f}{spread} | {source} |")
        for (dataset, method), (acc, where) in PUBLISHED.items():
            if dataset == name:
                lines.append(f"| {name} | {method} | {acc:.3f} | published: {where} |")
    return "\n".join(lines)


def environment() -> list[str]:
    from importlib.metadata import version

    packages = ["aeon", "numpy", "scipy", "scikit-learn", "numba", "pandas"]
    cpu = platform.processor() or platform.machine()
    try:
        cpu_lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in cpu_lines if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    threads = ", ".join(f"{v}={os.environ.get(v, 'unset')}" for v in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS"))
    return [
        f"- date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores visible",
        f"- threads: {threads}",
        f"- python {platform.python_version()}; " + ", ".join(f"{p} {version(p)}" for p in packages),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}"
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--pad-fill",
        default="0",
        help="Padder fill_value for unequal lengths: a number, or mean/median/min/max/last",
    )
    parser.add_argument("--results", type=Path, default=None, help="markdown file written with the results")
    parser.add_argument(
        "--json", type=Path, default=None, help="the per-seed rows as JSON (for classification.py)"
    )
    args = parser.parse_args()

    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        parser.error(f"--seeds: {args.seeds!r} is not a comma-separated list of integers, e.g. 0,1,2")
    try:
        pad_fill = float(args.pad_fill)
    except ValueError:
        pad_fill = args.pad_fill
        if pad_fill not in ("mean", "median", "min", "max", "last"):
            parser.error(f"--pad-fill: {pad_fill!r} is neither a number nor mean/median/min/max/last")

    rows, notes = [], []
    for name in [d for d in args.datasets.split(",") if d]:
        print(f"{name}:", flush=True)
        dataset_rows, dataset_notes = run_dataset(args.data_dir, name, models, seeds, pad_fill)
        rows += dataset_rows
        notes += dataset_notes

    threads = [f"{v}={os.environ[v]}" for v in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS") if v in os.environ]
    command = " ".join([*threads, *(shlex.quote(a) for a in [sys.executable, *sys.argv])])
    report = "\n".join(
        [
            "# Classification peers: aeon MiniRocket / MultiRocket on the archive's default split",
            "",
            (
                "Written by `benchmarks/classification_peers.py` (its docstring: protocol, padding, timing); "
                f"padding fill for unequal lengths: {pad_fill!r}."
            ),
            "",
            "```",
            command,
            "```",
            "",
            *environment(),
            "",
            "## Per seed (every test series)",
            "",
            "`fit_s` is wall time on this machine at the threads above; on a CPU shared with other jobs it",
            "varies between invocations: compare the rows of one invocation only.",
            "",
            table(rows),
            "",
            *(["## Data notes", "", *notes, ""] if notes else []),
            "## Mean over seeds, beside published figures",
            "",
            "Published figures are from `../shared/data/classification/SOURCE.md`, not measured here.",
            "",
            summary(rows),
            "",
        ]
    )
    print()
    print(report)
    if args.json is not None:
        args.json.write_text(json.dumps(rows))
    if args.results is not None:
        tmp = args.results.with_name(args.results.name + ".tmp")
        tmp.write_text(report)
        tmp.replace(args.results)  # no half-written results file
        print(f"results written to {args.results}")


if __name__ == "__main__":
    main()
