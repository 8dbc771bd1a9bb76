"""The forecasting recipe's training speed before and after the fast paths (issue 56, point 3), in ONE run.

    python benchmarks/forecast_speed.py --part step                  # bare steps and validation, interleaved
    python benchmarks/forecast_speed.py --part seed                  # whole ETTm1-96 runs, before then after
    python benchmarks/forecast_speed.py --part step --rounds 3 --val-batches 2    # a quick look

Variants (each a list of train.py settings on top of `experiment=forecast_recipe`):
- before: the recipe as it is (torch's dropout, `nn.Linear`);
- after: `model.net.fast_dropout=true` (nn/dropout.py: the same model and dropout in distribution,
  other masks);
- after-bf16 (`--variants`): the same under `trainer.precision=bf16-mixed` (step part only: autocast).

`--part step` (ETTm1, L = 512, H = 96, batch 128: 896 one-channel sequences a step): each variant's
task built with the same seed, then --rounds rounds, each timing one bare step (loss + backward +
AdamW on one fixed batch) of every variant in turn, and one validation pass (`--val-batches` batches
of 256 windows, no gradient) of every variant in turn: medians and the ratio to `before` side by side,
so that the load other jobs put on the machine falls on all variants alike. Then the aten ops with the
most self time in one step of each (torch.profiler).

`--part seed`: `train.py experiment=forecast_recipe data.name=ETTm1 model.horizon=96` (benchmarks/ett.py's
`run_ours`, seed --seed) for each variant in turn: `trainer.fit` seconds (the linear path's solve, the
steps, the quarter-epoch validations), steps, seconds a step, the best validation MSE (what chose the
checkpoint), test MSE and the same run's linear forecaster; then what a 21-channel, 37,000-window row
would cost at the `after` speed, from the measured per-sequence costs (a step's cost grows with its
sequences: 128 windows x the channels).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ett import machine, run_ours

FAST = ["model.net.fast_dropout=true"]
VARIANTS = {
    "before": [],
    "after": FAST,
    "after-bf16": [*FAST, "trainer.precision=bf16-mixed"],
}
ROW = ["experiment=forecast_recipe", "data.name=ETTm1", "model.context_len=512", "model.horizon=96"]


def build(overrides: list[str]):
    """(task, datamodule, one fixed train batch, optimiser, autocast dtype or None) of a variant."""
    import lightning as L
    from hydra.utils import instantiate

    from tsformer.train import build_task, compose_config

    cfg = compose_config([*ROW, *overrides], Path(tempfile.mkdtemp()))
    L.seed_everything(0, verbose=False)
    dm = instantiate(cfg.data)
    dm.setup()
    task = build_task(cfg.model, dm)
    batch = next(iter(dm.train_dataloader()))
    optimiser = torch.optim.AdamW([p for p in task.parameters() if p.requires_grad], lr=1e-4)
    autocast = torch.bfloat16 if str(cfg.trainer.get("precision", "")).startswith("bf16") else None
    return task, dm, batch, optimiser, autocast


def autocast_or_not(dtype):
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else torch.autocast("cpu", enabled=False)


def step_of(task, batch, optimiser, dtype):
    def step():
        optimiser.zero_grad(set_to_none=True)
        with autocast_or_not(dtype):
            loss = task.loss(batch)
        loss.backward()
        optimiser.step()

    return step


def validation_of(task, dm, dtype, n_batches: int):
    batches = [b for _, b in zip(range(n_batches), dm.val_dataloader())]

    def validate():
        task.eval()
        with torch.no_grad(), autocast_or_not(dtype):
            for b in batches:
                task.forecast(b)
        task.train()

    return validate


def top_ops(step, n: int) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [(e.key, e.self_cpu_time_total / 1e3) for e in ops[:n]]


def part_step(args) -> None:
    built = {name: build(VARIANTS[name]) for name in args.variants}
    steps = {name: step_of(t, b, o, d) for name, (t, dm, b, o, d) in built.items()}
    vals = {name: validation_of(t, dm, d, args.val_batches) for name, (t, dm, b, o, d) in built.items()}
    for name in args.variants:  # warm-up: one step and one validation each
        steps[name]()
        vals[name]()
    step_s = {name: [] for name in args.variants}
    val_s = {name: [] for name in args.variants}
    for _ in range(args.rounds):  # interleaved: the machine's load falls on every variant alike
        for name in args.variants:
            start = time.perf_counter()
            steps[name]()
            step_s[name].append(time.perf_counter() - start)
        for name in args.variants:
            start = time.perf_counter()
            vals[name]()
            val_s[name].append(time.perf_counter() - start)
    dm = built[args.variants[0]][1]
    n_val, n_train = len(dm.datasets["val"]), len(dm.train_dataloader())
    print(f"{' '.join(ROW)}, batch 128 ({machine()})")
    print(f"  {args.rounds} interleaved rounds; validation: {args.val_batches} batches of 256 windows a pass")
    print(
        "| variant | settings | bare step ms (median) | x before | validation ms a batch (median) | x before |"
    )
    print("|---|---|---|---|---|---|")
    base_step = statistics.median(step_s[args.variants[0]])
    base_val = statistics.median(val_s[args.variants[0]])
    for name in args.variants:
        s, v = statistics.median(step_s[name]), statistics.median(val_s[name])
        print(
            f"| {name} | {' '.join(VARIANTS[name]) or '(the recipe)'} | {s * 1e3:.0f} | {base_step / s:.2f} | "
            f"{v / args.val_batches * 1e3:.0f} | {base_val / v:.2f} |"
        )
    print(f"  every round's step ms: { {k: [round(x * 1e3) for x in v] for k, v in step_s.items()} }")
    print(f"  an epoch is {n_train} steps; a validation pass {n_val} windows")
    for name in args.variants:
        ops = ", ".join(f"{op} {ms:.0f}" for op, ms in top_ops(steps[name], args.top))
        print(f"  {name}: the ops with the most self time in one step (ms): {ops}")


def part_seed(args) -> None:
    out = Path(tempfile.mkdtemp())
    rows = {}
    for name in args.variants:
        run_args = argparse.Namespace(
            epochs=2, seed=args.seed, max_train_batches=None, quick=False, override=VARIANTS[name]
        )
        start = time.perf_counter()
        r = run_ours("tsformer-recipe", "ETTm1", 512, 96, run_args, out / name)
        r["wall_s"] = time.perf_counter() - start
        rows[name] = r
        print(f"  {name}: {r}", flush=True)
    print(f"ETTm1, L = 512, H = 96, seed {args.seed} ({machine()})")
    print(
        "| variant | fit s | steps | fit s a step | whole run s | best val MSE | test MSE | linear (same run) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    base = rows[args.variants[0]]
    for name, r in rows.items():
        print(
            f"| {name} | {r['train_s']:.0f} ({base['train_s'] / r['train_s']:.2f}x) | {r['steps']} | "
            f"{r['train_s'] / r['steps']:.2f} | {r['wall_s']:.0f} ({base['wall_s'] / r['wall_s']:.2f}x) | "
            f"{r['best_val_mse']:.4f} | {r['mse']:.4f} | {r['linear_mse_same_run']:.4f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("step", "seed"), required=True)
    parser.add_argument("--variants", nargs="+", default=None, help=f"of {list(VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--val-batches", type=int, default=4)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.variants is None:
        args.variants = list(VARIANTS) if args.part == "step" else ["before", "after"]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        print(f"error: --variants {unknown}: choose among {list(VARIANTS)}", file=sys.stderr)
        raise SystemExit(2)
    part_step(args) if args.part == "step" else part_seed(args)


if __name__ == "__main__":
    main()
