"""Wall-clock timing shared by the benchmark scripts (imported as `timing`: a script's own folder is
on its import path)."""

from __future__ import annotations

import time

import torch


def seconds(fn, device: str) -> float:
    """Wall-clock seconds of one call of `fn`; on a GPU, after the queued work has finished."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start
