"""How fast the classifier trains (issue 42): one epoch of OSULeaf on one thread, Lightning against a plain
PyTorch loop over the same model and batches.

    OMP_NUM_THREADS=1 python benchmarks/classification_speed.py
    OMP_NUM_THREADS=1 python benchmarks/classification_speed.py --dataset GunPoint --embeddings conv

For each stem (`model.net.embedding`), the network of `experiment=<set>` (the recipe: its augmentation,
AdamW, the warmup-cosine schedule, gradient clipping at 1.0) trains on the training series' batches of 16:

- `plain`: a hand-written loop, forward, cross-entropy, backward, clipping, AdamW and schedule steps, over
  the data module's own batches taken once beforehand (no loader, no augmentation, no logging);
- `plain + augmentation`: the same, each batch augmented first as `training_step` does (the recipe's shifts);
- `Lightning`: `Trainer.fit` of the run's task with the run's Trainer settings and callbacks (the
  experiment's checkpoint of the last weights; no logger, no progress bar), from the start of its second
  epoch to the end of the fit: the loader, `training_step` (augmentation included), Lightning's loop, its
  logging and what it does between epochs;
- `Lightning, checkpoint every epoch`: the same with Lightning's own `ModelCheckpoint` of the last weights,
  which writes one at every epoch's end (the project's `callbacks=last_weights` before issue 42; now
  `tsformer.callbacks.LastWeights`, every 500 steps and at the end).

Each runs `--steps` optimiser steps (after one warm-up epoch), `--repeats` times, interleaved; the fastest
repeat counts. Times are the process's CPU seconds (`time.process_time`: one thread, so a machine shared
with other work slows the wall clock but hardly this), beside the wall seconds. Printed: steps/s of each,
Lightning's overhead over the plain loop with augmentation, and augmentation's over the plain loop; then
the top operators of one plain epoch by torch's profiler. Nothing here is a test: the figures are what
this machine measured, now.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

from tsformer.tasks.optimisation import warmup_cosine
from tsformer.train import build_task, compose_config, instantiate_group

EXPERIMENTS = {"OSULeaf": "osuleaf", "GunPoint": "gun_point", "JapaneseVowels": "japanese_vowels"}


def setup(dataset: str, embedding: str, seed: int = 0):
    """(config, set-up data module, a fresh task) of `experiment=<dataset>` with `embedding`."""
    overrides = [f"experiment={EXPERIMENTS[dataset]}", f"model.net.embedding={embedding}", "logger=none"]
    cfg = compose_config(overrides, Path(tempfile.mkdtemp()) / "out")
    L.seed_everything(seed, verbose=False)
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    return cfg, datamodule, build_task(cfg.model, datamodule)


def plain_steps(task, batches: list[dict], steps: int, augment: bool) -> tuple[float, float]:
    """(CPU s, wall s) of `steps` optimiser steps of a hand-written loop over `batches` (the recipe's
    optimiser and schedule)."""
    opt = task.optimisation
    optimizer = torch.optim.AdamW(task.parameters(), lr=opt.lr, weight_decay=opt.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, opt.warmup_steps, steps, opt.min_lr_ratio)
    )
    task.train()
    cpu, wall = time.process_time(), time.perf_counter()
    for step in range(steps):
        batch = batches[step % len(batches)]
        if augment:
            batch = task.augmented(batch)
        loss = F.cross_entropy(task(batch["x"], batch["valid"]), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(task.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    return time.process_time() - cpu, time.perf_counter() - wall


class FromSecondEpoch(L.Callback):
    """CPU and wall seconds from the second epoch's first batch to the end of the fit, and its steps."""

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.current_epoch == 1 and batch_idx == 0:
            self.start = (time.process_time(), time.perf_counter(), trainer.global_step)

    def on_train_end(self, trainer, module):
        cpu, wall, step = self.start
        self.took = (time.process_time() - cpu, time.perf_counter() - wall, trainer.global_step - step)


