"""Two more standard long-horizon forecasting sets, read where they lie (`../shared/data/forecast_pool`,
SOURCE.md there; never copied into the repository): Exchange (daily exchange rates of 8 countries,
1990-2010, 7,588 rows) and ILI (weekly influenza-like illness figures of the US CDC, 2002-2020, 966
rows). The pool a forecasting recipe is chosen on, beside ETTh1 and ETTm1 (issue 56).

The literature's protocol for both (the Time-Series-Library's `Dataset_Custom`): the first
int(0.7 n) rows train, the last int(0.2 n) rows test, the rows between validate; a window belongs to
the split holding its target steps, its history may reach back; the scaler is fitted on the train
rows. `conf/data/exchange.yaml` and `conf/data/ili.yaml` state those boundaries as the timestamps of
the rows (`protocol_split_rows`; tests/test_forecast_pool.py checks them against the files).

The columns are renamed to names MLflow takes as metric names (ILI's `% WEIGHTED ILI`, Exchange's
`0`..`6`); the values are the file's.
"""

from __future__ import annotations

import os

import pandas as pd

from tsformer.data.sources import find_first, shared_data_folders

SERIES_ID_COL = "series_id"
FOLDER = "forecast_pool"
# file stem -> (the time column's format, {file column: column name here})
FILES = {
    "exchange_rate": (
        "%Y/%m/%d %H:%M",
        {**{str(i): f"rate_{i}" for i in range(7)}, "OT": "OT"},
    ),
    "national_illness": (
        "%Y-%m-%d %H:%M:%S",
        {
            "% WEIGHTED ILI": "weighted_ili",
            "%UNWEIGHTED ILI": "unweighted_ili",
            "AGE 0-4": "age_0_4",
            "AGE 5-24": "age_5_24",
            "ILITOTAL": "ili_total",
            "NUM. OF PROVIDERS": "num_providers",
            "OT": "OT",
        },
    ),
}
TRAIN_SHARE, TEST_SHARE = 0.7, 0.2


def protocol_split_rows(n_rows: int) -> tuple[int, int]:
    """(first validation row, first test row) of a file of `n_rows` rows: int(0.7 n), n - int(0.2 n)."""
    return int(n_rows * TRAIN_SHARE), n_rows - int(n_rows * TEST_SHARE)


def load_pool(folder, name: str) -> pd.DataFrame:
    """`<name>.csv` from the first folder of `folder` (then `../shared/data/forecast_pool`) that has it:
    `time, series_id, <columns>` (series_id = name)."""
    if name not in FILES:
        raise ValueError(f"unknown forecast pool file {name!r}; choose one of {', '.join(FILES)}")
    time_format, columns = FILES[name]
    folders = [folder] if isinstance(folder, (str, os.PathLike)) else list(folder)
    path = find_first(
        folders + shared_data_folders(FOLDER),
        file_name=f"{name}.csv",
        hint=f"copy the unmodified {name}.csv of the long-horizon forecasting literature (Autoformer's "
        "data sets) into data/forecast_pool, or set data.source.folder",
    )
    table = pd.read_csv(path)
    missing = [c for c in ["date", *columns] if c not in table.columns]
    if missing:
        raise ValueError(
            f"{path}: missing column(s) {missing}; the columns present are {list(table.columns)}"
        )
    times = pd.to_datetime(table["date"], format=time_format)
    frame = table[list(columns)].rename(columns=columns)
    return frame.assign(time=times, **{SERIES_ID_COL: name})[["time", SERIES_ID_COL, *columns.values()]]
