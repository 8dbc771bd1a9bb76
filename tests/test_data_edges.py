"""Users' tables at the edges: day-first dates, a step that changes, time zones, CSV conventions,
columns without a role or with spaces in their names, long tables without a series column.

Each is read the same way in training (`TimeSeriesDataModule`) and in prediction (`predict.py`,
whose model folder remembers how the training file was written); what cannot be read stops with a
one-line message that names the setting to change.
"""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pandas as pd
import pytest

from conftest import PLANT_TARGETS, plant_csv_overrides
from tsformer.data import DataValidationError, TimeSeriesDataModule, load_table, simulate_plant
from tsformer.jobs.forecasting.forecaster import Forecaster
from tsformer.predict import main as predict_main
from tsformer.train import compose_config, run

DAY_FIRST = "%d/%m/%Y %H:%M"


def hourly(n_steps=100, start="2024-01-01", freq="h", **columns) -> pd.DataFrame:
    """One series: a time column and target y = 0, 1, 2, ... (plus `columns`)."""
    times = pd.date_range(start, periods=n_steps, freq=freq)
    return pd.DataFrame({"time": times, "y": np.arange(n_steps, dtype=float), **columns})


def make_dm(source, **overrides) -> TimeSeriesDataModule:
    kwargs = {
        "name": "toy",
        "target_cols": ["y"],
        "context_len": 5,
        "horizon": 3,
        "val_fraction": 0.25,
        "test_fraction": 0.25,
    }
    return TimeSeriesDataModule(source, **{**kwargs, **overrides})


def setup_error(source, **overrides) -> str:
    with pytest.raises(DataValidationError) as err:
        make_dm(source, **overrides).setup()
    message = str(err.value)
    assert "\n" not in message
    return message


# -- 3. day-first dates ----------------------------------------------------------------------------


def test_dates_that_read_day_first_and_month_first_ask_for_the_time_format(tmp_path):
    """12 days of hourly dd/mm/yyyy times: every day <= 12, so month-first also parses every row."""
    df = hourly(12 * 24)
    expected = df.time.copy()
    df["time"] = df.time.dt.strftime(DAY_FIRST)
    path = tmp_path / "day_first.csv"
    df.to_csv(path, index=False)
    message = setup_error(str(path))
    for words in [
        str(path),
        "column 'time'",
        "day-first and month-first",
        "'02/01/2024 00:00'",
        "row 24 (line 26)",
        "data.time_format",
        "--time-format",
        f"'{DAY_FIRST}'",
    ]:
        assert words in message, (words, message)
    dm = make_dm(str(path), time_format=DAY_FIRST)
    dm.setup()
    assert dm.frame.time.tolist() == expected.tolist()


def test_a_date_order_that_only_one_reading_fits_is_used():
    """The first date (05/01) reads both ways, a later one (13/01) only day-first: day-first wins."""
    df = hourly(20 * 24)
    expected = df.time.copy()
    df["time"] = df.time.dt.strftime(DAY_FIRST)
    dm = make_dm(df)
    dm.setup()
    assert dm.frame.time.tolist() == expected.tolist()


def test_iso_dates_of_the_first_twelve_days_are_not_questioned():
    df = hourly(12 * 24)
    expected = df.time.copy()
    df["time"] = df.time.dt.strftime("%Y-%m-%d %H:%M:%S")
    dm = make_dm(df)
    dm.setup()
    assert dm.frame.time.tolist() == expected.tolist()


def test_an_unparseable_time_suggests_the_time_format(tmp_path):
    df = hourly()
    df["time"] = df.time.dt.strftime("%Y-%m-%d %H:%M").astype(object)
    df.loc[47, "time"] = "47th hour"
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    message = setup_error(str(path))
    for words in ["'47th hour'", "row 47 (line 49)", "data.time_format", "--time-format"]:
        assert words in message, (words, message)


# -- 9. a step that changes, a freq that is not the file's -------------------------------------------


