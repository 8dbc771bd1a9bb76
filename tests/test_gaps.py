"""data.fill: short gaps closed so windows may span them; the filled steps are inputs, never scored."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import PLANT_KNOWN, PLANT_TARGETS, plant_csv_overrides
from tsformer.data import TimeSeriesDataModule, simulate_plant
from tsformer.data.gaps import FILLED_ROW, fill_gaps
from tsformer.jobs.forecasting.forecaster import Forecaster
from tsformer.tasks import EncoderForecaster
from tsformer.train import compose_config, run

STEP = pd.Timedelta("1min")
TARGETS, KNOWN = PLANT_TARGETS, PLANT_KNOWN


def toy(drop=(3, 4, 10, 11, 12, 13, 14, 15)):
    """Two series of 30 minutes, y = minute; rows `drop` removed: a 2-step and a 6-step gap."""
    frames = []
    for sid in (0, 1):
        t = pd.date_range("2024-01-01", periods=30, freq="min")
        frames.append(
            pd.DataFrame({"series_id": sid, "time": t, "y": np.arange(30.0) + 100 * sid}).drop(
                index=list(drop)
            )
        )
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("method", ["interpolate", "ffill"])
def test_short_gaps_are_filled_and_flagged_long_ones_stay(method):
    clean = toy()
    table, filled = fill_gaps(clean, "time", "series_id", STEP, method, max_steps=3)
    assert len(table) == len(clean) + 2 * 2 and filled.sum() == 4  # the 2-step gap of each series
    inserted = table[filled]
    assert (inserted.index == FILLED_ROW).all()
    assert sorted(inserted.time.dt.minute.unique()) == [3, 4]
    expected = {"interpolate": [3.0, 4.0, 103.0, 104.0], "ffill": [2.0, 2.0, 102.0, 102.0]}[method]
    assert inserted.y.tolist() == expected
    assert inserted.series_id.dtype == clean.series_id.dtype and inserted.series_id.tolist() == [0, 0, 1, 1]
    assert not (table.time.dt.minute.isin(range(10, 16))).any()  # 6 missing steps > 3: still a gap
    with pytest.raises(ValueError, match="unknown fill 'mean'"):
        fill_gaps(clean, "time", "series_id", STEP, "mean", 3)


def make_dm(df, **kw):
    args = {
        "target_cols": TARGETS,
        "known_cols": KNOWN,
        "series_col": "series_id",
        "context_len": 20,
        "horizon": 5,
        "eval_batch_size": 10_000,
        "val_start": "2024-01-01 08:00",
        "test_start": "2024-01-01 09:00",
    }
    dm = TimeSeriesDataModule(df, **(args | kw))
    dm.setup()
    return dm


def plant_with_gaps():
    df = simulate_plant(n_series=2, n_steps=700, seed=0)
    gone = df.time.isin(pd.to_datetime(["2024-01-01 09:30", "2024-01-01 09:31", "2024-01-01 03:00"]))
    return df[~gone].reset_index(drop=True)


def test_windows_span_filled_gaps_and_flag_the_filled_steps():
    df = plant_with_gaps()
    plain, filled = make_dm(df), make_dm(df, fill="interpolate", max_fill_steps=2)
    assert filled.n_windows("test") > plain.n_windows("test")
    batch = next(iter(filled.test_dataloader()))
    times = filled.target_times("test")[batch["window"].numpy()]  # (W, M)
    is_gap = np.isin(times, pd.to_datetime(["2024-01-01 09:30", "2024-01-01 09:31"]).to_numpy())
    np.testing.assert_array_equal(~batch["fut_valid"].numpy(), is_gap)
    assert is_gap.any()


def test_filled_steps_do_not_enter_the_loss():
    dm = make_dm(plant_with_gaps(), fill="interpolate", max_fill_steps=2)
    batch = next(iter(dm.test_dataloader()))
    assert not batch["fut_valid"].all()
    # the encoder-only forecaster does not read fut_target as an input (teacher-forced decoders do,
    # and a filled value is a legitimate input), so a change there can only act through the loss
    task = EncoderForecaster(
        net={"d_model": 16, "n_heads": 2, "n_layers": 1},
        d_target=2,
        d_known=3,
        d_observed=0,
        context_len=20,
        horizon=5,
    )
    loss = task.loss(batch)
    changed = dict(batch, fut_target=torch.where(batch["fut_valid"][..., None], batch["fut_target"], 1e6))
    assert torch.equal(task.loss(changed), loss)
    changed = dict(batch, fut_target=batch["fut_target"] + 1.0)  # and a valid step does count
    assert not torch.equal(task.loss(changed), loss)


@pytest.mark.slow
def test_run_with_fill_scores_and_exports_only_measured_steps(in_tmp):
    df = simulate_plant(n_series=2, n_steps=800, seed=0)
    gap = df.time.isin(df.time.drop_duplicates().iloc[[700, 701]])  # in the test period
    df[~gap].to_csv(in_tmp / "gappy.csv", index=False)
    overrides = [
        "model=enc_dec",
        *plant_csv_overrides(in_tmp / "gappy.csv"),
        "data.fill=interpolate",
        "data.max_fill_steps=2",
        "logger=none",
    ]
    result = run(compose_config(overrides, in_tmp / "out"))
    csv = result.forecasts
    filled_times = df.time[gap].unique()
    at_gap = csv.target_time.isin(filled_times)
    assert at_gap.any() and csv.y_true[at_gap].isna().all() and csv.y_true[~at_gap].notna().all()
    # the logged test metric is the CSV's error over the measured steps only
    measured = csv[~at_gap]
    assert result.metrics["test/mae_orig"] == pytest.approx(
        (measured.y_pred - measured.y_true).abs().mean(), rel=1e-4
    )

    # prediction applies the same fill to a history with a short gap; without fill it is refused
    forecaster = Forecaster.load(result.model_folder)
    origin = pd.Timestamp(filled_times[0]) + 5 * STEP  # the 30-step history spans the gap
    table = df[~gap & (df.time <= origin + 70 * STEP)].copy()
    table.loc[table.time > origin, TARGETS] = np.nan
    out = forecaster.predict(table)
    assert (out.origin_time == origin).all() and out.y_pred.notna().all()
    forecaster.contract.fill = None
    with pytest.raises(ValueError, match="fill the gap"):
        forecaster.predict(table)
