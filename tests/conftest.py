"""Shared helpers: tiny settings for end-to-end runs, and an empty working folder."""

from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run from an empty folder, as a user would (mlflow.db lands there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path
