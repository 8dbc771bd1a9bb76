"""Bad inputs fail early, and the message says where: file, column, row (and CSV line = row + 2)."""

import numpy as np
import pandas as pd
import pytest

from tsformer.data import DataValidationError, SeriesSchema, TimeSeriesDataModule, load_table


def good_table(n_steps=40) -> pd.DataFrame:
    """Two series in long format, 1 min steps: target y, known u, observed z."""
    times = pd.date_range("2024-01-01", periods=n_steps, freq="min")
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "site": np.repeat(["a", "b"], n_steps),
            "time": np.tile(times.strftime("%Y-%m-%d %H:%M:%S"), 2),
            "y": rng.normal(size=2 * n_steps),
            "u": rng.normal(size=2 * n_steps),
            "z": rng.normal(size=2 * n_steps),
        }
    )


def good_table_overrides(csv_path) -> list[str]:
    """train.py's settings for `good_table` saved as a CSV at `csv_path` (data=csv, its column roles)."""
    return [
        "data=csv",
        f"data.source={csv_path}",
        "data.series_col=site",
        "data.target_cols=[y]",
        "data.known_cols=[u]",
        "data.observed_cols=[z]",
        "data.val_fraction=0.3",
        "data.test_fraction=0.3",
    ]


def make_dm(source, **overrides):
    kwargs = {
        "name": "toy",
        "target_cols": ["y"],
        "known_cols": ["u"],
        "observed_cols": ["z"],
        "series_col": "site",
        "context_len": 5,
        "horizon": 3,
        "val_fraction": 0.25,
        "test_fraction": 0.25,
    }
    kwargs.update(overrides)
    return TimeSeriesDataModule(source, **kwargs)


def write_csv(df, tmp_path, name="plant_log.csv"):
    path = tmp_path / name
    df.to_csv(path, index=False)
    return path


def test_a_good_csv_passes(tmp_path):
    dm = make_dm(str(write_csv(good_table(), tmp_path)))
    dm.setup()
    assert dm.n_windows("test") > 0 and dm.freq.freqstr == "min"


def _missing_column(df):
    return df.drop(columns="u")


def _non_numeric(df):
    df["y"] = df["y"].astype(object)
    df.loc[47, "y"] = "12,5"
    return df


def _nan_cell(df):
    df.loc[47, "z"] = np.nan
    return df


def _duplicate_time(df):
    df.loc[47, "time"] = df.loc[46, "time"]
    return df


def _unsorted_time(df):
    df.loc[[46, 47], "time"] = df.loc[[47, 46], "time"].to_numpy()
    return df


def _unparseable_time(df):
    df.loc[47, "time"] = "yesterday noon"
    return df


# (how to break the table, words the message must contain)
BAD_INPUTS = {
    "missing column": (_missing_column, ["'u'", "columns present", "'site'"]),
    "non-numeric value": (_non_numeric, ["column 'y'", "row 47 (line 49)", "'12,5'", "series 'b'"]),
    "NaN cell": (_nan_cell, ["column 'z'", "row 47 (line 49)", "empty/NaN", "2024-01-01 00:07:00"]),
    "duplicate time": (_duplicate_time, ["column 'time'", "row 47 (line 49)", "duplicate", "row 46"]),
    "unsorted time": (_unsorted_time, ["column 'time'", "row 47 (line 49)", "unsorted", "series 'b'"]),
    "unparseable time": (_unparseable_time, ["column 'time'", "row 47 (line 49)", "'yesterday noon'"]),
}


@pytest.mark.parametrize("kind", BAD_INPUTS)
def test_bad_csv_input_names_file_column_and_row(kind, tmp_path):
    break_table, expected = BAD_INPUTS[kind]
    path = write_csv(break_table(good_table()), tmp_path)
    dm = make_dm(str(path))
    with pytest.raises(DataValidationError) as err:
        dm.setup()
    message = str(err.value)
    assert str(path) in message
    for words in expected:
        assert words in message, (words, message)


def test_unsorted_times_name_the_first_series_to_go_back_at_its_first_step_back():
    """Series interleaved, both going back: the series that appears first is named, not the first row."""
    df = good_table()
    df = df.iloc[np.argsort(np.tile(np.arange(40), 2), kind="stable")].reset_index(drop=True)  # a, b, a, b
    df.loc[[11, 9], "time"] = df.loc[[9, 11], "time"].to_numpy()  # b goes back at row 11, first in the file
    df.loc[[50, 52], "time"] = df.loc[[52, 50], "time"].to_numpy()  # a goes back at row 52
    with pytest.raises(DataValidationError, match=r"column 'time', row 52, series 'a'.* at row 50"):
        make_dm(df).setup()


def test_bad_dataframe_input_names_the_data_set_and_row_without_csv_lines():
    df = _nan_cell(good_table())
    with pytest.raises(DataValidationError, match=r"toy \(in-memory table\).*column 'z', row 47, series 'b'"):
        make_dm(df).setup()


@pytest.mark.parametrize(
    "split, overrides",
    [
        ("test", {"test_start": "2024-01-01 00:38:00"}),  # 2 test rows per series, horizon 3
        ("val", {"val_start": "2024-01-01 00:20:00", "test_start": "2024-01-01 00:22:00"}),
        ("train", {"context_len": 30, "horizon": 0}),  # 20 train rows per series
    ],
)
def test_too_few_rows_for_one_window(split, overrides, tmp_path):
    path = write_csv(good_table(), tmp_path)
    dm = make_dm(str(path), **overrides)
    with pytest.raises(DataValidationError) as err:
        dm.setup()
    assert dm.datasets == {}  # a failed setup is not mistaken for a finished one
    message = str(err.value)
    for words in [str(path), f"split '{split}'", "column 'time'", "row ", "(line "]:
        assert words in message, (words, message)


def test_a_step_shorter_than_the_frequency_is_an_error(tmp_path):
    df = good_table()
    df.loc[47, "time"] = "2024-01-01 00:06:30"  # between rows 46 and 48
    with pytest.raises(DataValidationError, match=r"closer than the frequency.*row 47 \(line 49\)"):
        make_dm(str(write_csv(df, tmp_path))).setup()


def test_validate_sorts_by_series_then_time_and_keeps_file_rows():
    df = good_table(n_steps=6).sort_values(["time", "site"])  # interleaved long format is fine
    clean = SeriesSchema(target_cols=["y"], known_cols=["u"], series_col="site").validate(df, "x.csv")
    assert clean["site"].tolist() == ["a"] * 6 + ["b"] * 6
    assert clean["time"].is_monotonic_increasing is False and clean["time"].dtype.kind == "M"
    assert clean["y"].dtype == np.float64
    assert list(clean.columns) == ["site", "time", "y", "u"]


def test_load_table_reads_parquet_and_rejects_unknown_or_missing_files(tmp_path):
    df = good_table()
    df.to_parquet(tmp_path / "t.parquet")
    pd.testing.assert_frame_equal(load_table(tmp_path / "t.parquet"), df)
    (tmp_path / "t.xlsx").write_text("x")
    with pytest.raises(DataValidationError, match=r"t\.xlsx.*unknown file type"):
        load_table(tmp_path / "t.xlsx")
    with pytest.raises(FileNotFoundError, match="nowhere.csv"):
        load_table(tmp_path / "nowhere.csv")


def test_schema_rejects_a_column_with_two_roles():
    with pytest.raises(DataValidationError, match="more than one role"):
        SeriesSchema(target_cols=["y"], known_cols=["y"])
