"""The `linear` baseline's fit at the test's start with the task's own solve of the same fit, and solved
again, on the forecasting recipe's ETTm1-96 (L = 512, the closed-form linear path on):

    python benchmarks/linear_baseline_reuse.py

Builds the recipe's data and task, solves the linear path as the fit's start does (`fit_linear_path`),
then times `fit_baselines` on the linear baseline twice: taking that solve (`SolvedLinear`), and with it
dropped (`solved = None`: the equations solved again, as every run did before); prints the seconds and
whether the two fits' weights and penalty are equal to the bit (RESULTS_forecast_speed.md).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from hydra.utils import instantiate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tsformer.tasks.baselines import LinearForecast, fit_baselines
from tsformer.train import build_task, compose_config

OVERRIDES = ["experiment=forecast_recipe", "data.name=ETTm1", "model.horizon=96"]


def main() -> None:
    cfg = compose_config(OVERRIDES, Path("/tmp") / "linear_baseline_reuse")
    dm = instantiate(cfg.data)
    dm.setup()
    task = build_task(cfg.model, dm)
    (linear,) = [b for b in task.baselines if isinstance(b, LinearForecast)]
    start = time.perf_counter()
    task.fit_linear_path(dm)
    path_s = time.perf_counter() - start
    args = (dm.datasets["train"], dm.features, dm.frame)
    start = time.perf_counter()
    fit_baselines([linear], *args, val=dm.datasets["val"])
    reused_s = time.perf_counter() - start
    weight, penalty = linear.model.weight.clone(), linear.model.penalty.clone()
    linear.solved = None
    start = time.perf_counter()
    fit_baselines([linear], *args, val=dm.datasets["val"])
    again_s = time.perf_counter() - start
    same = torch.equal(weight, linear.model.weight) and torch.equal(penalty, linear.model.penalty)
    print(
        f"linear path solve {path_s:.1f} s; baseline fit taking it {reused_s:.3f} s; "
        f"solved again {again_s:.1f} s; weights and penalty equal to the bit: {same}"
    )


if __name__ == "__main__":
    main()
