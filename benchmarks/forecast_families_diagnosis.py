"""Why an autoregressive family is behind (issue 56, point 5): teacher-forced against generated error.

    python benchmarks/forecast_families_diagnosis.py --row tsformer-enc_dec --steps 160
    python benchmarks/forecast_families_diagnosis.py --row tsformer-enc_dec --override model.net.feed_back=false

Trains one row of `benchmarks/ett.py` (its settings, ETTh1, L = 512) for a few optimiser steps on
random train windows (batch 32, AdamW at the row's lr), and every `--steps / 4` steps scores evenly
spaced validation windows (`--val-windows`), per horizon step, scaled units:
- TF: the teacher-forced prediction (the decoder fed the TRUE previous values, as in training);
- FREE: the forecast as validation and test make it (the decoder fed its own predictions back);
- on the same windows: persistence (the last observed value repeated), the one-step copy (each future
  value predicted by the true value before it: what teacher forcing hands the decoder), and the
  closed-form linear forecaster (train windows, penalty chosen on the validation windows).
A decoder whose TF error is the one-step copy's has learned to copy its input; its FREE error then
follows persistence's. Short runs only: not the row's figures (benchmarks/RESULTS_forecast_families.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

import ett

SHOWN_STEPS = (0, 1, 3, 7, 15, 31, 63, 95, 191, 335, 719)


def collate(ds, idx) -> dict:
    items = [ds[int(i)] for i in idx]
    return {k: torch.stack([it[k] for it in items]) for k in items[0] if torch.is_tensor(items[0][k])}


def by_step(err: torch.Tensor) -> torch.Tensor:
    return err.square().mean(dim=(0, 2))  # (B, M, Dy) -> (M,)


def line(name: str, per_step: torch.Tensor) -> str:
    shown = " ".join(f"{float(per_step[i]):.3f}" for i in SHOWN_STEPS if i < len(per_step))
    return f"  {name:<22} mse {float(per_step.mean()):.4f}   steps 1,2,4,8,16,32,64,96,...: {shown}"


def main() -> None:
    import lightning as L
    from hydra.utils import instantiate

    from tsformer.models import ChannelSharedLinear, LinearConfig
    from tsformer.tasks.baselines import window_batches
    from tsformer.train import build_task, compose_config

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--row", default="tsformer-enc_dec", choices=sorted(ett.OURS))
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--horizon", type=int, default=96)
    parser.add_argument("--val-windows", type=int, default=192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--override", action="append", default=[], help="a train.py override, after the row's"
    )
    args = parser.parse_args()
    H = args.horizon
    overrides = [
        *ett.row_overrides(args.row),
        "data.name=ETTh1",
        "model.context_len=512",
        f"model.horizon={H}",
    ]
    cfg = compose_config([*overrides, f"seed={args.seed}", *args.override], Path(tempfile.mkdtemp()))
    L.seed_everything(args.seed, verbose=False)
    dm = instantiate(cfg.data)
    dm.setup()
    task = build_task(cfg.model, dm)
    if getattr(task, "linear_path", None) is not None:
        task.fit_linear_path(dm)
    train, val = dm.datasets["train"], dm.datasets["val"]
    vb = collate(val, np.linspace(0, len(val) - 1, args.val_windows).astype(int))
    y = vb["fut_target"]
    linear = ChannelSharedLinear(LinearConfig(cfg.model.context_len, H, 0))
    linear.fit(window_batches(train), window_batches(val))
    with torch.no_grad():
        references = {
            "persistence": by_step(vb["hist_target"][:, -1:] - y),
            "one-step copy": by_step(torch.cat([vb["hist_target"][:, -1:], y[:, :-1]], dim=1) - y),
            "linear forecaster": by_step(linear(vb["hist_target"], vb["fut_known"]) - y),
        }
    print(f"{args.row} {' '.join(args.override)}, ETTh1 L=512 H={H}, {args.val_windows} validation windows:")
    for name, per_step in references.items():
        print(line(name, per_step))

    def evaluate(tag: str) -> None:
        task.eval()
        with torch.no_grad():
            b = task.static.append_to_known(vb)
            net_batch, view = task.options.enter(
                task.with_linear_path(b) if hasattr(task, "with_linear_path") else b
            )
            out, _, _ = task.teacher_forced(net_batch)
            forced = view.to_batch_layout(task.head.point_of_raw(out)[:, -H:, : task.d_target_net])
            free = task.forecast(vb)
        task.train()
        print(
            f"[{tag}]\n{line('TF (true inputs)', by_step(forced - y))}\n{line('FREE (generated)', by_step(free - y))}"
        )

    opt = torch.optim.AdamW(task.parameters(), lr=cfg.model.lr, weight_decay=cfg.model.weight_decay)
    g = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    evaluate("step 0")
    for step in range(1, args.steps + 1):
        loss = task.loss(collate(train, torch.randint(len(train), (32,), generator=g)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % max(1, args.steps // 4) == 0:
            evaluate(f"step {step}, train loss {loss.item():.4f}, {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
