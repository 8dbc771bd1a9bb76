"""Anomaly detection on labelled benchmarks (issues 34, 41): our detector beside simple scores fitted on
the same train rows in the same run, and beside TSB-AD's published VUS-PR table.

    OMP_NUM_THREADS=1 python benchmarks/anomaly.py --method none          # the peers only, every file
    OMP_NUM_THREADS=1 python benchmarks/anomaly.py --datasets msl --method masked --seeds 0 1 2
    python benchmarks/anomaly.py --datasets msl_tuning skab_tuning --method masked --set model.score=hybrid
    python benchmarks/anomaly.py --datasets skab --files 3 --results /tmp/R.md  # a quick check

Data (`--data`, default ../shared/data/anomaly beside the repository; read in place, see SOURCE.md):
- `msl`: the 14 MSL files of TSB-AD-M with TSB-AD's protocol: train on the `tr_<n>` prefix named in
  each file, score every row;
- `skab`: the 34 SKAB runs with SKAB's protocol: the first 400 rows of each run train, the rest are
  scored (`--skab-anomaly-free` adds SKAB's separate normal run to every run's train rows; off unless
  given, and the results' header says which);
- `univariate`: TSB-AD-U's NAB file (train on its `tr_` prefix) and UCR 135 (train on aeon's TRAIN
  part), every row scored: a quick check;
- where settings are chosen (never on the sets above): `msl_tuning`, TSB-AD's 2 MSL tuning files,
  `pool`, 8 more labelled series (6 MSL channels in no evaluation file, TSB-AD-M's Genesis and Daphnet
  files; `pool/SOURCE.md`), and `skab_tuning`, SKAB's anomaly-free run cut into 8 runs with the plant's
  faults injected (`anomaly_datasets.py`).

Every method sees the same train rows; labels are used only by the evaluation
(`tsformer.jobs.anomaly.evaluation`: TSB-AD's VUS-PR, VUS-ROC, AUC-PR, AUC-ROC on the scored rows, with
the sliding window from the scored rows' first channel).
- Peers (`tsformer.jobs.anomaly.baselines`, and `KMeansAD` here): Hotelling T², PCA residual,
  IsolationForest, a uniform random score, the window memory (issue 41's 20 lines of numpy), the PCA
  residual with the same window-to-row mean, and TSB-AD's own KMeansAD (k = 10, windows of 40), each
  fitted on all the train rows for the threshold-free metrics.
- Our detector (`--method masked|forecast`): the job's task trained as `train.py` trains it
  (`train.fit_task` on the config of `experiment=anomaly_benchmark model=enc_only_anomaly |
  dec_only_anomaly seed=S`, then `--set` Hydra overrides), on the run's table without its labels, the
  train rows its normal rows (their last `--val-fraction` its validation rows: the checkpoint, the
  error scales and the threshold); validation never comes from scored rows. The settings are fixed in
  advance for every data set (benchmarks/RESULTS_anomaly.md says where they were chosen). A hybrid's
  parts are measured beside it (`ours (masked), its memory`, ...: the same network and scores).
- Alarm metrics (F1, event recall, false alarms per 1,000 normal rows) at a threshold calibrated on
  normal rows only, the same way for every method: fitted on the first 80 % of the train rows, the
  threshold is the (1 - `--false-alarm-rate`) quantile of the scores of the last 20 %. (A baseline's
  threshold-free metrics come from its fit on all the train rows; its alarm metrics from this second
  fit. With 80-300 validation rows per file, a rate below about 1/rows means "above the largest
  validation score".)
- Seeds (`--seeds`, default 0 1 2) reseed IsolationForest, KMeansAD and the random score (seed x 10,000
  + the file's index) and the detector (the seed itself); the other peers are deterministic. A mean
  over files is taken per seed; `±` is the sd of those means over seeds.
- `--rows ROWS` keeps every file x method x seed row in `ROWS-<dataset>.csv`; `--merge ROWS` tabulates
  an earlier run's rows (the same settings, other seeds) with this run's, so seeds measured in
  separate runs make one table (`--seeds` with no seed only tabulates).
- Times: fit and score seconds (the whole table, every row) summed over files, mean over seeds, and as
  a ratio to IsolationForest's in the same run. Our fit is `fit_task`'s: training, the test pass over
  the table's later rows, the memory and the calibration.

Tables are printed as markdown and written to `--results` between `<!-- table NAME -->` markers
(NAME = `<dataset>-<method>[-<--tag>]`); the notes written by hand around them are kept.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import io
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from imputation import machine, write_results

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import anomaly_datasets as datasets

from tsformer.jobs.anomaly.baselines import BaselineScores, baselines
from tsformer.jobs.anomaly.evaluation import alarm_metrics, evaluate

DEFAULT_DATA = REPO / ".." / "shared" / "data" / "anomaly"
REFERENCE = "isolation_forest"  # times are given as ratios to this one's
PUBLISHED_SHOWN = ["KMeansAD", "CNN", "IForest", "PCA"]  # per-file columns; every method in the means table
METRICS = ["vus_pr", "vus_roc", "auc_pr", "auc_roc", "f1", "event_recall", "false_alarms_per_1000"]
# SKAB's check from the issue: Hotelling T² with each run's first 400 rows, and a random score
ISSUE_SKAB = {"hotelling_t2": 0.827, "random": 0.588}
TITLE = "# Anomaly detection on MSL, SKAB and two univariate series (benchmarks/anomaly.py)"


def with_extra(rows: pd.DataFrame, extra: pd.DataFrame | None) -> pd.DataFrame:
    """`extra` normal rows (SKAB's anomaly-free run) before a run's own train rows."""
    return rows if extra is None else pd.concat([extra[rows.columns], rows], ignore_index=True)


def split_train(run: datasets.LabelledRun, val_fraction: float, extra: pd.DataFrame | None):
    """(fit rows, validation rows, the run's row where validation starts) of a run's train rows:
    validation is their last `val_fraction`, never extra rows."""
    cut = run.train_end - max(1, round(val_fraction * run.train_end))
    return with_extra(run.table.iloc[:cut], extra), run.table.iloc[cut : run.train_end], cut


def calibrated(val_scores: np.ndarray, rate: float) -> float:
    """The (1 - rate) quantile of scores on normal validation rows (an observed score, never between two)."""
    return float(np.quantile(val_scores, 1.0 - rate, method="higher"))


class Baseline:
    """A baseline behind the detector's interface: fit(train, val) then score(table) -> .score, .contributions."""

    def __init__(self, model):
        self.model, self.name = model, model.name

    def fit(self, train: pd.DataFrame, val: pd.DataFrame | None):
        self.model.fit(train.to_numpy())
        return self

    def score(self, table: pd.DataFrame):
        return self.model.score(table.to_numpy())


class KMeansAD:
    """TSB-AD's own KMeansAD (`TSB_AD.models.KMeansAD`: k-means on z-scored windows, a window's score its
    distance to its centre, rows the mean of their windows) with TSB-AD's published settings, k = 10 and
    windows of 40 rows, fitted on the train rows (TSB-AD fits it on the whole series)."""

    name = "kmeans_ad"
    description = "TSB-AD's KMeansAD (k=10, window 40) fitted on the train rows"

    def __init__(self, seed: int = 0, k: int = 10, window: int = 40):
        self.seed, self.k, self.window = seed, k, window

    def fit(self, train):
        from TSB_AD.models.KMeansAD import KMeansAD as TSBKMeansAD

        self.model = TSBKMeansAD(k=self.k, window_size=self.window, stride=1)
        self.model.model.set_params(random_state=self.seed)
        with contextlib.redirect_stdout(io.StringIO()):  # it prints its padding and shapes
            self.model.fit(np.asarray(train, dtype=float))
        return self

    def score(self, x) -> BaselineScores:
        with contextlib.redirect_stdout(io.StringIO()):
            return BaselineScores(self.model.predict(np.asarray(x, dtype=float)), None)


DETERMINISTIC = ("hotelling_t2", "pca_residual", "window_memory", "pca_residual_window")  # one seed stands
DETECTOR_MODELS = {"masked": "enc_only_anomaly", "forecast": "dec_only_anomaly"}


class Detector:
    """Our detector: the job's task trained as `train.py` trains it (`train.fit_task` on the config of
    `experiment=anomaly_benchmark model=<enc_only_anomaly | dec_only_anomaly>` and `--set` overrides),
    on a run's table with its train rows as the normal rows (their last `--val-fraction` validation);
    no label is in the table it sees."""

    def __init__(self, method: str, seed: int, overrides: list[str], val_fraction: float):
        self.name = f"ours ({method})"
        self.overrides = [
            "experiment=anomaly_benchmark", f"model={DETECTOR_MODELS[method]}", f"seed={seed}",
            f"data.val_fraction={val_fraction}", *overrides,
        ]  # fmt: skip

    def fit_run(self, table: pd.DataFrame, train_end: int):
        from omegaconf import open_dict

        from tsformer.train import fit_task

        with tempfile.TemporaryDirectory() as folder:
            cfg = composed(tuple(self.overrides), folder)
            with open_dict(cfg):
                cfg.data.target_cols = list(table.columns)
                cfg.data.train_end = int(train_end)
                cfg.data.name = "benchmark"
            with _quiet_lightning():
                self.task = fit_task(cfg, source=table.reset_index(drop=True)).task
        chosen = getattr(self.task, "hparams", {}).get("chosen_score")  # model.score=auto's choice
        if chosen:
            print(f"{self.name}: model.score=auto chose {chosen}", file=sys.stderr)
        return self

    def score(self, table: pd.DataFrame):
        return self.task.score(table.reset_index(drop=True))


@functools.cache
def _composed_once(overrides: tuple[str, ...]):
    from tsformer.train import compose_config

    return compose_config(list(overrides), tempfile.gettempdir())  # each run names its own folder


def composed(overrides: tuple[str, ...], folder: str):
    """The config of `overrides` in output folder `folder` (Hydra composes it once: a second per call)."""
    from omegaconf import OmegaConf, open_dict

    cfg = copy.deepcopy(_composed_once(overrides))
    with open_dict(cfg):
        cfg.paths.output_dir = folder
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


@contextlib.contextmanager
def _quiet_lightning():
    """Lightning's notes on devices and tips (the script prints its own figures), its warnings kept."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def timed(call, *args):
    start = time.perf_counter()
    out = call(*args)
    return out, time.perf_counter() - start


def measure(make, run: datasets.LabelledRun, args, extra: pd.DataFrame | None) -> dict:
    """One method on one run: threshold-free metrics and times from its fit on the train rows, alarm
    metrics at a threshold calibrated on the validation part of the train rows."""
    fit_rows, val_rows, cut = split_train(run, args.val_fraction, extra)
    method = make()
    if isinstance(method, Detector):  # trains once, on the fit rows, with its validation rows
        table = with_extra(run.table, extra)
        _, fit_s = timed(method.fit_run, table, run.train_end + len(table) - len(run.table))
        calibration = method
    else:  # a baseline: the published protocol on every train row; a second fit for its threshold
        _, fit_s = timed(method.fit, with_extra(run.train, extra), None)
        calibration = make().fit(fit_rows, val_rows)
    result, score_s = timed(method.score, run.table)
    score = np.asarray(result.score, dtype=float)
    if score.shape != (len(run.table),):
        raise ValueError(
            f"error: {method.name} scored {score.shape} rows of {run.name}, {len(run.table)} expected"
        )
    scored = slice(run.score_start, None)
    out = evaluate(score[scored], run.scored_label, run.scored.iloc[:, 0].to_numpy())
    val_scores = np.asarray(calibration.score(run.train).score, dtype=float)[cut:]
    threshold = calibrated(val_scores, args.false_alarm_rate)
    alarm_score = (
        score if calibration is method else np.asarray(calibration.score(run.table).score, dtype=float)
    )
    out.update(alarm_metrics(alarm_score[scored] > threshold, run.scored_label))
    out = {method.name: out | {"fit_s": fit_s, "score_s": score_s}}
    for part, values in getattr(result, "parts", {}).items():  # a hybrid's parts, beside it
        figures = evaluate(values[scored], run.scored_label, run.scored.iloc[:, 0].to_numpy())
        out[f"{method.name}, its {part}"] = figures | {"fit_s": fit_s, "score_s": score_s}
    return out


def methods(args, seed: int, file_index: int) -> dict:
    """name -> a maker of a fresh, unfitted method, for one seed and file. The baselines' seed is
    seed x 10,000 + the file's index, so that files do not share one random stream (with one stream,
    every SKAB run's random score had the same validation rows, hence the same threshold)."""
    file_seed = seed * 10_000 + file_index

    def peers() -> list:
        return [*baselines(file_seed), KMeansAD(file_seed)]

    makers = {b.name: (lambda i=i: Baseline(peers()[i])) for i, b in enumerate(peers())}
    if args.method != "none":
        makers[f"ours ({args.method})"] = lambda: Detector(args.method, seed, args.set, args.val_fraction)
    return makers


def run_dataset(name: str, args) -> pd.DataFrame:
    """One row per file x method x seed; deterministic baselines measured for the first seed only."""
    runs = (datasets.DATASETS | datasets.TUNING)[name](args.data)[: args.files or None]
    extra = datasets.skab_anomaly_free(args.data) if name == "skab" and args.skab_anomaly_free else None
    rows = []
    for index, run in enumerate(runs):
        for i, seed in enumerate(args.seeds):
            for method, make in methods(args, seed, index).items():
                if i > 0 and method in DETERMINISTIC:
                    continue  # no randomness: the first seed's figures stand for every seed
                try:
                    measured = measure(make, run, args, extra)
                except (ValueError, RuntimeError) as err:  # refused: counted, and the next goes on
                    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
                    print(f"{name} {run.name} seed {seed}: {method} refused: {reason}", file=sys.stderr)
                    measured = {method: {"refused": reason}}
                for label, figures in measured.items():
                    rows.append(
                        {
                            "file": run.name,
                            "method": label,
                            "seed": seed,
                            "config": config(args),
                            "refused": "",
                        }
                        | figures
                    )
            print(f"{name} {run.name} seed {seed}: done", file=sys.stderr, flush=True)
            if args.rows:  # as it goes, so that a run cut short keeps what it measured
                pd.DataFrame(rows).to_csv(args.rows.with_name(f"{args.rows.name}-{name}.csv"), index=False)
    return pd.DataFrame(rows)


def config(args) -> str:
    """What must agree between runs whose rows are tabulated together (`--merge`)."""
    return (
        f"method={args.method} set={args.set} false_alarm_rate={args.false_alarm_rate} "
        f"val_fraction={args.val_fraction} skab_anomaly_free={args.skab_anomaly_free}"
    )


def merged(name: str, rows: pd.DataFrame, args) -> pd.DataFrame:
    """This run's rows with those of the `--merge` runs on data set `name`; a (file, method, seed) row
    measured twice is kept once (the first: deterministic baselines are measured in every run)."""
    parts = [rows]
    for prefix in args.merge:
        path = prefix.with_name(f"{prefix.name}-{name}.csv")
        if not path.is_file():
            sys.exit(f"error: --merge {prefix}: no rows of {name} at {path}")
        earlier = pd.read_csv(path)
        if set(earlier["config"]) != {config(args)}:
            sys.exit(
                f"error: --merge {path}: measured with {sorted(set(earlier['config']))}, not {config(args)}"
            )
        parts.append(earlier)
    out = pd.concat([p for p in parts if len(p)], ignore_index=True)
    return out.drop_duplicates(["file", "method", "seed"]).reset_index(drop=True)


def mean_sd(values: pd.Series, digits: int = 3) -> str:
    if len(values) < 2 or values.std() == 0:
        return f"{values.mean():.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def refusals(rows: pd.DataFrame) -> pd.Series:
    """Per method, the (file, seed) runs it refused (`refused` holds the reason; old rows have none)."""
    refused = rows.get("refused", pd.Series("", index=rows.index)).fillna("").astype(str) != ""
    return refused.groupby(rows["method"]).sum()


def summary(rows: pd.DataFrame) -> list[str]:
    """Per method: each metric's mean over the files it scored (± sd over seeds), the runs it refused,
    times and their ratio to IsolationForest's."""
    refused = refusals(rows)
    for column in [*METRICS, "fit_s", "score_s"]:  # a refused run has no figures
        rows = rows.assign(**{column: pd.to_numeric(rows.get(column), errors="coerce")})
    per_seed = rows.groupby(["method", "seed"]).agg(
        {**{m: "mean" for m in METRICS}, "fit_s": "sum", "score_s": "sum"}
    )
    reference = per_seed.loc[REFERENCE].mean()
    head = ["method", "VUS-PR", "VUS-ROC", "AUC-PR", "AUC-ROC", "F1", "event recall", "false alarms /1000"]
    head += ["refused", "fit s", "score s", "fit / IF", "score / IF"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = per_seed.groupby("method")["vus_pr"].mean().sort_values(ascending=False).index
    for method in order:
        seeds = per_seed.loc[method]
        cells = [mean_sd(seeds[m], 1 if m == "false_alarms_per_1000" else 3) for m in METRICS]
        fit, score = seeds["fit_s"].mean(), seeds["score_s"].mean()
        cells += [
            str(int(refused.get(method, 0))),
            f"{fit:.2f}",
            f"{score:.2f}",
            f"{fit / reference['fit_s']:.2f}",
            f"{score / reference['score_s']:.2f}",
        ]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def per_file(rows: pd.DataFrame, published: pd.DataFrame | None) -> list[str]:
    """VUS-PR per file (mean over seeds), beside the published methods' on the same file."""
    table = rows.groupby(["file", "method"])["vus_pr"].mean().unstack("method")
    order = rows.groupby("method")["vus_pr"].mean().sort_values(ascending=False).index
    table = table[list(order)]
    if published is not None:
        shown = [c for c in PUBLISHED_SHOWN if c in published.columns]
        table = table.join(published[shown].rename(columns=lambda c: f"{c} (published)"))
    table.loc["mean"] = table.mean()
    head = ["file", *table.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for file, values in table.iterrows():
        cells = ["refused" if np.isnan(v) else f"{v:.3f}" for v in values]  # no figure: the method refused
        lines.append(f"| {file} | " + " | ".join(cells) + " |")
    return lines


def published_means(rows: pd.DataFrame, published: pd.DataFrame) -> list[str]:
    """Every published method's mean VUS-PR over the files of this run, with ours in the same ranking."""
    files = sorted(rows["file"].unique())
    means = {f"{m} (published)": published.loc[files, m].mean() for m in published.columns}
    means |= {m: v for m, v in rows.groupby("method")["vus_pr"].mean().items()}
    lines = ["| method | mean VUS-PR |", "|---|---|"]
    lines += [f"| {m} | {v:.3f} |" for m, v in sorted(means.items(), key=lambda kv: -kv[1])]
    return lines


def report(name: str, rows: pd.DataFrame, args, stamp: str) -> str:
    published = None
    path = args.data / "MSL" / "published_vus_pr.csv"
    if name == "msl" and path.is_file():
        published = (
            pd.read_csv(path).assign(file=lambda d: d["file"].str.removesuffix(".csv")).set_index("file")
        )
    command = " ".join(["python benchmarks/anomaly.py", *sys.argv[1:]])
    notes = [
        f"### {name}, method {args.method}",
        "",
        f"Measured {stamp} on {machine()}: `{command}`. {rows['file'].nunique()} files, seeds "
        f"{' '.join(map(str, sorted(rows['seed'].unique())))}, threshold at false-alarm rate {args.false_alarm_rate} on the last "
        f"{args.val_fraction:.0%} of the train rows"
        + ("; SKAB's anomaly-free run added to every run's train rows" if args.skab_anomaly_free else "")
        + (f"; the detector's overrides {args.set}" if args.method != "none" else "")
        + ".",
        "",
        *summary(rows),
        "",
        "VUS-PR per file (mean over seeds):",
        "",
        *per_file(rows, published),
    ]
    if published is not None:
        notes += ["", "Mean VUS-PR beside every method of TSB-AD's table (`published_vus_pr.csv`):", ""]
        notes += published_means(rows, published)
    if name == "skab":
        measured = rows.groupby("method")["vus_pr"].mean()
        notes += [
            "",
            "The issue's SKAB figures beside ours: "
            + ", ".join(f"{m} {v} (here {measured[m]:.3f})" for m, v in ISSUE_SKAB.items() if m in measured),
        ]
    return "\n".join(notes)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument(
        "--datasets",
        nargs="+",
        choices=[*datasets.DATASETS, *datasets.TUNING],
        default=list(datasets.DATASETS),
    )
    parser.add_argument("--method", choices=["masked", "forecast", "none"], default="none")
    parser.add_argument(
        "--seeds", nargs="*", type=int, default=[0, 1, 2], help="none: only tabulate the --merge rows"
    )
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        help="Hydra overrides of the detector's config, e.g. model.score=memory",
    )
    parser.add_argument("--false-alarm-rate", type=float, default=0.01)
    parser.add_argument("--val-fraction", type=float, default=0.2)
    parser.add_argument(
        "--skab-anomaly-free", action="store_true", help="add SKAB's normal run to its train rows"
    )
    parser.add_argument(
        "--files", type=int, default=0, help="only the first N files of each data set (0: all)"
    )
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "RESULTS_anomaly.md")
    parser.add_argument(
        "--tag", default="", help="the tables' name is <dataset>-<method>-TAG (two runs of one method)"
    )
    parser.add_argument(
        "--rows",
        type=Path,
        help="also write every file x method x seed row to ROWS-<dataset>.csv (to merge runs)",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=[],
        help="ROWS of earlier runs (their --rows) tabulated with this run's: same settings, other seeds",
    )
    args = parser.parse_args()
    if not args.data.is_dir():
        parser.exit(2, f"error: --data {args.data}: no such folder (see ../shared/data/anomaly/SOURCE.md)\n")
    if not args.seeds and not args.merge:
        parser.exit(2, "error: --seeds with no seed runs nothing: give seeds or --merge earlier rows\n")
    if not 0 < args.false_alarm_rate < 1 or not 0 < args.val_fraction < 1:
        parser.exit(2, "error: --false-alarm-rate and --val-fraction must lie between 0 and 1\n")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for name in args.datasets:
        text = report(name, merged(name, run_dataset(name, args), args), args, stamp)
        print(text + "\n", flush=True)
        write_results(
            args.results, text, "-".join([name, args.method, *([args.tag] if args.tag else [])]), TITLE
        )
    print(f"results: {args.results}")


if __name__ == "__main__":
    main()
