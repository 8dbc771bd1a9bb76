"""Absurd values in the train rows: one warning line per column that names rows and values, or a stop
before any MLflow run (data.outliers=error); the embedded simulators' data and the real data sets are
not flagged."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hydra.utils import instantiate

from conftest import REPO, marked
from test_data_validation import good_table, make_dm, write_csv
from test_train_failures import N_STEPS, config_for, statuses
from tsformer.data import DataValidationError
from tsformer.train import compose_config, run

LOGGER = "tsformer.data.outliers"


def warnings_of_setup(dm, caplog) -> list[str]:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        dm.setup()
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_one_absurd_value_is_named_by_column_row_and_value(tmp_path, caplog):
    df = good_table()
    df.loc[5, "y"] = 1e12  # a train row of series 'a'
    dm = make_dm(str(write_csv(df, tmp_path)))
    (message,) = warnings_of_setup(dm, caplog)
    for word in [
        "plant_log.csv",
        "column 'y'",
        "1 value(s)",
        "1e+12 at row 5 (line 7)",
        "data.outliers=error",
    ]:
        assert word in message, (word, message)
    assert dm.n_windows("test") > 0  # a warning only: the data are still used


def test_many_flagged_values_give_one_line_with_the_worst_and_a_count(caplog):
    df = good_table(200)  # train rows: 0-99 (series a) and 200-299 (series b)
    rows = [3, 30, 60, 210, 220, 230, 240, 250, 260, 270]
    df.loc[rows, "y"] = 1e6 + np.arange(len(rows))  # the last one is the worst
    df.loc[150, "y"] = -1e9  # a test row: not profiled
    (message,) = warnings_of_setup(make_dm(df), caplog)
    assert "column 'y' has 10 value(s)" in message and "and 7 more" in message
    assert message.index("1e+06 at row 270") < message.index("1e+06 at row 260")  # worst first
    assert "\n" not in message and "-1e+09" not in message


def test_on_off_and_capped_columns_are_not_flagged(caplog):
    """A column at one value most of the time has a MAD of 0 or nearly so; its other values are
    measurements, not outliers."""
    df = good_table(200)
    rng = np.random.default_rng(1)
    df["u"] = (rng.random(len(df)) < 0.01).astype(float)  # on/off, rarely on
    # a temperature held at its limit most of the time (its MAD is tiny), with a tail below it
    at_limit = 550.0 + 0.01 * rng.normal(size=len(df))
    df["z"] = np.where(rng.random(len(df)) < 0.6, at_limit, 550.0 - rng.exponential(5.0, len(df)))
    df.loc[20, "z"] = 512.0
    assert warnings_of_setup(make_dm(df), caplog) == []


def test_ignore_skips_the_check_and_an_unknown_mode_is_refused(caplog):
    df = good_table()
    df.loc[5, "y"] = 1e12
    assert warnings_of_setup(make_dm(df, outliers="ignore"), caplog) == []
    with pytest.raises(ValueError, match="data.outliers='fatal'"):
        make_dm(df, outliers="fatal")


def test_error_stops_before_any_mlflow_run_with_one_line(in_tmp):
    df = good_table(N_STEPS)
    df.loc[[5, 6], "y"] = [1e12, -3e11]
    path = write_csv(df, in_tmp, "bad_plant.csv")
    with pytest.raises(DataValidationError) as err:
        run(config_for(path, in_tmp / "out", extra=["data.outliers=error"]))
    message = str(err.value)
    for word in [
        "bad_plant.csv",
        "column 'y'",
        "2 value(s)",
        "1e+12 at row 5 (line 7)",
        "-3e+11 at row 6 (line 8)",
    ]:
        assert word in message, (word, message)
    assert "\n" not in message and "data.outliers=warn" in message
    assert statuses(in_tmp) == []


SHARED = REPO.parent / "shared" / "data"
DATA_SETS = {
    "plant": ["data=plant"],
    "sensor": ["data=sensor"],
    "wind": ["data=wind"],
    "ETTh1": ["data=ett"],
    "ETTm1": ["data=ett", "data.name=ETTm1"],
    "gas_turbine": ["data=gas_turbine"],
    "wind_scada": ["data=wind_scada"],
}
REAL = {
    "ETTh1": "ETT-small/ETTh1.csv",
    "ETTm1": "ETT-small/ETTm1.csv",
    "gas_turbine": "gas_turbine",
    "wind_scada": "wind_turbine_scada/T1.csv",
}


@pytest.mark.parametrize("name", marked(DATA_SETS, REAL, pytest.mark.needs_data))
def test_the_default_rule_flags_nothing_in_the_shipped_data(name, tmp_path, caplog):
    if name in REAL and not (SHARED / REAL[name]).exists():
        pytest.skip(f"{SHARED / REAL[name]} is not here")
    dm = instantiate(compose_config(["model=enc_dec", *DATA_SETS[name]], tmp_path).data)
    assert dm.outliers == "warn"
    assert warnings_of_setup(dm, caplog) == []
