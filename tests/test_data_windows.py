"""Windows and the DataModule: counts, split membership, gaps, scalers fitted on train, no copies."""

import numpy as np
import pandas as pd
import pytest
import torch

from tsformer.data import TimeSeriesDataModule, WindowDataset, simulate_plant, window_starts

STEP = pd.Timedelta("1min")


def one_series(n_steps=200, drop=()):
    """One series with target y (= row number, easy to trace), known u, observed z; `drop` makes gaps."""
    times = pd.date_range("2024-01-01", periods=n_steps, freq="min")
    rng = np.random.default_rng(1)
    df = pd.DataFrame(
        {
            "time": times,
            "y": np.arange(n_steps, dtype=float),
            "u": rng.normal(size=n_steps),
            "z": rng.normal(size=n_steps),
        }
    )
    return df.drop(index=list(drop)).reset_index(drop=True)


def make_dm(df, **overrides):
    kwargs = {
        "name": "toy",
        "target_cols": ["y"],
        "known_cols": ["u"],
        "observed_cols": ["z"],
        "context_len": 10,
        "horizon": 4,
        "val_start": "2024-01-01 02:00",
        "test_start": "2024-01-01 02:40",
        "eval_batch_size": 7,
    }
    kwargs.update(overrides)
    dm = TimeSeriesDataModule(df, **kwargs)
    dm.setup()
    return dm


def test_window_starts_stay_in_segment_and_targets_in_split():
    # segment rows [0, 100), split rows [60, 80), N=10, M=4: first target row 60, last target row 79
    starts = window_starts((0, 100), (60, 80), context_len=10, horizon=4)
    np.testing.assert_array_equal(starts, np.arange(50, 67))
    assert len(window_starts((0, 100), (60, 80), context_len=10, horizon=0)) == 20 - 10 + 1
    assert (
        len(window_starts((55, 100), (60, 80), context_len=10, horizon=4)) == 67 - 55
    )  # no history before 55
    np.testing.assert_array_equal(window_starts((0, 100), (60, 80), 10, 4, stride=5), [50, 55, 60, 65])
    assert len(window_starts((0, 100), (60, 62), 10, 4)) == 0


@pytest.mark.parametrize("context_len, horizon", [(10, 4), (10, 0), (3, 17)])
def test_window_counts_follow_the_formula(context_len, horizon):
    dm = make_dm(one_series(), context_len=context_len, horizon=horizon)
    n_train, n_val, n_test = 120, 40, 40  # rows before 02:00, until 02:40, after
    target_len = horizon if horizon else context_len
    assert dm.n_windows("test") == n_test - target_len + 1
    assert dm.n_windows("val") == n_val - target_len + 1
    assert dm.n_windows("train") == n_train - context_len - horizon + 1


def test_strides_and_fractions():
    dm = make_dm(one_series(), eval_stride=3, train_stride=5)
    assert dm.n_windows("test") == len(range(0, 40 - 4 + 1, 3))
    assert dm.n_windows("train") == len(range(0, 120 - 14 + 1, 5))
    by_fraction = make_dm(one_series(), val_start=None, test_start=None, val_fraction=0.2, test_fraction=0.1)
    assert by_fraction.n_windows("test") == 20 - 4 + 1 and by_fraction.n_windows("val") == 40 - 4 + 1


def test_test_targets_lie_in_the_test_period_and_history_may_start_before():
    dm = make_dm(one_series())
    test_start = pd.Timestamp("2024-01-01 02:40")
    target_times = dm.target_times("test")
    assert target_times.shape == (dm.n_windows("test"), 4)
    assert (target_times >= test_start).all()
    info = dm.window_info("test")
    assert list(info.columns) == ["window", "series_id", "origin_time"]
    assert (info["origin_time"] < test_start).any()  # the first windows look back into val
    # convention: forecast origin = last history step, target_time = origin + k * freq, k = 1..M
    expected = info["origin_time"].to_numpy()[:, None] + np.arange(1, 5)[None, :] * STEP.to_timedelta64()
    np.testing.assert_array_equal(target_times, expected)
    # items carry exactly those rows: y equals the row number, and scaled y is monotone in it
    item = dm.datasets["test"][0]
    y = dm.features.inverse_target(item["fut_target"]).squeeze(-1)
    first_target_row = (target_times[0, 0] - np.datetime64("2024-01-01")) // STEP.to_timedelta64()
    np.testing.assert_allclose(y.numpy(), first_target_row + np.arange(4), atol=1e-3)


