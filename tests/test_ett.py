"""The ETT benchmark (`data=ett`, `experiment=ett data.name=<name> model.context_len=<L> model.horizon=<H>`):
the standard protocol.

Tests on the real files skip where ../shared/data/ETT-small (a fallback folder of the loader) is absent
(the files are never in the repository); the config and loader checks that need no data always run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import REPO, TINY
from tsformer.data import ett, sources
from tsformer.data.ett import COLUMNS, load_ett
from tsformer.train import CONFIG_DIR, compose_config, run

DATA = REPO.parent / "shared" / "data" / "ETT-small"
needs_data = pytest.mark.needs_data(DATA)  # skipped where the folder is absent (conftest.py)


# The protocol in rows (Time-Series-Library's Dataset_ETT_hour / Dataset_ETT_minute): borders of the
# rows each split reads, history included; ETTm is the same times 4.
def protocol_borders(name: str, L: int) -> dict[str, tuple[int, int]]:
    k = ett.STEPS_PER_HOUR[name[3]]
    month = 30 * 24 * k
    return {
        "train": (0, 12 * month),
        "val": (12 * month - L, 16 * month),
        "test": (16 * month - L, 20 * month),
    }


def ett_datamodule(name: str, L: int, H: int, tmp_path):
    cfg = compose_config(
        ["experiment=ett", f"data.name={name}", f"model.context_len={L}", f"model.horizon={H}"], tmp_path
    )
    dm = instantiate(cfg.data)
    dm.setup()
    return dm


# -- on the real files ------------------------------------------------------------------------------

# (name, L, H) -> windows per split, written out: train 8640 - L - H + 1, val and test 2880 - H + 1
# (ETTh); ETTm: 34560 - L - H + 1 and 11520 - H + 1
EXPECTED_WINDOWS = {
    ("ETTh1", 96, 96): {"train": 8449, "val": 2785, "test": 2785},
    ("ETTh1", 512, 720): {"train": 7409, "val": 2161, "test": 2161},
    ("ETTm1", 96, 96): {"train": 34369, "val": 11425, "test": 11425},
    ("ETTm1", 512, 720): {"train": 33329, "val": 10801, "test": 10801},
}


@needs_data
@pytest.mark.parametrize("name, L, H", list(EXPECTED_WINDOWS))
def test_window_counts_and_rows_are_the_protocols(name, L, H, tmp_path):
    dm = ett_datamodule(name, L, H, tmp_path)
    counts = {split: dm.n_windows(split) for split in ("train", "val", "test")}
    assert counts == EXPECTED_WINDOWS[(name, L, H)]
    # the very windows of the protocol: every start row s with [s, s + L + H) inside its split's borders
    for split, (lo, hi) in protocol_borders(name, L).items():
        np.testing.assert_array_equal(dm.datasets[split].starts, np.arange(lo, hi - L - H + 1), err_msg=split)
    # first test forecast: origin at the last row before 2017-10-24, targets up to the protocol's end
    test_times = dm.target_times("test")
    assert test_times.min() == np.datetime64("2017-10-24T00:00")
    assert pd.Timestamp(test_times.max()) == ett.END - dm.freq
    assert pd.Timestamp(dm.window_info("test").origin_time.iloc[0]) == ett.TEST_START - dm.freq


@needs_data
@pytest.mark.parametrize("name, n_rows, n_file", [("ETTh1", 14400, 17420), ("ETTm1", 57600, 69680)])
def test_rows_after_the_protocols_end_are_not_in_the_frame(name, n_rows, n_file, tmp_path):
    dm = ett_datamodule(name, 96, 96, tmp_path)
    assert len(dm.frame) == n_rows == ett.protocol_rows(name)
    assert dm.frame.time.max() < ett.END
    assert set(dm.frame.columns) == {"time", "series_id", *COLUMNS}
    # the rows are the file's, value for value; end=None keeps every row
    raw = pd.read_csv(DATA / f"{name}.csv")
    np.testing.assert_array_equal(dm.frame[COLUMNS].to_numpy(), raw[COLUMNS].to_numpy()[:n_rows])
    assert len(load_ett(DATA, name, end=None)) == n_file


@needs_data
def test_scaler_is_fitted_on_the_train_rows_only(tmp_path):
    dm = ett_datamodule("ETTh1", 336, 96, tmp_path)
    train = pd.read_csv(DATA / "ETTh1.csv")[COLUMNS].to_numpy()[:8640]
    np.testing.assert_allclose(dm.features.target_scaler.offset, train.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(dm.features.target_scaler.scale, train.std(axis=0), rtol=1e-12)
    assert dm.features.covariate_scaler is None and dm.d_known == 0 and dm.d_observed == 0
    assert dm.target_names == COLUMNS


@needs_data
def test_first_existing_folder_is_used(tmp_path):
    assert len(load_ett([tmp_path / "absent", DATA], "ETTh1")) == 14400


@pytest.mark.slow
@needs_data
def test_end_to_end_every_test_window_is_in_the_forecasts_csv(in_tmp):
    """A tiny run on ETTh1 with a short horizon: training is cut short, the test split is not."""
    L, H = 96, 8
    overrides = [o for o in TINY if not o.startswith("data.source.")]  # those are the simulators'
    overrides += [
        "experiment=ett",
        f"model.context_len={L}",
        f"model.horizon={H}",
        "trainer.limit_val_batches=1",
        "data.eval_batch_size=1024",
        "logger=none",
    ]
    result = run(compose_config(overrides, in_tmp / "out"))

    n_test = 2880 - H + 1  # targets in rows [11520, 14400)
    csv = pd.read_csv(result.csv_path, parse_dates=["origin_time", "target_time"])
    assert len(csv) == n_test * H * 7 == 2873 * 8 * 7
    assert set(csv.variable) == set(COLUMNS)
    assert csv.target_time.min() == pd.Timestamp("2017-10-24 00:00")
    assert csv.target_time.max() == pd.Timestamp("2018-02-20 23:00")
    assert csv.origin_time.nunique() == n_test
    assert not csv.isna().any().any()
    # y_true is the file's value (original units) at target_time
    raw = pd.read_csv(DATA / "ETTh1.csv", parse_dates=["date"]).set_index("date")
    sample = csv.sample(200, random_state=0)
    expected = [raw.at[t, v] for t, v in zip(sample.target_time, sample.variable)]
    np.testing.assert_allclose(sample.y_true.to_numpy(), expected, rtol=1e-5, atol=1e-4)
    for name in ("test/mse", "test/mae", "test/baseline_mse", "test/mae_orig/OT"):
        assert np.isfinite(result.metrics[name]), name


# -- without the data ---------------------------------------------------------------------------------


# The 48 files conf/experiment/ett/<name>_<L>_<H>.yaml that `experiment=ett data.name=<name>
# model.context_len=<L> model.horizon=<H>` replaced: each set exactly these three values over experiment=ett.
OLD_PRESETS = [
    (name, L, H)
    for name in ("ETTh1", "ETTh2", "ETTm1", "ETTm2")
    for L in (96, 336, 512)
    for H in (96, 192, 336, 720)
]
# What experiment=ett gives every combination (the old files changed none of it)
PROTOCOL = {
    "data.val_start": "2017-06-26 00:00",
    "data.test_start": "2017-10-24 00:00",
    "data.source.end": "2018-02-21 00:00",
    "data.source._target_": "tsformer.data.ett.load_ett",
    "data.source.folder": ["data/ETT-small"],
    "data.target_cols": COLUMNS,
    "data.known_cols": [],
    "data.calendar_features": [],
    "data.scaler": "standard",
    "data.eval_stride": 1,
    "data.batch_size": 32,
    "data.eval_batch_size": 256,
    "trainer.max_epochs": 10,
    "callbacks.early_stopping.patience": 3,
    "model._target_": "tsformer.tasks.EncoderForecaster",
}


@pytest.mark.slow  # composes 48 configs
def test_experiment_ett_composes_every_old_preset(tmp_path):
    """experiment=ett with data.name, model.context_len and model.horizon gives what each old preset
    file gave: its data set and window, on the same protocol; nothing else depends on the three."""
    assert len(OLD_PRESETS) == 48
    base = OmegaConf.to_container(compose_config(["experiment=ett"], tmp_path), resolve=True)
    assert (base["data"]["name"], base["model"]["context_len"], base["model"]["horizon"]) == ("ETTh1", 96, 96)
    for name, L, H in OLD_PRESETS:
        overrides = ["experiment=ett", f"data.name={name}", f"model.context_len={L}", f"model.horizon={H}"]
        cfg = compose_config(overrides, tmp_path)
        assert cfg.data.source.name == name and cfg.data.name == name, overrides
        assert (cfg.model.context_len, cfg.model.horizon) == (L, H), overrides
        assert (cfg.data.context_len, cfg.data.horizon) == (L, H), overrides
        for key, value in PROTOCOL.items():
            got = OmegaConf.select(cfg, key)
            got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
            assert got == value, (overrides, key)
        # the rest of the config is the default combination's
        changed = differing_keys(base, OmegaConf.to_container(cfg, resolve=True))
        assert changed <= {
            "data.name",
            "data.source.name",
            "data.context_len",
            "data.horizon",
            "model.context_len",
            "model.horizon",
        }, (overrides, changed)
    GlobalHydra.instance().clear()


def differing_keys(a, b, prefix="") -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = set(a) | set(b)
        return (
            set().union(*(differing_keys(a.get(k), b.get(k), f"{prefix}{k}.") for k in keys))
            if keys
            else set()
        )
    return set() if a == b else {prefix.rstrip(".")}


def test_ett_config_names_only_paths_in_the_repository():
    text = (Path(CONFIG_DIR) / "data" / "ett.yaml").read_text()
    assert "../" not in text.split("defaults:", 1)[1] and "/work/" not in text
    assert not (Path(CONFIG_DIR) / "experiment" / "ett").exists()


def test_loader_falls_back_to_the_env_folder_then_the_shared_copy(tmp_path, monkeypatch):
    (tmp_path / "copy" / "ETT-small").mkdir(parents=True)
    write_ett_like(tmp_path / "copy" / "ETT-small" / "ETTh2.csv", 14400)
    monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path / "copy"))
    folders = ett.fallback_folders()
    assert folders[0] == tmp_path / "copy" / "ETT-small"
    assert folders[-1] == REPO.parent / "shared" / "data" / "ETT-small"
    # the config's folder (empty here) first, then the env's copy
    (tmp_path / "empty").mkdir()
    assert len(load_ett([tmp_path / "empty"], "ETTh2")) == 14400
    # a file in none of them: the error names the config's folder and every fallback
    monkeypatch.setattr(ett, "fallback_folders", lambda: [tmp_path / "copy" / "ETT-small"])
    with pytest.raises(FileNotFoundError) as err:
        load_ett(tmp_path / "empty", "ETTm2")
    assert str(tmp_path / "empty") in str(err.value) and str(tmp_path / "copy" / "ETT-small") in str(
        err.value
    )


def test_an_installed_package_falls_back_to_the_env_folder_only(tmp_path, monkeypatch):
    """Without a checkout (a pip-installed package) there is no ../shared beside it to try."""
    monkeypatch.setattr(sources, "REPO_ROOT", None)
    monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path))
    assert ett.fallback_folders() == [tmp_path / "ETT-small"]


def test_protocol_timestamps_are_the_protocols_rows():
    assert ett.VAL_START == pd.Timestamp("2017-06-26") and ett.TEST_START == pd.Timestamp("2017-10-24")
    assert ett.END == pd.Timestamp("2018-02-21")
    for name, k in [("ETTh1", 1), ("ETTm2", 4)]:
        grid = pd.date_range(ett.PROTOCOL_START, periods=20000 * k, freq=pd.Timedelta(hours=1) / k)
        assert grid[8640 * k] == ett.VAL_START and grid[11520 * k] == ett.TEST_START
        assert grid[14400 * k] == ett.END and ett.protocol_rows(name) == 14400 * k


def write_ett_like(path: Path, n_rows: int, start="2016-07-01 00:00", freq="h") -> None:
    times = pd.date_range(start, periods=n_rows, freq=freq)
    values = np.arange(n_rows * 7, dtype=float).reshape(n_rows, 7)
    table = pd.DataFrame(values, columns=COLUMNS).assign(date=times.strftime("%Y-%m-%d %H:%M:%S"))
    table[["date", *COLUMNS]].to_csv(path, index=False)


def test_loader_cuts_at_end_and_refuses_a_file_off_the_protocols_grid(tmp_path):
    write_ett_like(tmp_path / "ETTh2.csv", 14400 + 5)
    frame = load_ett(tmp_path, "ETTh2")
    assert len(frame) == 14400 and (frame.series_id == "ETTh2").all()
    # a row missing (a gap) shifts every later row: the timestamps would no longer be the protocol's rows
    table = pd.read_csv(tmp_path / "ETTh2.csv").drop(index=100)
    table.to_csv(tmp_path / "ETTh2.csv", index=False)
    with pytest.raises(ValueError, match="without gaps"):
        load_ett(tmp_path, "ETTh2")
    assert len(load_ett(tmp_path, "ETTh2", end=None)) == 14404  # not the benchmark: no check


def tiny_ett_file(path: Path, first_value: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    times = pd.date_range("2016-07-01", periods=3, freq="h").strftime("%Y-%m-%d %H:%M:%S")
    values = {c: first_value + np.arange(3.0) for c in COLUMNS}
    pd.DataFrame({"date": times, **values}).to_csv(path, index=False)


def test_each_file_is_looked_up_in_every_folder(tmp_path):
    """One file in the first folder does not hide the others in the next."""
    first, second = tmp_path / "data" / "ETT-small", tmp_path / "shared" / "ETT-small"
    tiny_ett_file(first / "ETTm2.csv", 10.0)
    tiny_ett_file(second / "ETTh1.csv", 20.0)
    tiny_ett_file(second / "ETTm2.csv", 30.0)
    assert load_ett([first, second], "ETTh1", end=None).OT.iloc[0] == 20.0
    assert load_ett([first, second], "ETTm2", end=None).OT.iloc[0] == 10.0  # the first folder's copy


def test_missing_file_error_lists_each_folder_once_and_every_way_to_get_it(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the working directory is the repository root: one folder, tried once
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as err:
        load_ett(["data/no-such-ETT-folder", tmp_path / "empty"], "ETTh2")
    message = str(err.value)
    assert message.count("no-such-ETT-folder") == 1 and str(tmp_path / "empty") in message
    assert "ETTh2.csv" in message and "\n" not in message
    ways = ["tsformer-data fetch ett --files ETTh2", "--base-url", ett.BASE_URL, ett.SOURCE_URL, "by hand"]
    assert all(way in message for way in ways), message


def test_loader_errors_name_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(ett, "fallback_folders", list)  # no shared copy to fall back on
    with pytest.raises(FileNotFoundError, match="tsformer-data fetch ett"):
        load_ett([tmp_path / "a", tmp_path / "b"], "ETTh1")
    with pytest.raises(FileNotFoundError, match="ETTm2.csv"):
        load_ett(tmp_path, "ETTm2")
    with pytest.raises(ValueError, match="ETTh1, ETTh2, ETTm1, ETTm2"):
        load_ett(tmp_path, "ETTh3")
