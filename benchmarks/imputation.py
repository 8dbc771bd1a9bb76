"""Imputation on ETT with the Time-Series-Library protocol (issue 28): masked fill-in beside linear
interpolation on the same masks, and the published TimesNet figures.

    OMP_NUM_THREADS=1 python benchmarks/imputation.py                 # ETTh1 and ETTm1, the 4 ratios
    python benchmarks/imputation.py --datasets ETTh1 --ratios 0.125 --override model.interpolate_hidden=false
    python benchmarks/imputation.py --quick --results /tmp/RESULTS.md  # tiny settings: checks the script runs

Protocol (TSLib's `Dataset_ETT_hour` / `_minute` with `task_name=imputation`; conf/experiment/
imputation_ett.yaml): the 7 channels of ETTh1 or ETTm1, rows [0, 8640) train, [8640, 11520) validation,
[11520, 14400) test (x4 for ETTm1), StandardScaler fitted on the train rows; windows of 96 steps;
every value hidden on its own with probability r = 0.125 / 0.25 / 0.375 / 0.5, a new mask per
training batch, one fixed mask per validation and test window (`model.eval_mask_seed`); MSE and MAE
on the hidden values of every test window, on the scaled values. Our test windows are those whose 96
steps all lie in the test rows (stride 1: 2785 for ETTh1, 11425 for ETTm1); TSLib's test set also
starts 96 rows earlier (its windows reach into the validation rows: 2881 and 11521).

Each row is an ordinary `train.run` of `python train.py experiment=imputation_ett data.name=<d>
model.mask_ratio=<r>` (no MLflow logger), trained `--epochs` epochs of at most `--max-train-batches`
batches of 32 windows, the best validation epoch's checkpoint tested. `val_mse` is the validation
MSE on the hidden values (what settings are chosen by); `interp_*` is linear interpolation between
the nearest kept values of the same window and channel, on the same test masks.

The table goes to `--results` between the lines `<!-- table NAME -->` and `<!-- /table NAME -->`
(`--table NAME`, default main); the rest of the file, the notes written by hand, is kept.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

RATIOS = (0.125, 0.25, 0.375, 0.5)
# TSLib's TimesNet scripts reproduced on ETTh1 (thuml/Time-Series-Library issue #775): test MSE
PUBLISHED_TIMESNET_ETTH1 = {0.125: 0.0619, 0.25: 0.0803, 0.375: 0.0974, 0.5: 0.1159}
QUICK = [
    "model.net.d_model=16",
    "model.net.n_heads=2",
    "model.net.n_layers=1",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=2",
    "data.eval_stride=50",
]


def machine() -> str:
    import torch

    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    return f"CPU {platform.machine()}, {os.cpu_count()} cores, OMP_NUM_THREADS={threads}, torch {torch.__version__}"


def overrides_of(dataset: str, ratio: float, args) -> list[str]:
    out = [
        "experiment=imputation_ett",
        f"data.name={dataset}",
        f"model.mask_ratio={ratio}",
        f"trainer.max_epochs={args.epochs}",
        f"seed={args.seed}",
        "logger=none",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
    ]
    if args.max_train_batches:
        out.append(f"trainer.limit_train_batches={args.max_train_batches}")
    return out + (QUICK if args.quick else []) + args.override


def run_row(dataset: str, ratio: float, args, out_root: Path) -> dict:
    from tsformer.train import compose_config, run

    cfg = compose_config(overrides_of(dataset, ratio, args), out_root / f"{dataset}-{ratio}")
    start = time.perf_counter()
    result = run(cfg)
    seconds = time.perf_counter() - start
    m = result.metrics
    return {
        "dataset": dataset,
        "ratio": ratio,
        "mse": m["test/mse"],
        "mae": m["test/mae"],
        "interp_mse": m["test/baseline_mse"],
        "interp_mae": m["test/baseline_mae"],
        "val_mse": result.best_val,
        "timesnet_mse": PUBLISHED_TIMESNET_ETTH1.get(ratio) if dataset == "ETTh1" else None,
        "seconds": seconds,
    }


def test_windows(dataset: str) -> int:
    from hydra.utils import instantiate

    from tsformer.train import compose_config

    cfg = compose_config(["experiment=imputation_ett", f"data.name={dataset}"], Path(tempfile.mkdtemp()))
    dm = instantiate(cfg.data)
    dm.setup()
    return dm.n_windows("test")


def fmt(v, column: str) -> str:
    if v is None:
        return "-"
    if column == "seconds":
        return f"{v:.0f}"
    return f"{v:.4f}" if isinstance(v, float) and column != "ratio" else str(v)


def table(rows: list[dict], windows: dict[str, int], args, stamp: str) -> str:
    columns = [
        "dataset",
        "ratio",
        "mse",
        "mae",
        "interp_mse",
        "interp_mae",
        "timesnet_mse",
        "val_mse",
        "seconds",
    ]
    lines = [
        f"Measured {stamp} on {machine()}: `{' '.join(['python benchmarks/imputation.py', *sys.argv[1:]])}`",
        f"(settings of each row: `{' '.join(overrides_of('<dataset>', '<ratio>', args))}`; test windows: "
        + ", ".join(f"{d} {n}" for d, n in windows.items())
        + "; `seconds`: the whole run, fit and test).",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    lines += ["| " + " | ".join(fmt(r[c], c) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_results(
    path: Path, text: str, name: str, title: str = "# Imputation on ETT (benchmarks/imputation.py)"
) -> None:
    """`text` into the file at `path` between `<!-- table NAME -->` and `<!-- /table NAME -->` (a new
    file starts with `title`)."""
    begin, end = f"<!-- table {name} -->", f"<!-- /table {name} -->"
    block = f"{begin}\n{text}\n{end}"
    old = path.read_text() if path.is_file() else ""
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end) :]
    else:
        new = (old + "\n\n" if old else title + "\n\n") + block + "\n"
    path.write_text(new)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", default="ETTh1,ETTm1")
    parser.add_argument("--ratios", default=",".join(str(r) for r in RATIOS))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-train-batches", type=int, default=500, help="per epoch; 0: all")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--override", action="append", default=[], help="a train.py override for every row")
    parser.add_argument("--quick", action="store_true", help="tiny settings: checks that the script runs")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "RESULTS_imputation.md")
    parser.add_argument("--table", default="main", help="which table of --results this run writes")
    args = parser.parse_args()
    datasets = args.datasets.split(",")
    ratios = [float(r) for r in args.ratios.split(",")]
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    windows = {d: test_windows(d) for d in datasets}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        old = os.getcwd()
        os.chdir(tmp)  # checkpoints and model folders of the rows: not kept
        try:
            for dataset in datasets:
                for ratio in ratios:
                    rows.append(run_row(dataset, ratio, args, Path(tmp)))
                    print(table(rows, windows, args, stamp), flush=True)
        finally:
            os.chdir(old)
    write_results(args.results, table(rows, windows, args, stamp), args.table)
    print(f"results: {args.results}")


if __name__ == "__main__":
    main()
