"""The gas turbine (encoder-only state reconstruction of CO and NOX): settings chosen on the validation
year, then the 2014 recalibration with `init_from`.

    python benchmarks/gas_turbine.py select   # grid on validation 2013; test 2014 of the chosen setting only
    python benchmarks/gas_turbine.py refit    # select, then refit each seed's model on Jan-Feb 2014
    python benchmarks/gas_turbine.py select --quick   # tiny settings, one seed: checks the script runs

Every run is an ordinary `train.py` run of `experiment=gas_turbine` (train 2011-2012, validate 2013,
test 2014), logged to MLflow in ./mlflow.db (experiment "gas_turbine_benchmark"); this script only
composes the configs, repeats them over seeds and tabulates.

`select`: every setting of `GRID` with every seed; the setting with the lowest mean best `val/mae` (the
scaled MAE of CO and NOX on 2013, the runs' checkpoint monitor) is chosen, and only its runs' 2014 test
figures are printed, beside the per-row baselines measured on the same windows. The other settings'
test figures are not read.

`refit`: the chosen setting's model of each seed, refitted (`init_from`, every weight, the model's own
scalers) with `experiment=gas_turbine_refit`: trained on Jan 1 - Feb 14 2014, validated on Feb 15-28,
tested on Mar 1 2014 onward: every weight, or the output layer alone (`init_from_freeze=true`), at a few
learning rates, the way with the lowest validation MAE on that fortnight chosen. Beside it,
on the same test windows: the model as it was (`UNCHANGED`), a model trained from scratch on
the same rows, and the per-row baselines refitted on the same rows (the linear regression is the run's
`baseline`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from examples import mean_sd

from tsformer.train import compose_config, run

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "gas_turbine"
COMMON = [
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "logger.mlflow.experiment_name=gas_turbine_benchmark",
]
QUICK = ["trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2"]
# what the 2014 drift made the earlier configuration pick by the test year: here chosen on 2013
GRID = {
    f"dropout {d}, linear skip {s}": [f"model.net.dropout={d}", f"model.net.linear_skip={s}"]
    for d in (0.0, 0.1, 0.3)
    for s in ("false", "true")
}
# every weight, or the output layer alone (init_from_freeze): a few weeks of one season may be enough
# to shift and rescale the outputs, and too few to retrain 26k weights
REFITS = {
    **{f"every weight, lr {lr:g}": [f"model.lr={lr}"] for lr in (1e-4, 3e-4, 1e-3)},
    **{f"output layer, lr {lr:g}": ["init_from_freeze=true", f"model.lr={lr}"] for lr in (1e-3, 3e-3, 1e-2)},
}
# the model as it was, tested on the refit's windows: one epoch at a learning rate that moves no weight
UNCHANGED = ["model.lr=1e-12", "model.weight_decay=0.0", "trainer.max_epochs=1"]
WHO = {"": "model", "baseline_": "linear regression", "baseline_hgb_": "gradient boosting",
       "baseline_mlp_": "MLP"}  # fmt: skip


def train(overrides: list[str], out: Path):
    return run(compose_config([*overrides, *COMMON], out))


def test_rows(results: list, label: str, baselines: bool) -> list[dict]:
    """Test MAE (original units) of the model and, with `baselines`, of each per-row baseline."""
    rows = []
    for prefix, who in WHO.items():
        if prefix and (not baselines or f"test/{prefix}mae_orig" not in results[0].metrics):
            continue
        m = [r.metrics for r in results]
        rows.append(
            {
                "model / baseline": label if not prefix else f"  {who}",
                "MAE": mean_sd([x[f"test/{prefix}mae_orig"] for x in m]),
                "RMSE": mean_sd([x[f"test/{prefix}rmse_orig"] for x in m]),
                "CO MAE": mean_sd([x[f"test/{prefix}mae_orig/CO"] for x in m]),
                "NOX MAE": mean_sd([x[f"test/{prefix}mae_orig/NOX"] for x in m]),
            }
        )
    return rows


def select(seeds: list[int], root: Path, quick: bool, chosen: str | None) -> tuple[str, list]:
    """Every GRID setting over `seeds` (or `chosen` alone); prints the validation table; the chosen
    setting and its runs."""
    extra = QUICK if quick else []
    grid = dict(list(GRID.items())[:2]) if quick else GRID
    if chosen:
        grid = {chosen: GRID[chosen]}
    results, rows = {}, []
    for i, (label, overrides) in enumerate(grid.items()):
        results[label] = [
            train(["experiment=gas_turbine", *overrides, *extra, f"seed={s}"], root / "select" / f"{i}-{s}")
            for s in seeds
        ]
        vals = [r.best_val for r in results[label]]
        rows.append({"setting": label, "val/mae (2013, scaled)": mean_sd(vals), "mean": np.mean(vals)})
    table = pd.DataFrame(rows).sort_values("mean")
    chosen = str(table.iloc[0]["setting"])
    print(f"\nValidation year 2013, best val/mae of each run, seeds {seeds}:\n")
    print(table.drop(columns="mean").to_markdown(index=False))
    print(f"\nchosen on 2013: {chosen}; its test year 2014 (original units, mean ± sd over seeds):\n")
    print(pd.DataFrame(test_rows(results[chosen], chosen, baselines=True)).to_markdown(index=False))
    return chosen, results[chosen]


def refit(chosen: str, sources: list, seeds: list[int], root: Path, quick: bool) -> None:
    """Refit each seed's model on Jan 1 - Feb 14 2014 (the way chosen on Feb 15-28), test from March."""
    base = ["experiment=gas_turbine_refit", *GRID[chosen], *(QUICK if quick else [])]
    variants = dict(list(REFITS.items())[:1]) if quick else REFITS
    results, rows = {}, []
    for i, (label, overrides) in enumerate(variants.items()):
        results[label] = [
            train(
                [*base, f"init_from={src.model_folder}", *overrides, f"seed={s}"], root / "refit" / f"{i}-{s}"
            )
            for s, src in zip(seeds, sources)
        ]
        vals = [r.best_val for r in results[label]]
        rows.append(
            {"refit": label, "val/mae (Feb 15-28 2014, scaled)": mean_sd(vals), "mean": np.mean(vals)}
        )
    table = pd.DataFrame(rows).sort_values("mean")
    print("\nRefits on Jan 1 - Feb 14 2014, validated on Feb 15-28:\n")
    print(table.drop(columns="mean").to_markdown(index=False))
    # the best on validation of each kind (every weight / the output layer alone), the first one chosen
    best = list(dict.fromkeys(table.refit.map(lambda label: label.split(",")[0])).keys())
    shown = [next(label for label in table.refit if label.startswith(kind)) for kind in best]
    as_was = [
        train([*base, f"init_from={src.model_folder}", *UNCHANGED, f"seed={s}"], root / "as_was" / str(s))
        for s, src in zip(seeds, sources)
    ]
    scratch = [train([*base, f"seed={s}"], root / "scratch" / str(s)) for s in seeds]
    print(f"\nTest from Mar 1 2014 (original units, mean ± sd over seeds {seeds}); chosen: {shown[0]}\n")
    out = [*test_rows(as_was, "2011-12 model as it was (no refit)", baselines=False)]
    for i, label in enumerate(shown):
        out += test_rows(results[label], f"refitted: {label}", baselines=i == 0)
    out += test_rows(scratch, "trained from scratch on the refit rows", baselines=False)
    print(pd.DataFrame(out).to_markdown(index=False))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("stage", choices=["select", "refit"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="tiny settings and one seed (a smoke run)")
    parser.add_argument(
        "--chosen", choices=list(GRID), help="train this setting alone (an earlier select chose it)"
    )
    args = parser.parse_args()
    if not SHARED.exists():
        sys.exit(f"{SHARED} not found: the gas turbine year files are needed (docs/data.md)")
    seeds = args.seeds[:1] if args.quick else args.seeds
    root = Path(tempfile.mkdtemp(prefix="tsformer-gas-turbine-"))
    chosen, sources = select(seeds, root, args.quick, args.chosen)
    if args.stage == "refit":
        refit(chosen, sources, seeds, root, args.quick)


if __name__ == "__main__":
    main()
