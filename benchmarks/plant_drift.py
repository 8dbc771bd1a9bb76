"""State reconstruction on the simulated plant when its heater ages: the model trained before the drift,
refitted with `init_from` on the first hours after it.

    python benchmarks/plant_drift.py            # seeds 0, 1, 2
    python benchmarks/plant_drift.py --quick    # tiny settings, one seed: checks the script runs

The plant (`simulate_plant`, 3 series, 6000 one-minute steps) heats 15 % more from 70 % of its steps on
(`heating_drift`, `drift_start`): 2024-01-03 22:00. `experiment=state_reconstruction` is trained on the
steps before 2024-01-03 08:40 and validated up to the drift. The refit (`init_from`, every weight or the
output layer alone, learning rates below) trains on the drift's first 10 hours (`data.train_start`),
is validated on the next 5 and tested on the last 15, where the model as it was, a model trained from
scratch on the same rows and the per-series linear regression refitted on them (the run's `baseline`)
are measured on the same windows. The refit is chosen on its validation MSE.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from examples import mean_sd
from gas_turbine import UNCHANGED

from tsformer.train import compose_config, run

DRIFT = ["data.source.heating_drift=0.15", "data.source.drift_start=0.7"]
BEFORE = ["data.val_start='2024-01-03 08:40'", "data.test_start='2024-01-03 22:00'"]
AFTER = [
    "data.train_start='2024-01-03 22:00'",
    "data.val_start='2024-01-04 08:00'",
    "data.test_start='2024-01-04 13:00'",
    "model.warmup_steps=0",
]
REFITS = {
    "every weight, lr 0.0003": ["model.lr=3e-4"],
    "every weight, lr 0.001": ["model.lr=1e-3"],
    "output layer, lr 0.01": ["init_from_freeze=true", "model.lr=1e-2"],
}
COMMON = [
    "experiment=state_reconstruction",
    *DRIFT,
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "logger.mlflow.experiment_name=plant_drift_benchmark",
]
QUICK = ["trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2"]


def rows_of(results: list, label: str, baseline: bool) -> list[dict]:
    """Test MSE (scaled) and MAE (original units) per state, of the model or of its run's baseline."""
    prefix = "test/baseline_" if baseline else "test/"
    m = [r.metrics for r in results]
    return [
        {
            "model / baseline": label,
            "mse (scaled)": mean_sd([x[f"{prefix}mse"] for x in m]),
            "MAE temperature": mean_sd([x[f"{prefix}mae_orig/dynamic_temperature"] for x in m]),
            "MAE pressure": mean_sd([x[f"{prefix}mae_orig/dynamic_pressure"] for x in m]),
        }
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="tiny settings and one seed (a smoke run)")
    args = parser.parse_args()
    seeds, extra = (args.seeds[:1], QUICK) if args.quick else (args.seeds, [])
    root = Path(tempfile.mkdtemp(prefix="tsformer-plant-drift-"))

    def train(overrides: list[str], out: str):
        return run(compose_config([*COMMON, *overrides, *extra], root / out))

    before = [train([*BEFORE, f"seed={s}"], f"before/{s}") for s in seeds]
    print(f"\nTrained before the drift, tested on everything after it (seeds {seeds}):\n")
    table = rows_of(before, "Transformer", False) + rows_of(before, "  linear regression", True)
    print(pd.DataFrame(table).to_markdown(index=False))

    refits, val_rows = {}, []
    for i, (label, overrides) in enumerate(REFITS.items()):
        refits[label] = [
            train([*AFTER, f"init_from={b.model_folder}", *overrides, f"seed={s}"], f"refit/{i}-{s}")
            for s, b in zip(seeds, before)
        ]
        vals = [r.best_val for r in refits[label]]
        val_rows.append(
            {"refit": label, "val/mse (hours 10-15 after the drift)": mean_sd(vals), "m": np.mean(vals)}
        )
    table = pd.DataFrame(val_rows).sort_values("m")
    chosen = str(table.iloc[0]["refit"])
    print("\nRefits on the first 10 hours after the drift:\n")
    print(table.drop(columns="m").to_markdown(index=False))
    as_was = [
        train([*AFTER, f"init_from={b.model_folder}", *UNCHANGED, f"seed={s}"], f"as_was/{s}")
        for s, b in zip(seeds, before)
    ]
    scratch = [train([*AFTER, f"seed={s}"], f"scratch/{s}") for s in seeds]
    print(f"\nTest: the last 15 hours (seeds {seeds}); chosen on validation: {chosen}\n")
    out = [
        *rows_of(as_was, "model trained before the drift, as it was", False),
        *rows_of(refits[chosen], f"refitted: {chosen}", False),
        *rows_of(refits[chosen], "  linear regression, refitted on the same rows", True),
        *rows_of(scratch, "trained from scratch on the same rows", False),
    ]
    print(pd.DataFrame(out).to_markdown(index=False))


if __name__ == "__main__":
    main()
