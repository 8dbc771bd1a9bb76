"""Test helper (a callback for `python train.py -m` sweeps): one chosen trial of the sweep crashes in
its first training batch, as a diverging or broken setting would; the others train as usual."""

from __future__ import annotations

from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import Callback


class CrashInTrial(Callback):
    def __init__(self, trial: int):
        self.trial = trial  # Hydra's job number in the sweep (0, 1, ...)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if HydraConfig.get().job.num == self.trial:
            raise RuntimeError(f"simulated crash in trial {self.trial}")