def test_a_step_change_says_where_and_from_what_to_what(tmp_path):
    """10 min steps, then 15 min from row 1500: the val and test rows are all 15 min apart."""
    ten = pd.date_range("2024-01-01", periods=1500, freq="10min")
    fifteen = pd.date_range(ten[-1] + pd.Timedelta("15min"), periods=500, freq="15min")
    df = pd.DataFrame({"time": ten.append(fifteen), "y": np.arange(2000.0)})
    path = tmp_path / "step.csv"
    df.to_csv(path, index=False)
    message = setup_error(str(path), val_fraction=0.15, test_fraction=0.1)  # val: from row 1500
    for words in [
        str(path),
        "split 'val'",
        "changes from 10min to 15min",
        "row 1500 (line 1502)",
        str(fifteen[0]),
        "resample",
    ]:
        assert words in message, (words, message)


def test_a_step_change_back_to_the_frequency_is_found_from_its_other_end():
    """15 min steps first, then 10 min: the train rows are 15 min apart; the change is where 10 min starts."""
    fifteen = pd.date_range("2024-01-01", periods=500, freq="15min")
    ten = pd.date_range(fifteen[-1] + pd.Timedelta("10min"), periods=1500, freq="10min")
    df = pd.DataFrame({"time": fifteen.append(ten), "y": np.arange(2000.0)})
    message = setup_error(df, val_fraction=0.5, test_fraction=0.25)  # train: the 500 rows 15 min apart
    for words in ["split 'train'", "changes from 15min to 10min", "row 500", str(ten[0])]:
        assert words in message, (words, message)


@pytest.mark.parametrize("freq", ["5min", "20min"])
def test_a_freq_other_than_the_files_step_is_refused(freq, tmp_path):
    path = tmp_path / "ten.csv"
    hourly(200, freq="10min").to_csv(path, index=False)
    message = setup_error(str(path), freq=freq)
    for words in [str(path), f"data.freq='{freq}'", "199 of the 199 steps", "'10min'", "column 'time'"]:
        assert words in message, (words, message)


# -- 10. time zones, CSV conventions -------------------------------------------------------------------


def test_times_with_two_utc_offsets_across_a_dst_change_become_utc(tmp_path):
    local = pd.date_range("2024-03-30", periods=100, freq="h", tz="Europe/Berlin")  # DST on March 31
    path = tmp_path / "dst.csv"
    hourly(100).assign(time=local.astype(str)).to_csv(path, index=False)
    assert {"+01:00", "+02:00"} <= {t[-6:] for t in pd.read_csv(path).time}
    dm = make_dm(str(path))
    dm.setup()
    assert dm.frame.time.tolist() == list(local.tz_convert("UTC").tz_localize(None))
    assert dm.freq.freqstr == "h"


EURO_CSV = {"sep": ";", "decimal": ",", "encoding": "latin-1"}


def european_csv(path, df: pd.DataFrame) -> None:
    """As a German spreadsheet saves it: semicolons, decimal commas, Latin-1."""
    df.to_csv(path, index=False, sep=";", decimal=",", encoding="latin-1")


def temperatures() -> pd.DataFrame:
    """A target whose name is not ASCII and whose values have decimals: 0.25, 1.25, ..."""
    return hourly().rename(columns={"y": "température"}).assign(température=lambda d: d.température + 0.25)


def test_csv_options_read_semicolons_decimal_commas_and_latin_1(tmp_path):
    path = tmp_path / "euro.csv"
    df = temperatures()
    european_csv(path, df)
    dm = make_dm(str(path), target_cols=["température"], csv=EURO_CSV)
    dm.setup()
    np.testing.assert_array_equal(dm.frame["température"].sort_index(), df["température"])


