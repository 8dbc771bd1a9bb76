"""`model.lr_schedule`: the learning rate each epoch of a real Lightning fit actually trains at."""

import itertools
import math

import lightning as L
import pytest
import torch

from conftest import random_windows
from tsformer.tasks import EncoderForecaster

N, M, DY = 12, 4, 2
LR = 1e-3


def batches(n: int = 3) -> list[dict]:
    """n batches of 4 windows, no covariates."""
    return [random_windows(N, M, DY, 0, 0, seed) for seed in range(n)]


class RecordLR(L.Callback):
    """The learning rate of every optimizer step, grouped by epoch."""

    def __init__(self):
        self.by_epoch: list[list[float]] = []

    def on_train_epoch_start(self, trainer, pl_module):
        self.by_epoch.append([])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.by_epoch[-1].append(trainer.optimizers[0].param_groups[0]["lr"])


def fit(epochs: int, **schedule) -> list[list[float]]:
    torch.manual_seed(0)
    task = EncoderForecaster(
        net={"d_model": 8, "n_heads": 2, "n_layers": 1},
        d_target=DY,
        d_known=0,
        d_observed=0,
        context_len=N,
        horizon=M,
        lr=LR,
        **schedule,
    )
    record = RecordLR()
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[record],
        num_sanity_val_steps=0,
    )
    trainer.fit(task, train_dataloaders=torch.utils.data.DataLoader(batches(), batch_size=None))
    return record.by_epoch


def test_epoch_decay_holds_then_decays_each_epoch_as_patchtst_type3():
    """PatchTST's ETT "type3": epochs 1-4 (1-based) at the learning rate, then x 0.9 an epoch."""
    by_epoch = fit(7, lr_schedule="epoch_decay")
    assert len(by_epoch) == 7
    for epoch, lrs in enumerate(by_epoch):
        assert len(set(lrs)) == 1, f"epoch {epoch}: the rate changed within the epoch: {lrs}"
    assert [lrs[0] for lrs in by_epoch] == pytest.approx([LR] * 4 + [LR * 0.9, LR * 0.81, LR * 0.729])


def test_epoch_decay_settings_are_used():
    by_epoch = fit(4, lr_schedule="epoch_decay", lr_hold_epochs=1, lr_decay=0.5)
    assert [lrs[0] for lrs in by_epoch] == pytest.approx([LR, LR * 0.5, LR * 0.25, LR * 0.125])


def test_warmup_cosine_warms_up_per_step_then_decays_to_the_floor():
    by_epoch = fit(4, warmup_steps=3, min_lr_ratio=0.1)  # the default schedule; 12 steps in all
    steps = [lr for lrs in by_epoch for lr in lrs]
    assert steps[:3] == pytest.approx([LR / 3, 2 * LR / 3, LR])
    assert steps[3] == pytest.approx(LR)  # the cosine starts at its top
    assert all(a > b for a, b in itertools.pairwise(steps[3:])), steps
    assert steps[-1] == pytest.approx(LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(8 / 9 * math.pi))))


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"lr_schedule": "cosine"}, "model.lr_schedule: 'cosine' is not one of warmup_cosine, epoch_decay"),
        ({"lr_schedule": "epoch_decay", "lr_decay": 1.5}, "model.lr_decay: 1.5 must be in (0, 1]"),
        ({"lr_schedule": "epoch_decay", "lr_hold_epochs": -1}, "model.lr_hold_epochs: -1 must be >= 0"),
    ],
)
def test_bad_schedule_settings_are_named(setting, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EncoderForecaster(
            net={"d_model": 8, "n_heads": 2, "n_layers": 1},
            d_target=DY,
            d_known=0,
            d_observed=0,
            context_len=N,
            horizon=M,
            **setting,
        )
