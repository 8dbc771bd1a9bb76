"""The UCI gas turbine data (`data=gas_turbine`, `experiment=gas_turbine`) on the real year files.

Skipped where the files are absent: they are never in the repository, only beside it in
../shared/data/gas_turbine (see conf/data/gas_turbine.yaml).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from mlflow import MlflowClient
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.multioutput import MultiOutputRegressor
from sklearn.neural_network import MLPRegressor

from conftest import REPO, TINY
from tsformer.data import find_segments, gas_turbine, load_gas_turbine
from tsformer.data.gas_turbine import COLUMNS, URL
from tsformer.data.schema import fixed_step
from tsformer.train import compose_config, instantiate_group, run

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gas_turbine"
if not DATA.is_dir():
    pytest.skip(f"gas turbine data not found in {DATA}", allow_module_level=True)
pytestmark = pytest.mark.needs_data(DATA)  # every test here reads it

ROWS_PER_YEAR = {2011: 7411, 2012: 7628, 2013: 7152, 2014: 7158}  # SOURCE.md
SPLIT_YEARS = {"train": {2011, 2012}, "val": {2013}, "test": {2014}}  # the paper's protocol


def test_rows_per_year_and_hourly_timestamps_from_january_first():
    df = load_gas_turbine(DATA)
    assert list(df.columns) == ["time", "series_id", *COLUMNS]
    assert (df.series_id == "gt").all()
    years = df.time.dt.year
    assert years.value_counts().sort_index().to_dict() == ROWS_PER_YEAR
    for year, n_rows in ROWS_PER_YEAR.items():
        times = df.time[years == year].to_numpy()
        expected = pd.date_range(f"{year}-01-01", periods=n_rows, freq="h").to_numpy()
        np.testing.assert_array_equal(times, expected)
    # the values are the file's, row for row
    first_rows = pd.read_csv(DATA / "gt_2013.csv", nrows=3)
    np.testing.assert_array_equal(
        df[years == 2013][COLUMNS].head(3).to_numpy(), first_rows[COLUMNS].to_numpy()
    )


def test_the_first_existing_folder_is_used(tmp_path, monkeypatch):
    df = load_gas_turbine([tmp_path / "no_such_folder", DATA], years=[2014])
    assert len(df) == ROWS_PER_YEAR[2014]
    monkeypatch.chdir(DATA.parent)  # a relative folder is looked up in the working directory
    assert len(load_gas_turbine(["data/gas_turbine", "gas_turbine"], years=[2011])) == ROWS_PER_YEAR[2011]


def test_no_folder_names_every_folder_tried_and_the_data_set(tmp_path, monkeypatch):
    monkeypatch.setattr(gas_turbine, "shared_data_folders", lambda name: [tmp_path / "copy" / name])
    with pytest.raises(FileNotFoundError) as err:
        load_gas_turbine([tmp_path / "a", tmp_path / "b"])
    message = str(err.value)
    assert str(tmp_path / "a") in message and str(tmp_path / "b") in message
    assert str(tmp_path / "copy" / "gas_turbine") in message  # the fallback folder too
    assert "Gas Turbine CO and NOx Emission Data Set" in message


def test_missing_year_file_is_named():
    with pytest.raises(FileNotFoundError, match="gt_2015.csv"):
        load_gas_turbine(DATA, years=[2014, 2015])


def test_each_year_file_is_looked_up_in_every_folder(tmp_path):
    """One year file in the first folder does not hide the other years in the next."""
    first = tmp_path / "data" / "gas_turbine"
    first.mkdir(parents=True)
    pd.read_csv(DATA / "gt_2011.csv").head(5).to_csv(first / "gt_2011.csv", index=False)
    df = load_gas_turbine([first, DATA])
    counts = df.time.dt.year.value_counts().to_dict()
    assert counts == {**ROWS_PER_YEAR, 2011: 5}  # 2011 from the first folder, the others from the next


def test_column_names_with_spaces_around_them_are_read(tmp_path, caplog):
    """A year file whose header says 'AFDP ' (as one real copy does) loads; the rename is logged."""
    values = {c: [float(i), float(i) + 1.0] for i, c in enumerate(COLUMNS)}
    pd.DataFrame(values).rename(columns={"AFDP": "AFDP ", "CO": " CO"}).to_csv(
        tmp_path / "gt_2011.csv", index=False
    )
    with caplog.at_level(logging.INFO, logger="tsformer.data.gas_turbine"):
        frame = load_gas_turbine(tmp_path, years=[2011])
    assert list(frame.columns) == ["time", "series_id", *COLUMNS]
    assert frame["AFDP"].tolist() == values["AFDP"] and frame["CO"].tolist() == values["CO"]
    assert "AFDP " in caplog.text


def test_missing_year_file_lists_each_folder_once_with_the_url(monkeypatch):
    monkeypatch.chdir(REPO)  # the working directory is the repository root: one folder, tried once
    with pytest.raises(FileNotFoundError) as err:
        load_gas_turbine(["data/no-such-gt-folder", DATA], years=[2014, 2015])
    message = str(err.value)
    assert message.count("no-such-gt-folder") == 1 and message.count(str(DATA)) == 1
    assert "gt_2014.csv, gt_2015.csv" in message and URL in message and "\n" not in message


@pytest.fixture(scope="module")
def experiment_cfg(tmp_path_factory):
    return compose_config(["experiment=gas_turbine"], tmp_path_factory.mktemp("compose"))


def test_split_by_year_and_no_window_spans_two_years(experiment_cfg):
    dm = instantiate(experiment_cfg.data)
    dm.setup()
    segments = find_segments(dm.frame, dm.schema, fixed_step(dm.freq), "gas turbine")
    assert len(segments) == 4  # one per year: the gap after each year's last row splits them
    for split, years in SPLIT_YEARS.items():
        times = pd.DatetimeIndex(dm.target_times(split).ravel()).year.to_numpy().reshape(-1, dm.context_len)
        assert set(np.unique(times)) == years, split
        assert (times == times[:, :1]).all(), f"a {split} window spans two years"
    # every row of a year that can start a 24-hour window does: a year of n rows gives n - 23 windows
    for split, years in SPLIT_YEARS.items():
        assert dm.n_windows(split) == sum(ROWS_PER_YEAR[y] - dm.context_len + 1 for y in years)


def test_experiment_builds_the_extra_baselines(experiment_cfg):
    baselines = {b.name: b.estimator for b in instantiate_group(experiment_cfg.baselines)}
    assert set(baselines) == {"baseline_hgb", "baseline_mlp"}
    assert isinstance(baselines["baseline_hgb"], MultiOutputRegressor)
    assert isinstance(baselines["baseline_hgb"].estimator, HistGradientBoostingRegressor)
    assert isinstance(baselines["baseline_mlp"], MLPRegressor)
    assert baselines["baseline_mlp"].early_stopping


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_train_py_logs_the_model_and_every_baseline(in_tmp):
    overrides = [o for o in TINY if not o.startswith("data.source.")]  # those are the simulators'
    overrides += [
        "experiment=gas_turbine",
        "data.eval_stride=24",  # one window per day of val and test: a quick check, not the benchmark
        "baselines.hgb.estimator.estimator.max_iter=2",
        "+baselines.hgb.estimator.estimator.max_leaf_nodes=4",
        "baselines.mlp.estimator.max_iter=3",
    ]
    run(compose_config(overrides, in_tmp / "out"))

    client = MlflowClient(f"sqlite:///{in_tmp}/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "tsformer"]
    (mlflow_run,) = client.search_runs([experiment.experiment_id])
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.tags["dataset"] == "gas_turbine"
    metrics = mlflow_run.data.metrics
    for prefix in ("test/", "test/baseline_", "test/baseline_hgb_", "test/baseline_mlp_"):
        for name in ("mae_orig", "rmse_orig", "mae_orig/CO", "mae_orig/NOX"):
            assert np.isfinite(metrics[prefix + name]), prefix + name


def test_year_files_outside_the_configs_folders_are_found_in_the_shared_copy(tmp_path):
    """The config names only data/gas_turbine; the shared copy is the loader's fallback."""
    assert len(load_gas_turbine([tmp_path / "empty"], years=[2014])) == ROWS_PER_YEAR[2014]