def test_train_start_leaves_earlier_rows_to_history_alone():
    df = one_series()
    dm = make_dm(df, train_start="2024-01-01 01:00")  # 60 of the 120 rows before val_start stay out
    train_start = np.datetime64("2024-01-01 01:00")
    assert (dm.target_times("train") >= train_start).all()
    assert dm.n_windows("train") == 60 - 4 + 1  # as many as targets fit in [01:00, 02:00)
    assert (dm.window_info("train")["origin_time"] < train_start).any()  # earlier rows as history
    kept = df[(df.time >= "2024-01-01 01:00") & (df.time < "2024-01-01 02:00")]
    np.testing.assert_allclose(dm.features.target_scaler.offset, [kept.y.mean()])  # scaled on them alone
    with pytest.raises(ValueError, match="train_start .* is after val_start"):
        make_dm(df, train_start="2024-01-01 02:10")


def test_reconstruction_windows_are_their_own_target():
    dm = make_dm(one_series(), context_len=10, horizon=0)
    item = dm.datasets["test"][3]
    assert item["hist_target"].shape == (10, 1) and item["fut_target"].shape == (0, 1)
    assert item["fut_known"].shape == (0, 1) and item["window"].item() == 3
    info, times = dm.window_info("test"), dm.target_times("test")
    expected = info["origin_time"].to_numpy()[:, None] + np.arange(10)[None, :] * STEP.to_timedelta64()
    np.testing.assert_array_equal(times, expected)
    assert (times >= np.datetime64("2024-01-01T02:40")).all()


def test_no_window_spans_a_gap(caplog):
    df = one_series(drop=range(170, 175))  # 5 missing minutes inside the test period
    with caplog.at_level("INFO", logger="tsformer.data.schema"):
        dm = make_dm(df)
    assert "1 gap(s)" in caplog.text
    for split in ("train", "val", "test"):
        ds = dm.datasets[split]
        rows = ds.starts[:, None] + np.arange(ds.context_len + ds.horizon)[None, :]  # (W, N + M)
        steps = np.diff(dm._times[rows], axis=1)
        assert (steps == STEP.to_timedelta64()).all(), split
    # test rows: 160..169 (10 rows) then 175..199 (25 rows); windows may not straddle the gap
    first_part = 10 - 4 + 1  # history reaches back, targets inside [160, 170)
    second_part = 25 - 14 + 1  # nothing before row 175 in that segment
    assert dm.n_windows("test") == first_part + second_part
    assert len(dm.frame) == 195  # nothing dropped


def test_scalers_are_fitted_on_train_rows_only():
    df = one_series()
    before = make_dm(df)
    changed = df.copy()
    changed.loc[changed["time"] >= "2024-01-01 02:00", ["y", "u", "z"]] = 1e6  # val and test only
    after = make_dm(changed)
    assert before.features == after.features  # scalers and vocabularies
    np.testing.assert_allclose(before.features.target_scaler.offset, [59.5])  # mean of rows 0..119
    changed.loc[0, "y"] = 1e6  # a train row does move it
    assert make_dm(changed).features.target_scaler.offset[0] != before.features.target_scaler.offset[0]


@pytest.mark.parametrize("scaler", ["standard", "minmax", "none"])
def test_inverse_transform_undoes_transform(scaler):
    df = simulate_plant(n_series=2, n_steps=400, seed=0)
    dm = make_dm(
        df,
        target_cols=["dynamic_temperature", "dynamic_pressure"],
        known_cols=["supply_voltage"],
        observed_cols=[],
        series_col="series_id",
        val_start=None,
        test_start=None,
        scaler=scaler,
    )
    x = np.random.default_rng(0).normal(50, 20, size=(3, 5, 2))  # (B, T, Dy)
    features = dm.features
    np.testing.assert_allclose(features.inverse_target(features.transform_target(x)), x, rtol=1e-10)
    t = torch.tensor(x, dtype=torch.float32)
    back = features.inverse_target(features.transform_target(t))
    assert torch.is_tensor(back) and back.dtype == torch.float32 and back.shape == t.shape
    torch.testing.assert_close(back, t, rtol=1e-5, atol=1e-3)
    if scaler != "none":
        assert not np.allclose(features.transform_target(x), x)
    assert features.covariate_scaler is not None and dm.d_observed == 0


@pytest.mark.parametrize("split", ["val", "test"])
def test_eval_loaders_yield_every_window_exactly_once_in_order(split):
    dm = make_dm(one_series(), eval_stride=2)  # eval_batch_size 7 does not divide the count
    loader = getattr(dm, f"{split}_dataloader")()
    seen = torch.cat([batch["window"] for batch in loader]).numpy()
    np.testing.assert_array_equal(seen, np.arange(dm.n_windows(split)))
    assert dm.n_windows(split) % 7 != 0


