"""Test helper (a callback for `python train.py` subprocesses): the process sends itself a signal at
a chosen training batch, once, as a crash, an out-of-memory kill or a job scheduler would."""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class StopOnce(Callback):
    def __init__(self, epoch: int, signal: int, marker: str, batch: int = 1):
        self.epoch, self.batch, self.signal = epoch, batch, signal
        self.marker = Path(marker)  # exists once the signal was sent: a resumed run goes on

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and batch_idx == self.batch and not self.marker.exists():
            self.marker.touch()
            os.kill(os.getpid(), self.signal)