@pytest.mark.parametrize(
    "options, words",
    [
        ({}, ["not utf-8 text", "byte 0xe9", "data.csv.encoding", "--encoding", "latin-1"]),
        ({"encoding": "latin-1"}, ["one column 'time;température'", "';'", "data.csv.sep", "--sep"]),
        (
            {"encoding": "latin-1", "sep": ";"},
            ["'0,25'", "column 'température'", "row 0 (line 2)", "data.csv.decimal", "--decimal"],
        ),
    ],
)
def test_a_csv_written_another_way_names_the_option_to_set(options, words, tmp_path):
    path = tmp_path / "euro.csv"
    european_csv(path, temperatures())
    message = setup_error(str(path), target_cols=["température"], csv=options)
    for word in [str(path), *words]:
        assert word in message, (word, message)


def test_load_table_refuses_an_option_it_does_not_pass_on(tmp_path):
    path = tmp_path / "t.csv"
    hourly().to_csv(path, index=False)
    with pytest.raises(ValueError, match="unknown CSV option.*'skiprows'"):
        load_table(path, skiprows=1)


# -- 11, 12. columns without a role, names with spaces ------------------------------------------------


def test_a_column_without_a_role_is_ignored_with_an_info_line(tmp_path, caplog):
    path = tmp_path / "t.csv"
    hourly(notes="checked").to_csv(path, index=False)
    caplog.set_level(logging.INFO, logger="tsformer.data.schema")
    dm = make_dm(str(path))
    dm.setup()
    assert "notes" not in dm.frame.columns
    assert any("['notes']" in r.message and "ignored" in r.message for r in caplog.records)


def test_column_names_with_spaces_around_them_match(tmp_path, caplog):
    path = tmp_path / "gt.csv"
    hourly(u=1.0).rename(columns={"y": "AFDP ", "u": " u"}).to_csv(path, index=False)
    caplog.set_level(logging.INFO, logger="tsformer.data.schema")
    dm = make_dm(str(path), target_cols=["AFDP"], known_cols=["u"])
    dm.setup()
    assert {"AFDP", "u"} <= set(dm.frame.columns)
    assert any("'AFDP '" in r.message and "'AFDP'" in r.message for r in caplog.records)


def test_two_names_that_match_once_stripped_are_refused():
    message = setup_error(hourly().rename(columns={"y": "y "}).assign(**{" y": 2.0}))
    assert "columns ['y ', ' y'] all match 'y'" in message, message


# -- 13. several series without a series column; values printed plainly --------------------------------


def test_duplicate_times_of_stacked_series_suggest_the_series_column(tmp_path):
    df = pd.concat([hourly(site="a"), hourly(site="b")], ignore_index=True)
    path = tmp_path / "long.csv"
    df.to_csv(path, index=False)
    message = setup_error(str(path))
    for words in ["duplicate timestamp", "row 100 (line 102)", "data.series_col", "['site']"]:
        assert words in message, (words, message)


def test_messages_print_values_as_in_the_file(tmp_path):
    """An integer column with one 'inf' reads as floats: the message shows inf, and the series 2, plainly."""
    lines = ["series_id,time,y"]
    for sid in (1, 2):
        lines += [f"{sid},2024-01-01 {h:02d}:00,{'inf' if (sid, h) == (2, 5) else h}" for h in range(24)]
    path = tmp_path / "inf.csv"
    path.write_text("\n".join(lines) + "\n")
    message = setup_error(str(path), series_col="series_id")
    assert "infinite value inf at column 'y', row 29 (line 31), series 2," in message, message
    assert "np." not in message


# -- prediction reads the table as training did ---------------------------------------------------------


def plant_in_march() -> pd.DataFrame:
    """The tiny plant of TINY, moved to 5 March: its dd/mm dates also read as 3 May."""
    df = simulate_plant(n_series=2, n_steps=800, start="2024-03-05", seed=0)
    # a column without a role, and a role's name with a space after it, as spreadsheets leave them
    return df.assign(remarque="ok").rename(columns={"supply_voltage": "supply_voltage "})