def test_test_loader_goes_forward_in_time_over_all_series_together():
    """Two series over the same hours: the test windows come by origin time, the series interleaved
    (the rolling spread calibration pools each series' truths as they come in), each window once."""
    df = simulate_plant(n_series=2, n_steps=400, seed=0)
    dm = make_dm(
        df,
        target_cols=["dynamic_temperature"],
        known_cols=["supply_voltage"],
        observed_cols=[],
        series_col="series_id",
        val_start=None,
        test_start=None,
    )
    info = dm.window_info("test")
    assert info["series_id"].nunique() == 2
    assert info["series_id"].is_monotonic_increasing  # the dataset's own order: series by series
    seen = torch.cat([batch["window"] for batch in dm.test_dataloader()]).numpy()
    assert sorted(seen) == list(range(len(info)))
    origins = info["origin_time"].to_numpy()
    np.testing.assert_array_equal(origins[seen], np.sort(origins))
    assert info["series_id"].to_numpy()[seen][:2].tolist() == sorted(info["series_id"].unique())


def test_train_loader_shuffles_reproducibly_and_covers_all_windows():
    dm = make_dm(one_series(), batch_size=16)
    first = torch.cat([b["window"] for b in dm.train_dataloader()]).numpy()
    again = torch.cat([b["window"] for b in make_dm(one_series(), batch_size=16).train_dataloader()]).numpy()
    assert sorted(first) == list(range(dm.n_windows("train"))) and not (first == np.sort(first)).all()
    np.testing.assert_array_equal(first, again)


def test_batches_have_the_documented_shapes_and_calendar_channels():
    dm = make_dm(one_series(), calendar_features=["hour", "dayofweek"], observed_cols=[])
    assert dm.known_names == ["u", "cal_hour_sin", "cal_hour_cos", "cal_dayofweek_sin", "cal_dayofweek_cos"]
    batch = next(iter(dm.val_dataloader()))
    assert batch["hist_target"].shape == (7, 10, 1) and batch["fut_target"].shape == (7, 4, 1)
    assert batch["hist_known"].shape == (7, 10, 5) and batch["fut_known"].shape == (7, 4, 5)
    assert batch["hist_observed"].shape == (7, 10, 0) and batch["fut_observed"].shape == (7, 4, 0)
    assert batch["window"].dtype == torch.int64
    assert batch["static_num"].shape == (7, 0) and batch["static_cat"].shape == (7, 0)
    assert batch["static_cat"].dtype == torch.int64
    assert batch["hist_valid"].shape == (7, 10) and batch["fut_valid"].shape == (7, 4)
    assert batch["hist_valid"].all() and batch["fut_valid"].all()  # no gap filled
    assert batch["series"].shape == (7,) and batch["series"].dtype == torch.int64
    ints_and_flags = ("window", "static_cat", "series", "hist_valid", "fut_valid")
    assert all(v.dtype == torch.float32 for k, v in batch.items() if k not in ints_and_flags)
    hours = dm.frame["time"].dt.hour + dm.frame["time"].dt.minute / 60
    np.testing.assert_allclose(  # calendar channels are not scaled
        dm.datasets["train"].known[:, 1].numpy(), np.sin(2 * np.pi * hours / 24), atol=1e-6
    )


def test_datasets_share_one_copy_of_the_data():
    dense, sparse = make_dm(one_series(), eval_stride=1), make_dm(one_series(), eval_stride=9)
    assert dense.n_windows("test") > 5 * sparse.n_windows("test")
    for name in ("target", "known", "observed"):
        arrays = [getattr(dm.datasets[s], name) for dm in (dense, sparse) for s in ("train", "val", "test")]
        assert {tuple(a.shape) for a in arrays} == {(200, 1)}
        # the three splits of one module point at the same memory
        assert len({getattr(dense.datasets[s], name).data_ptr() for s in ("train", "val", "test")}) == 1
    # an item is a view into that memory, not a copy
    ds = dense.datasets["test"]
    item = ds[5]
    assert item["hist_target"].untyped_storage().data_ptr() == ds.target.untyped_storage().data_ptr()
    assert ds.starts.nbytes == 8 * len(ds)


def test_window_dataset_rejects_bad_lengths():
    with pytest.raises(ValueError):
        WindowDataset(np.zeros((5, 1)), np.zeros((5, 0)), np.zeros((5, 0)), [0], context_len=0, horizon=1)


def test_default_plant_window_counts():
    df = simulate_plant()
    common = {
        "target_cols": ["dynamic_temperature", "dynamic_pressure"],
        "series_col": "series_id",
        "known_cols": ["ambient_pressure", "ambient_temperature", "supply_voltage"],
        "observed_cols": [],
        "val_start": None,
        "test_start": None,
    }
    reconstruction = make_dm(df, context_len=100, horizon=0, **common)
    forecast = make_dm(df, context_len=30, horizon=70, **common)
    # 6000 steps x 3 series: 4200 train / 900 val / 900 test rows per series
    assert [reconstruction.n_windows(s) for s in ("train", "val", "test")] == [3 * 4101, 3 * 801, 3 * 801]
    assert [forecast.n_windows(s) for s in ("train", "val", "test")] == [3 * 4101, 3 * 831, 3 * 831]
    assert forecast.freq == pd.tseries.frequencies.to_offset("min")