def lightning_steps(cfg, datamodule, task, steps: int, every_epoch: bool = False) -> tuple[float, float]:
    """(CPU s, wall s) of `steps` optimiser steps of `Trainer.fit` after one warm-up epoch, with the run's
    Trainer settings and callbacks (those that need a logger left out, as train.run does without one);
    `every_epoch`: the last weights' checkpoint written at every epoch's end instead."""
    callbacks = [c for c in instantiate_group(cfg.callbacks) if not isinstance(c, LearningRateMonitor)]
    if every_epoch:
        callbacks = [c for c in callbacks if not isinstance(c, ModelCheckpoint)]
        callbacks.append(ModelCheckpoint(filename="last_weights", monitor=None, save_top_k=1))
    timer = FromSecondEpoch()
    with tempfile.TemporaryDirectory() as tmp:
        for c in callbacks:
            if isinstance(c, ModelCheckpoint):
                c.dirpath = tmp  # the checkpoints are written, as in a run, but not kept
        trainer = instantiate(
            cfg.trainer, logger=False, callbacks=[*callbacks, timer], enable_progress_bar=False,
            enable_model_summary=False, max_epochs=-1, max_steps=len(datamodule.train_dataloader()) + steps,
        )  # fmt: skip
        trainer.fit(task, datamodule=datamodule)
    cpu, wall, done = timer.took
    assert done == steps, (done, steps)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="OSULeaf", choices=sorted(EXPERIMENTS))
    parser.add_argument("--embeddings", default="conv,multiscale")
    parser.add_argument("--steps", type=int, default=130, help="timed optimiser steps per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(
        f"{args.dataset}, {torch.get_num_threads()} thread(s), torch {torch.__version__}, "
        f"{platform.machine()}; load average {os.getloadavg()[0]:.2f} at the start"
    )
    print(f"\n`OMP_NUM_THREADS={torch.get_num_threads()} python benchmarks/classification_speed.py "
          f"--dataset {args.dataset} --embeddings {args.embeddings} --steps {args.steps} --repeats {args.repeats}`\n")  # fmt: skip
    rows = []
    for embedding in args.embeddings.split(","):
        cfg, datamodule, task = setup(args.dataset, embedding)
        batches = list(datamodule.train_dataloader())
        plain_steps(task, batches, len(batches), augment=True)  # warm-up
        times = {"plain": [], "augmented": [], "lightning": [], "every_epoch": []}
        for _ in range(args.repeats):
            times["plain"].append(plain_steps(task, batches, args.steps, augment=False))
            times["augmented"].append(plain_steps(task, batches, args.steps, augment=True))
            _, dm, fresh = setup(args.dataset, embedding)
            times["lightning"].append(lightning_steps(cfg, dm, fresh, args.steps))
            _, dm, fresh = setup(args.dataset, embedding)
            times["every_epoch"].append(lightning_steps(cfg, dm, fresh, args.steps, every_epoch=True))
        cpu = {k: args.steps / min(t[0] for t in v) for k, v in times.items()}  # steps per CPU second
        wall = {k: args.steps / min(t[1] for t in v) for k, v in times.items()}
        rows.append(
            f"| {embedding} | {len(batches)} | {cpu['plain']:.1f} ({wall['plain']:.1f}) | "
            f"{cpu['augmented']:.1f} ({wall['augmented']:.1f}) | {cpu['lightning']:.1f} ({wall['lightning']:.1f}) | "
            f"{cpu['augmented'] / cpu['lightning'] - 1:+.1%} | {cpu['plain'] / cpu['augmented'] - 1:+.1%} | "
            f"{cpu['every_epoch']:.1f} ({wall['every_epoch']:.1f}) | {cpu['augmented'] / cpu['every_epoch'] - 1:+.1%} |"
        )  # fmt: skip
    print(
        "| stem | steps per epoch | plain steps/s | plain + augmentation steps/s | Lightning steps/s "
        "| Lightning overhead | augmentation overhead | Lightning, checkpoint every epoch | its overhead |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\nsteps per CPU second (per wall second); overheads: CPU time over the plain loop's")
    print(
        f"\nTop operators of one plain epoch with augmentation ({embedding}), torch.profiler, self CPU time:\n"
    )
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        plain_steps(task, batches, len(batches), augment=True)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
