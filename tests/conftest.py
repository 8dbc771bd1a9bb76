"""Shared helpers: compose the real configs from conf/, as train.py does."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from tsformer.train import CONFIG_DIR

REPO = Path(__file__).resolve().parents[1]

# Tiny settings for end-to-end runs on 2 CPU cores: a few steps, a small model, little data.
TINY = [
    "model.net.d_model=16",
    "model.net.n_heads=2",
    "model.net.n_layers=1",
    "model.warmup_steps=2",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=2",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "data.source.n_series=2",
    "data.source.n_steps=800",
    "n_plot_windows=2",
]


def compose_config(overrides: list[str], output_dir: Path):
    """The config train.py would get, with Hydra's runtime set so `${hydra:...}` resolves."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]  # as in hydra.main: the job's config without Hydra's own section
    return cfg


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run from an empty folder, as a user would (mlflow.db lands there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path
