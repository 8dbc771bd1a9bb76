"""State reconstruction with several series: the naive baseline is a linear regression per series, and
a model that gets no series-level input is warned about."""

from __future__ import annotations

import logging

import lightning as L
import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LinearRegression

from tsformer.data import TimeSeriesDataModule
from tsformer.tasks import ReconstructionTask

NET = {"d_model": 16, "n_heads": 2, "n_layers": 1}
N_STEPS, WINDOW = 300, 8
START = pd.Timestamp("2024-01-01")
VAL_START, TEST_START = START + pd.Timedelta(minutes=200), START + pd.Timedelta(minutes=250)
WARNING = "without a series-level input"


def series_with_offsets() -> pd.DataFrame:
    """Three series with the same inputs -> state relation but their own offset and gain."""
    rng = np.random.default_rng(0)
    parts = []
    for series, (offset, gain) in enumerate([(0.0, 1.0), (10.0, 1.5), (25.0, 0.7)]):
        x1, x2 = rng.normal(size=N_STEPS), rng.normal(size=N_STEPS)
        state = offset + gain * (2.0 * x1 - x2) + 0.1 * rng.normal(size=N_STEPS)
        times = pd.date_range(START, periods=N_STEPS, freq="1min")
        parts.append(pd.DataFrame({"series_id": series, "time": times, "x1": x1, "x2": x2, "state": state}))
    return pd.concat(parts, ignore_index=True)


def fit_and_test(static_categorical_cols=()) -> tuple[TimeSeriesDataModule, dict]:
    """One tiny fit (a batch) and the test of a ReconstructionTask; returns the DataModule and metrics."""
    dm = TimeSeriesDataModule(
        series_with_offsets(),
        target_cols=["state"],
        known_cols=["x1", "x2"],
        series_col="series_id",
        context_len=WINDOW,
        horizon=0,
        val_start=VAL_START,
        test_start=TEST_START,
        static_categorical_cols=static_categorical_cols,
    )
    dm.setup()
    task = ReconstructionTask(
        net=NET,
        d_target=1,
        d_known=2,
        d_observed=0,
        context_len=WINDOW,
        horizon=0,
        warmup_steps=1,
        static_vocab_sizes=dm.static_vocab_sizes,
    )
    task.set_target_scaling(dm.features.target_scaler)
    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=1,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(task, datamodule=dm)
    (metrics,) = trainer.test(task, datamodule=dm, verbose=False)
    return dm, metrics


@pytest.fixture(scope="module")
def without_series_input():
    """The run, and the warnings of the reconstruction task logged during its fit."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tsformer.tasks.reconstruction")
    logger.addHandler(handler)
    try:
        dm, metrics = fit_and_test()
    finally:
        logger.removeHandler(handler)
    return dm, metrics, [r.getMessage() for r in records if r.levelno == logging.WARNING]


def test_the_reported_baseline_is_a_linear_regression_per_series(without_series_input):
    dm, metrics, _ = without_series_input
    frame = dm.frame
    train = frame[frame.time < VAL_START]
    test_rows = dm.datasets["test"].target_rows().ravel()  # (W * N,): every step of every test window
    tested = frame.iloc[test_rows]

    def mae(model_of_series) -> float:
        pred = np.concatenate(
            [
                model_of_series(s).predict(part[["x1", "x2"]])
                for s, part in tested.groupby("series_id", sort=False)
            ]
        )
        truth = np.concatenate([part.state.to_numpy() for _, part in tested.groupby("series_id", sort=False)])
        return float(np.mean(np.abs(pred - truth)))

    per_series = {
        s: LinearRegression().fit(part[["x1", "x2"]], part.state) for s, part in train.groupby("series_id")
    }
    pooled = LinearRegression().fit(train[["x1", "x2"]], train.state)
    per_series_mae, pooled_mae = mae(per_series.__getitem__), mae(lambda s: pooled)
    assert per_series_mae < pooled_mae
    assert metrics["test/baseline_mae_orig"] == pytest.approx(per_series_mae, rel=1e-4)


def test_several_series_without_a_series_level_input_are_warned_about(without_series_input):
    *_, warnings = without_series_input
    (message,) = [w for w in warnings if WARNING in w]
    assert "3 series" in message and "data.static_categorical_cols=[series_id]" in message
    assert "\n" not in message


def test_a_series_embedding_silences_the_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="tsformer.tasks.reconstruction"):
        fit_and_test(static_categorical_cols=["series_id"])
    assert not [r for r in caplog.records if WARNING in r.getMessage()]