def european_table(df: pd.DataFrame, path) -> None:
    european_csv(path, df.assign(time=df.time.dt.strftime(DAY_FIRST)))


@pytest.fixture(scope="module")
def european_run(tmp_path_factory):
    """A tiny model trained on a European CSV of the plant (day-first dates, ';', decimal comma,
    Latin-1), with a column without a role and a name with a space."""
    folder = tmp_path_factory.mktemp("european")
    european_table(plant_in_march(), folder / "plant.csv")
    overrides = [
        "model=enc_dec",
        *plant_csv_overrides(folder / "plant.csv"),
        "logger=none",
        f"data.time_format='{DAY_FIRST}'",
        *[f"data.csv.{k}='{v}'" for k, v in EURO_CSV.items()],
    ]
    return run(compose_config(overrides, folder / "out"))


def prediction_table(result) -> tuple[pd.DataFrame, pd.Timestamp]:
    """The last test origin's history and the 70 future rows (targets empty), and that origin."""
    origin = pd.Timestamp(result.forecasts.origin_time.max())
    df = plant_in_march()
    df = df[df.time <= origin + 70 * pd.Timedelta("1min")].copy()
    df.loc[df.time > origin, PLANT_TARGETS] = np.nan
    return df, origin


@pytest.mark.slow
def test_predict_py_reads_the_table_as_training_did(european_run, tmp_path):
    """Remembered: time format and CSV options; as in training: the column without a role is
    ignored and the name with a space matches. Flags read a file written another way."""
    config = json.loads((european_run.model_folder / "tsformer.json").read_text())
    assert config["data"]["time_format"] == DAY_FIRST and config["data"]["csv"] == EURO_CSV
    table, origin = prediction_table(european_run)
    european_table(table, tmp_path / "new.csv")
    args = [str(european_run.model_folder), str(tmp_path / "new.csv"), "-o", str(tmp_path / "a.csv")]
    assert predict_main(args) == 0
    out = pd.read_csv(tmp_path / "a.csv", parse_dates=["origin_time"])
    assert (out.origin_time == origin).all() and len(out) == 2 * 70 * 2

    table.to_csv(tmp_path / "iso.csv", index=False, sep="|")  # ISO times, '|', decimal points, UTF-8
    flags = ["--time-format", "%Y-%m-%d %H:%M:%S", "--sep", "|", "--decimal", ".", "--encoding", "utf-8"]
    args = [str(european_run.model_folder), str(tmp_path / "iso.csv"), "-o", str(tmp_path / "b.csv"), *flags]
    assert predict_main(args) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "b.csv", parse_dates=["origin_time"]), out)


@pytest.mark.slow
def test_predict_asks_for_the_time_format_of_ambiguous_dates(european_run, tmp_path, capsys):
    """A model folder without a time format (trained on ISO times) refuses dd/mm dates that also read
    mm/dd, rather than move the origin by months."""
    old = tmp_path / "model"
    shutil.copytree(european_run.model_folder, old)
    config = json.loads((old / "tsformer.json").read_text())
    config["data"].update(time_format=None, csv={})  # as a model trained on ISO times in a plain CSV
    (old / "tsformer.json").write_text(json.dumps(config))
    assert Forecaster.load(old).contract.time_format is None
    table, origin = prediction_table(european_run)
    european_table(table, tmp_path / "new.csv")
    csv_flags = [f"--{k}={v}" for k, v in EURO_CSV.items()]
    args = [str(old), str(tmp_path / "new.csv"), "-o", str(tmp_path / "out.csv"), *csv_flags]
    assert predict_main(args) == 2
    error = capsys.readouterr().err
    for words in ["new.csv", "day-first and month-first", "--time-format", f"'{DAY_FIRST}'"]:
        assert words in error, (words, error)
    assert predict_main([*args, f"--time-format={DAY_FIRST}"]) == 0
    assert (pd.read_csv(tmp_path / "out.csv", parse_dates=["origin_time"]).origin_time == origin).all()
