"""`data.val_fraction=0 callbacks=last_weights`: every labelled series trains for a fixed budget and the
last weights are kept; what would follow a validation loss is refused with one line each."""

from __future__ import annotations

import pytest
import torch

from test_classification import sequences_table
from tsformer import settings
from tsformer.data.sequences import SequenceDataModule
from tsformer.settings import SettingError
from tsformer.train import compose_config, run

EVERY_SERIES = ["data.val_fraction=0", "callbacks=last_weights"]


def table_config(tmp_path, *overrides):
    train = tmp_path / "train.csv"
    sequences_table(n_series=15).to_csv(train, index=False)
    sequences_table(n_series=6, seed=1).to_csv(tmp_path / "test.csv", index=False)
    return compose_config(
        [
            "model=enc_only_classifier", "data=sequences", f"data.train={train}",
            f"data.test={tmp_path / 'test.csv'}", "logger=none", "forecasts_file=null",
            "model.net.d_model=16", "model.net.n_heads=2", "model.net.n_layers=1",
            "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", *overrides,
        ],
        tmp_path / "out",
    )  # fmt: skip


def test_no_validation_series_means_every_training_series():
    dm = SequenceDataModule(sequences_table(n_series=15), val_fraction=0, test_fraction=0.2, seed=0)
    dm.setup()
    assert len(dm.datasets["val"]) == 0 and len(dm.datasets["train"]) + len(dm.datasets["test"]) == 15
    assert dm.val_dataloader() == []


def test_early_stopping_and_a_best_checkpoint_are_refused_without_validation(tmp_path):
    with pytest.raises(
        SettingError, match="early stopping has nothing to follow: use callbacks=last_weights"
    ):
        settings.check(table_config(tmp_path, "data.val_fraction=0"))
    with pytest.raises(SettingError, match="no best checkpoint by val/loss: use callbacks=last_weights"):
        settings.check(table_config(tmp_path, "data.val_fraction=0", "~callbacks.early_stopping"))
    with pytest.raises(SettingError, match="pretrain=masked"):
        settings.check(table_config(tmp_path, *EVERY_SERIES, "pretrain=masked"))
    settings.check(table_config(tmp_path, *EVERY_SERIES))  # the named option passes


@pytest.mark.slow
def test_a_fixed_budget_on_every_series_keeps_the_last_weights(tmp_path):
    result = run(table_config(tmp_path, *EVERY_SERIES, "trainer.max_epochs=3"))
    assert result.best_val is None  # nothing validated
    (checkpoint,) = (tmp_path / "out" / "checkpoints").iterdir()
    saved = torch.load(checkpoint, weights_only=True, map_location="cpu")
    steps = 3  # the 15 training series are one batch of 32 an epoch, 3 epochs
    assert checkpoint.name == "last_weights.ckpt" and saved["global_step"] == steps  # the last step's
    assert 0.0 <= result.metrics["test/accuracy"] <= 1.0
