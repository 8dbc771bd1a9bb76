"""Where an ETT training step's time goes (issue 48, point 6): the model's step against its FLOPs and a
plain matrix product of the same FLOPs, the data loader, Lightning's loop, and validation's share of an
epoch.

    python benchmarks/profile_step.py                       # ETTh1, L = 512, H = 96, the ETTh1 recipe
    python benchmarks/profile_step.py --dataset ETTm1 --horizon 720 --steps 10
    python benchmarks/profile_step.py --row tsformer-patchtst --override model.net.dropout=0

The model is the row `tsformer-patchtst-small` of benchmarks/ett.py (our best ETTh1 rows at L = 512:
PatchTST's ETTh1 sizes, batch 128) unless --row/--override say otherwise. Figures, all wall clock on
this machine, printed as measured:
- step: `task.loss` + backward + AdamW on one fixed batch (median of --steps), the model's own work;
- FLOPs of that step (torch.utils.flop_counter: forward + backward), and the seconds a single
  `torch.mm` of the same FLOPs takes: the step's speed as a fraction of the machine's matmul speed;
- loader: drawing a batch from the run's train DataLoader (windows cut and collated), per batch;
- Lightning: `trainer.fit` of --steps batches, no validation, per step (loop, logging, loader included);
- the aten ops that take the most time in a step (torch.profiler's self time);
- validation: Lightning's `trainer.validate` over every validation window (`validation_step`: one
  forward pass a batch where the loss is the point forecast's, `WindowTask.loss_of_forecast`), against
  a training epoch at the measured step time.
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

from ett import OURS, row_overrides


def timed(fn, repeats: int) -> float:
    """Median wall-clock seconds of `repeats` calls of `fn`, after one call that warms up."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def top_ops(step, n: int) -> list[tuple[str, float]]:
    """(op, self CPU ms) of the `n` aten ops that take the most time in one call of `step`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [(e.key, e.self_cpu_time_total / 1e3) for e in ops[:n]]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="ETTh1")
    parser.add_argument("--lookback", type=int, default=512)
    parser.add_argument("--horizon", type=int, default=96)
    parser.add_argument(
        "--row", default="tsformer-patchtst-small", help=f"a row of benchmarks/ett.py: {list(OURS)}"
    )
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8, help="steps timed (median)")
    parser.add_argument("--override", action="append", default=[], help="any train.py setting")
    parser.add_argument("--top", type=int, default=8, help="aten ops listed by self time")
    args = parser.parse_args()

    import lightning as L
    from hydra.utils import instantiate
    from torch.utils.flop_counter import FlopCounterMode

    from tsformer.train import build_task, compose_config

    overrides = [
        *row_overrides(args.row),
        f"data.name={args.dataset}",
        f"model.context_len={args.lookback}",
        f"model.horizon={args.horizon}",
        f"data.batch_size={args.batch_size}",
        *args.override,
    ]
    cfg = compose_config(overrides, Path(tempfile.mkdtemp()))
    L.seed_everything(0, verbose=False)
    dm = instantiate(cfg.data)
    dm.setup()
    task = build_task(cfg.model, dm)
    loader = dm.train_dataloader()
    batch = next(iter(loader))
    n_params = sum(p.numel() for p in task.parameters() if p.requires_grad)
    optimiser = torch.optim.AdamW([p for p in task.parameters() if p.requires_grad], lr=1e-4)

    def step():
        optimiser.zero_grad(set_to_none=True)
        task.loss(batch).backward()
        optimiser.step()

    task.train()
    step_s = timed(step, args.steps)
    with FlopCounterMode(display=False) as counter:
        task.loss(batch).backward()
    flops = counter.get_total_flops()
    n = max(1, round((flops / 2) ** (1 / 3)))  # n x n @ n x n: 2 n^3 FLOPs
    a, b = torch.randn(n, n), torch.randn(n, n)
    matmul_s = timed(lambda: torch.mm(a, b), args.steps)

    batches = iter(loader)
    load_s = timed(lambda: next(batches), min(args.steps, len(loader) - 2))

    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=args.steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
    )
    start = time.perf_counter()
    trainer.fit(task, datamodule=dm)
    fit_s = (time.perf_counter() - start) / args.steps

    val_loader = dm.val_dataloader()
    validator = L.Trainer(
        logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu"
    )
    start = time.perf_counter()
    validator.validate(task, datamodule=dm, verbose=False)  # `validation_step` on every window
    val_s = time.perf_counter() - start
    epoch_s = len(loader) * step_s

    print(f"{args.row} on {args.dataset}, L = {args.lookback}, H = {args.horizon}, batch {args.batch_size}")
    print(f"  overrides: {' '.join(overrides)}")
    print(f"  torch threads {torch.get_num_threads()}, trainable parameters {n_params:,}")
    print(f"  step (loss + backward + AdamW, fixed batch): {step_s * 1e3:.1f} ms")
    print(f"  FLOPs of forward + backward: {flops / 1e9:.2f} GFLOP -> {flops / step_s / 1e9:.2f} GFLOP/s")
    print(
        f"  one torch.mm of the same FLOPs ({n} x {n} @ {n} x {n}): {matmul_s * 1e3:.1f} ms -> "
        f"{flops / matmul_s / 1e9:.2f} GFLOP/s; the step runs at {matmul_s / step_s:.2f}x the matmul's speed"
    )
    print(f"  loader: {load_s * 1e3:.1f} ms a batch ({load_s / step_s:.2f}x of a step)")
    print(
        f"  Lightning fit of {args.steps} steps: {fit_s * 1e3:.1f} ms a step ({fit_s / step_s:.2f}x the bare step)"
    )
    print(f"  the {args.top} aten ops with the most self time in one step (torch.profiler, ms):")
    for name, ms in top_ops(step, args.top):
        print(f"    {ms:8.1f}  {name}")
    print(
        f"  validation pass ({len(dm.datasets['val'])} windows, {len(val_loader)} batches): {val_s:.1f} s; "
        f"a training epoch ({len(loader)} steps x the bare step): {epoch_s:.1f} s; validation "
        f"{val_s / (val_s + epoch_s):.0%} of an epoch"
    )


if __name__ == "__main__":
    main()
