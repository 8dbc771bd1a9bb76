"""Issue 7's acceptance figures: calibration and CRPS of the probabilistic heads, and path coherence.

    python benchmarks/probabilistic.py                       # plant and T1 wind, dec_only and enc_dec, 3 heads
    python benchmarks/probabilistic.py --datasets plant --families dec_only --heads student_t --quick

1. For each data set (the simulated plant, `data=plant`; T1 wind, `experiment=wind_scada`), family
   (`dec_only`, `enc_dec`) and head (`gaussian`, `student_t`, `quantile`), one ordinary training run
   (`train.run`, logged to ./mlflow.db, experiment `probabilistic-benchmark`) and its test metrics:
   coverage and width of the central 80% interval, CRPS (original units), beside the probabilistic
   baseline's on the same windows (persistence plus the empirical quantiles of its own validation
   errors by step). Acceptance: coverage in [0.75, 0.85] and CRPS below the baseline's. The runs
   calibrate their spread as configured (`model.head.calibrate`, rolling over
   `model.head.calibration_window`, the defaults); the table also gives the validation coverage of
   the spread as trained.
2. Coherence on T1 (acceptance 2): the lag-1 autocorrelation of the step-to-step changes of the
   sampled paths of every test window, of the real series over the same windows, and of independent
   marginal draws with exactly the same per-step quantiles (the paths' values at each step shuffled
   across paths, separately per step: the marginals are kept, the joint is broken). The sampled
   paths should be within 0.1 of the real series; the independent draws should not. Paths as the
   model samples them, and calibrated with the model folder's latest factors (`predict.py`'s).

Sizes (printed with the results) are kept small for a shared 2-core CPU: test windows every
`--eval-stride` origins (every one of them evaluated); the numbers are one run, one seed.
Nothing here is tuned on the test split: the settings are fixed before the run.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate

from tsformer.jobs.forecasting.forecaster import Forecaster
from tsformer.tasks.probabilistic import lag1_autocorrelation_of_changes
from tsformer.train import compose_config, run

DATASETS = {
    # the plant: a smaller model than the defaults so that 6 runs fit a CPU afternoon, and a longer
    # series (20,000 one-minute steps per series, the test period 2 days of each of 3): with the
    # default 6,000 (a test period of 14 hours) one run's coverage has a standard error of 0.02-0.075
    # (block bootstrap over 6-hour blocks), as wide as the acceptance band itself
    "plant": [
        "data=plant",
        "data.source.n_steps=20000",
        "model.net.d_model=32",
        "trainer.max_epochs=4",
        "data.train_stride=2",
    ],
    "wind_scada": ["experiment=wind_scada"],
}
COMMON = [
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "logger.mlflow.experiment_name=probabilistic-benchmark",
    "n_plot_windows=4",
]


def coverage_standard_error(forecasts, block: str = "6h", n_boot: int = 2000, seed: int = 0) -> float:
    """Block-bootstrap standard error of the 80% interval's coverage of a forecasts frame (the CSV's
    rows): errors of nearby origins are correlated, so whole blocks (series x `block` of origins) are
    resampled, not single rows."""
    covered = (forecasts.y_true >= forecasts["q0.1"]) & (forecasts.y_true <= forecasts["q0.9"])
    blocks = covered.groupby([forecasts.series_id, forecasts.origin_time.dt.floor(block)]).agg(
        ["sum", "size"]
    )
    idx = np.random.default_rng(seed).integers(0, len(blocks), (n_boot, len(blocks)))  # (n_boot, n_blocks)
    hits, n = blocks["sum"].to_numpy(), blocks["size"].to_numpy()
    return float((hits[idx].sum(axis=1) / n[idx].sum(axis=1)).std())


def shuffled_across_paths(paths: np.ndarray, rng) -> np.ndarray:
    """`(W, S, M)` -> per window and step, the S values in a random order: same marginals, no joint."""
    W, S, M = paths.shape
    shuffled = paths.copy()
    for m in range(M):
        order = rng.permuted(np.tile(np.arange(S), (W, 1)), axis=1)  # (W, S)
        shuffled[:, :, m] = np.take_along_axis(paths[:, :, m], order, axis=1)
    return shuffled


def coherence(model_folder: Path, overrides: list[str], output_dir: Path, seed: int = 0) -> dict[str, float]:
    """Acceptance 2's figures on the test windows of the run's data (first target): the paths as
    the model samples them (`as_trained`) and as calibrated with the model folder's latest spread
    factors (what `predict.py` gives), each beside independent draws with the same marginals."""
    cfg = compose_config(overrides, output_dir)
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    task = Forecaster.load(model_folder).task
    torch.manual_seed(seed)
    sampled, calibrated, real = [], [], []
    with torch.no_grad():
        for batch in datamodule.test_dataloader():
            dist = task.forecast_distribution(batch, calibrated=False)
            sampled.append(dist.samples[..., 0].numpy())  # (B, S, M) first target
            calibrated.append(dist.with_spread_scale(task.spread_scale).samples[..., 0].numpy())
            real.append(batch["fut_target"][..., 0].numpy())  # (B, M)
    truth = np.concatenate(real)  # (W, M)
    rng = np.random.default_rng(seed)
    figures = {"real": lag1_autocorrelation_of_changes(truth)}
    for name, chunks in (("as_trained", sampled), ("calibrated", calibrated)):
        paths = np.concatenate(chunks)  # (W, S, M)
        W, S, M = paths.shape
        figures[name] = lag1_autocorrelation_of_changes(paths.reshape(W * S, M))
        figures[f"{name}_independent"] = lag1_autocorrelation_of_changes(
            shuffled_across_paths(paths, rng).reshape(W * S, M)
        )
    return {"windows": W, "paths": S, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", default="plant,wind_scada")
    parser.add_argument("--families", default="dec_only,enc_dec")
    parser.add_argument("--heads", default="gaussian,student_t,quantile")
    parser.add_argument(
        "--eval-stride", type=int, default=6, help="test (and validation) windows every N origins"
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny settings: checks the script, not the figures"
    )
    parser.add_argument("--out", default=None, help="output folder of the runs (default: a temporary one)")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a train.py override for every run (repeatable), after the data set's own, "
        "e.g. --override trainer.max_epochs=8",
    )
    args = parser.parse_args()
    logging.getLogger("lightning").setLevel(logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    out = Path(args.out or tempfile.mkdtemp(prefix="tsformer-prob-"))
    rows, coherent = [], []
    for dataset in args.datasets.split(","):
        for family in args.families.split(","):
            for head in args.heads.split(","):
                overrides = [
                    *DATASETS[dataset],
                    f"model={family}",
                    f"head={head}",
                    *COMMON,
                    f"data.eval_stride={args.eval_stride}",
                    *args.override,
                ]
                if args.quick:
                    overrides += [
                        "trainer.max_epochs=1",
                        "trainer.limit_train_batches=3",
                        "trainer.limit_val_batches=2",
                        "model.net.d_model=16",
                        "model.head.num_samples=10",
                    ]
                folder = out / f"{dataset}-{family}-{head}"
                start = time.perf_counter()
                result = run(compose_config(overrides, folder))
                seconds = time.perf_counter() - start
                m = result.metrics
                se = coverage_standard_error(result.forecasts)
                rows.append(
                    (
                        dataset,
                        family,
                        head,
                        m["test/coverage_80"],
                        se,
                        m["test/width_80_orig"],
                        m["test/crps_orig"],
                        m["test/baseline_coverage_80"],
                        m["test/baseline_width_80_orig"],
                        m["test/baseline_crps_orig"],
                        m["test/mae_orig"],
                        m.get("calibration/val_coverage_80_as_trained", float("nan")),
                        seconds,
                    )
                )
                print(f"done {dataset} {family} {head}: {seconds:.0f} s, run {result.run_id}", flush=True)
                if dataset == "wind_scada":
                    c = coherence(result.model_folder, overrides, folder / "coherence")
                    coherent.append((family, head, c))
                    print(f"coherence {family} {head}: {c}", flush=True)

    print()
    print(
        f"runs in {out}; eval_stride={args.eval_stride}; quick={args.quick}; overrides={args.override}; "
        f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    )
    print(
        "coverage_80 SE: block-bootstrap standard error of that coverage (6-hour blocks of origins per series)"
    )
    print(
        "| data | family | head | coverage_80 | coverage_80 SE | width_80 | CRPS | baseline coverage_80 | baseline width_80 | "
        "baseline CRPS | MAE | val coverage_80 as trained | accepted | train+test s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for data, family, head, cov, se, width, crps, bcov, bwidth, bcrps, mae, raw, seconds in rows:
        ok = 0.75 <= cov <= 0.85 and crps < bcrps
        print(
            f"| {data} | {family} | {head} | {cov:.3f} | {se:.3f} | {width:.4g} | {crps:.4g} | {bcov:.3f} | {bwidth:.4g} | "
            f"{bcrps:.4g} | {mae:.4g} | {raw:.3f} | {'yes' if ok else 'no'} | {seconds:.0f} |"
        )
    if coherent:
        print()
        print(
            "lag-1 autocorrelation of step-to-step changes, T1 test windows (acceptance 2: sampled within 0.1 of real)"
        )
        print(
            "| family | head | windows x paths | real series | paths as trained | their independent draws | "
            "calibrated paths | their independent draws |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for family, head, c in coherent:
            print(
                f"| {family} | {head} | {c['windows']} x {c['paths']} | {c['real']:.3f} | {c['as_trained']:.3f} | "
                f"{c['as_trained_independent']:.3f} | {c['calibrated']:.3f} | {c['calibrated_independent']:.3f} |"
            )


if __name__ == "__main__":
    main()
