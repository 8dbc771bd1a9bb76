"""The closed-form linear forecaster on ETT, setting by setting: the validation MSE of every penalty and
of each reference (`subtract`), the one validation chooses, and its test MSE (issue 48).

    python benchmarks/linear_ett.py                                # ETTh1, L = 512, the four horizons
    python benchmarks/linear_ett.py --datasets ETTh1,ETTm1 --subtract last,mean

The forecaster is `models/linear.py` as `model=linear` and every run's `linear` baseline use it, on the
windows of conf/data/ett.yaml (every window, scaled values). The choice among references is made here
on validation too (the model's default is `last`); test MSE is printed for every setting so that the
reader sees what validation's choice costs or gains, never to choose.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))


def test_mse(model, dataset) -> float:
    from tsformer.tasks.baselines import window_batches

    squared, count = 0.0, 0
    with torch.no_grad():
        for batch in window_batches(dataset):
            error = (model(batch["hist_target"], batch["fut_known"]) - batch["fut_target"]).double()
            squared += float((error**2).sum())
            count += error.numel()
    return squared / count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", default="ETTh1")
    parser.add_argument("--lookback", type=int, default=512)
    parser.add_argument("--horizons", default="96,192,336,720")
    parser.add_argument("--subtract", default="last,mean")
    args = parser.parse_args()

    from hydra.utils import instantiate

    from tsformer.models.linear import ChannelSharedLinear, LinearConfig
    from tsformer.tasks.baselines import window_batches
    from tsformer.train import compose_config

    print(
        "| dataset | H | subtract | validation MSE by penalty | chosen | its validation MSE | test MSE | fit s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.datasets.split(","):
        for H in (int(h) for h in args.horizons.split(",")):
            overrides = ["experiment=ett", f"data.name={name}", f"model.context_len={args.lookback}"]
            cfg = compose_config([*overrides, f"model.horizon={H}"], Path(tempfile.mkdtemp()))
            dm = instantiate(cfg.data)
            dm.setup()
            for subtract in args.subtract.split(","):
                model = ChannelSharedLinear(LinearConfig(args.lookback, H, 0, subtract))
                start = time.perf_counter()
                scores = model.fit(window_batches(dm.datasets["train"]), window_batches(dm.datasets["val"]))
                seconds = time.perf_counter() - start
                chosen = float(model.penalty)
                by_penalty = ", ".join(f"{p:g}: {v:.4f}" for p, v in scores.items())
                print(
                    f"| {name} | {H} | {subtract} | {by_penalty} | {chosen:g} | {scores[chosen]:.4f} | "
                    f"{test_mse(model, dm.datasets['test']):.4f} | {seconds:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
