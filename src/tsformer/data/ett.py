"""The ETT benchmark (Electricity Transformer Temperature, ETDataset `ETT-small/`): ETTh1, ETTh2
(hourly), ETTm1, ETTm2 (15-minute), each one transformer station, 2016-07-01 .. 2018-06-26, columns
`date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT`.

Licence CC BY-ND 4.0 (redistribute only unmodified copies); cite Zhou et al., "Informer: Beyond
Efficient Transformer for Long Sequence Time-Series Forecasting", AAAI 2021. The files are never
copied into the repository: `tsformer-data fetch ett` downloads them to `data/ETT-small/`
(`tsformer.data.fetch`), and `load_ett` reads them where they lie.

The standard protocol (Informer, Autoformer, PatchTST, Time-Series-Library: `Dataset_ETT_hour` and
`Dataset_ETT_minute`) splits by row, counting months of 30 days from the first row:
train 12 months, validation 4, test 4, and leaves every later row out:

    ETTh  train rows [0, 8640)   val targets [8640, 11520)   test targets [11520, 14400)
    ETTm  the same times 4:      [0, 34560), [34560, 46080), [46080, 57600)

A val/test window's history reaches back L rows into the previous split (val rows [8640 - L, 11520)).
All four files start at 2016-07-01 00:00 on a gap-free grid, so these row boundaries are the same
timestamps for the hourly and the 15-minute files: 2017-06-26 00:00 (360 days), 2017-10-24 00:00
(480 days) and 2018-02-21 00:00 (600 days). That is how conf/data/ett.yaml states them: `val_start`
and `test_start` for the DataModule, whose rule (a window belongs to the split holding all its
target steps; history may reach back) is exactly the protocol's; `end` for this loader, which cuts
the rows from 2018-02-21 on before the DataModule sees the table, so they are in no split and in no
window's history either.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd

from tsformer.data.sources import find_first, shared_data_folders

log = logging.getLogger(__name__)

DATASETS = ("ETTh1", "ETTh2", "ETTm1", "ETTm2")
COLUMNS = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
SERIES_ID_COL = "series_id"

# sha256 of the upstream files (ETDataset, current versions: after commit 450ea77 swapped ETTm1/ETTm2)
SHA256 = {
    "ETTh1.csv": "f18de3ad269cef59bb07b5438d79bb3042d3be49bdeecf01c1cd6d29695ee066",
    "ETTh2.csv": "a3dc2c597b9218c7ce1cd55eb77b283fd459a1d09d753063f944967dd6b9218b",
    "ETTm1.csv": "6ce1759b1a18e3328421d5d75fadcb316c449fcd7cec32820c8dafda71986c9e",
    "ETTm2.csv": "db973ca252c6410a30d0469b13d696cf919648d0f3fd588c60f03fdbdbadd1fd",
}
BASE_URL = "https://raw.githubusercontent.com/zhouhaoyi/ETDataset/main/ETT-small/"
SOURCE_URL = "https://github.com/zhouhaoyi/ETDataset/tree/main/ETT-small"  # the same files, for a browser
LICENCE_NOTE = (
    "ETT-small is licensed CC BY-ND 4.0 (https://creativecommons.org/licenses/by-nd/4.0/): share only "
    'unmodified copies, never commit the files to this repository. Cite: Zhou et al., "Informer: Beyond '
    'Efficient Transformer for Long Sequence Time-Series Forecasting", AAAI 2021.'
)

# The protocol's boundaries as timestamps (see the module docstring): row 8640 / 11520 / 14400 of an
# hourly file, row 34560 / 46080 / 57600 of a 15-minute file.
PROTOCOL_START = pd.Timestamp("2016-07-01 00:00")
VAL_START = PROTOCOL_START + pd.Timedelta(days=12 * 30)  # 2017-06-26
TEST_START = VAL_START + pd.Timedelta(days=4 * 30)  # 2017-10-24
END = TEST_START + pd.Timedelta(days=4 * 30)  # 2018-02-21, exclusive
STEPS_PER_HOUR = {"h": 1, "m": 4}  # ETTh*: hourly, ETTm*: 15 minutes


def fallback_folders() -> list[Path]:
    """Where ETT-small is looked for after the config's folders (`sources.shared_data_folders`)."""
    return shared_data_folders("ETT-small")


def load_ett(folder, name: str = "ETTh1", end=END) -> pd.DataFrame:
    """`<name>.csv` from the first folder of `folder` that has it: `time, series_id, HUFL, ..., OT`
    (series_id = name).

    `end` (exclusive; default 2018-02-21 00:00, the standard protocol's end = row 14400 of ETTh,
    57600 of ETTm) cuts the later rows off here, so that they are not in the table at all: not in
    a split and not in any window's history. `end=None` keeps every row.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown ETT data set {name!r}; choose one of {', '.join(DATASETS)}")
    folders = [folder] if isinstance(folder, (str, os.PathLike)) else list(folder)
    path = find_first(
        folders + fallback_folders(),
        file_name=f"{name}.csv",
        hint=f"download it with `tsformer-data fetch ett --files {name}` (into data/ETT-small, from "
        f"{BASE_URL}; --base-url URL takes another mirror), or copy the unmodified {name}.csv from "
        f"{SOURCE_URL} into data/ETT-small by hand (or set data.source.folder)",
    )
    table = pd.read_csv(path)
    missing = [c for c in ["date", *COLUMNS] if c not in table.columns]
    if missing:
        raise ValueError(
            f"{path}: missing column(s) {missing}; the columns present are {list(table.columns)}"
        )
    times = pd.to_datetime(table["date"], format="%Y-%m-%d %H:%M:%S")
    frame = table[COLUMNS].assign(time=times, **{SERIES_ID_COL: name})[["time", SERIES_ID_COL, *COLUMNS]]
    n_file = len(frame)
    if end is not None:
        end = pd.Timestamp(end)
        frame = frame[frame["time"] < end].reset_index(drop=True)
        _check_protocol_rows(frame, name, end, path)
    log.info(
        "%s: %d rows %s .. %s kept (%d rows from %s on left out)",
        path,
        len(frame),
        frame["time"].iloc[0] if len(frame) else "-",
        frame["time"].iloc[-1] if len(frame) else "-",
        n_file - len(frame),
        end,
    )
    return frame


def protocol_rows(name: str, end=END) -> int:
    """Rows from the protocol's start up to `end` on the file's grid (14400 for ETTh, 57600 for ETTm)."""
    hours = (pd.Timestamp(end) - PROTOCOL_START) / pd.Timedelta(hours=1)
    return round(hours * STEPS_PER_HOUR[name[3]])


def _check_protocol_rows(frame: pd.DataFrame, name: str, end: pd.Timestamp, path: Path) -> None:
    """The protocol counts rows; the timestamps in the config equal those rows only on the upstream
    grid (first row 2016-07-01 00:00, no gap, no duplicate). Anything else is refused."""
    step = pd.Timedelta(hours=1) / STEPS_PER_HOUR[name[3]]
    times = frame["time"].to_numpy()
    expected = pd.date_range(PROTOCOL_START, periods=protocol_rows(name, end), freq=step).to_numpy()
    if len(times) != len(expected) or not np.array_equal(times, expected):
        first = pd.Timestamp(times[0]) if len(times) else None
        raise ValueError(
            f"{path}: expected the rows before {end} to be the {len(expected)} steps of {step} from "
            f"{PROTOCOL_START} without gaps (the standard ETT files), found {len(times)} rows from {first}; "
            "is it an unmodified ETT file? (data.source.end=null keeps every row and skips this check)"
        )
