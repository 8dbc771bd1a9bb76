"""A run whose step budget (`trainer.max_steps`) ends inside the first epoch validates when it ends, so
that early stopping and the best checkpoint have their metric (Lightning validated at the epoch's end
only, and the run ended in its traceback); and the model table a run prints has no FLOPs it did not
count (Lightning's printed `Total Flops: 0` and a 0 per layer)."""

from __future__ import annotations

import contextlib
import io
import logging

import pytest
from lightning.pytorch.callbacks import ModelSummary

from conftest import TINY
from tsformer.train import compose_config, run

pytestmark = pytest.mark.slow


@pytest.fixture
def model_table():
    """What Lightning's model summary logs without rich (its logger does not reach pytest's: Lightning's own
    handler)."""
    logger = logging.getLogger(ModelSummary.__module__)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    yield stream
    logger.removeHandler(handler)


def test_a_step_budget_shorter_than_an_epoch_validates_when_it_ends(tmp_path, model_table):
    steps = 2  # TINY's epoch: 3 batches
    overrides = [*TINY, f"trainer.max_steps={steps}", "trainer.enable_model_summary=true", "logger=none"]
    with contextlib.redirect_stdout(io.StringIO()) as printed:  # rich's table (where rich is installed)
        result = run(compose_config(overrides, tmp_path / "out"))
    assert result.best_val is not None  # the best checkpoint by val/mse, at the budget's last step
    assert (tmp_path / "out" / "checkpoints" / "best.ckpt").is_file()
    table = printed.getvalue() + model_table.getvalue()
    assert "Total params" in table and "EncoderDecoder" in table  # the model table, printed
    assert "flops" not in table.lower()
