"""Training-set augmentation (`model.augment`, data/augment.py): each kind, and never on validation or test."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch

from test_classification import NET, sequences_table
from tsformer.data.augment import Augmentation
from tsformer.data.sequences import SequenceDataModule, pad_batch
from tsformer.settings import SettingError
from tsformer.tasks.classification import ClassificationTask

EVERY_KIND = {"jitter": 0.1, "scaling": 0.2, "shift": 0.3, "window_warp": 0.3, "mixup": 0.4}


def batch(lengths=(6, 10, 8), d=2, n_classes=3):
    g = torch.Generator().manual_seed(0)
    items = [
        {"x": torch.randn(n, d, generator=g), "label": torch.tensor(i % n_classes), "sample": torch.tensor(i)}
        for i, n in enumerate(lengths)
    ]
    return pad_batch(items)


@pytest.mark.parametrize("kind", ["jitter", "scaling", "shift", "window_warp"])
def test_each_kind_changes_the_real_steps_only_and_keeps_the_lengths(kind):
    b = batch()
    out = Augmentation(**{kind: 0.3})(b, 3, np.random.default_rng(0))
    assert torch.equal(out["valid"], b["valid"]) and out["x"].shape == b["x"].shape
    assert (out["x"][~b["valid"]] == 0).all()  # padding stays 0
    assert (out["x"] - b["x"]).abs().max() > 1e-3
    assert torch.equal(b["x"], batch()["x"])  # the input batch is left as it was


def test_a_circular_shift_rotates_each_sample_within_its_own_length():
    b = batch()
    out = Augmentation(shift=0.5, circular=True)(b, 3, np.random.default_rng(1))
    for i, n in enumerate(b["valid"].sum(dim=1).tolist()):
        x, y = b["x"][i, :n], out["x"][i, :n]
        assert any(torch.equal(torch.roll(x, k, dims=0), y) for k in range(n)), i


def test_mixup_mixes_samples_and_their_labels_alike():
    b = batch(lengths=(8, 8, 8, 8))
    out = Augmentation(mixup=1.0)(b, 3, np.random.default_rng(0))
    soft = out["soft_label"]  # (B, C)
    assert soft.shape == (4, 3) and torch.allclose(soft.sum(dim=1), torch.ones(4))
    assert (soft.max(dim=1).values < 1).any()  # some sample is a mixture


def test_settings_are_checked():
    assert not Augmentation().active and Augmentation(jitter=0.1).active
    with pytest.raises(SettingError, match="model.augment.jitter"):
        Augmentation(jitter=-1)
    with pytest.raises(SettingError, match="model.augment.shift"):
        Augmentation(shift=1.5)


class Recording(ClassificationTask):
    """The classification task, keeping the inputs its network read at each stage."""

    def forward(self, x, valid):
        self.seen.setdefault(self.trainer.state.stage.value, []).append(x.clone())
        return super().forward(x, valid)


@pytest.mark.slow
def test_an_augmentation_never_touches_validation_or_test_batches():
    dm = SequenceDataModule(sequences_table(n_series=24), val_fraction=0.25, batch_size=32, seed=0)
    dm.setup()
    model = Recording(NET, dm.d_in, dm.classes, augment=EVERY_KIND)
    model.seen = {}
    trainer = L.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    trainer.test(model, datamodule=dm, verbose=False)
    for stage, split in (("validate", "val"), ("test", "test")):
        loaded = [b["x"] for b in getattr(dm, f"{split}_dataloader")()]
        assert len(model.seen[stage]) == len(loaded)
        assert all(torch.equal(a, b) for a, b in zip(model.seen[stage], loaded, strict=True)), stage
    train = next(iter(dm.train_dataloader()))["x"]  # the same seeded order as the fit's first batch
    assert model.seen["train"][0].shape == train.shape
    assert (model.seen["train"][0] - train).abs().max() > 1e-3  # training batches were augmented
