"""The UCI gas turbine CO and NOx emission data (Kaya, Tüfekci, Uzun 2019), read from its year files.

The data set is not in the repository (and must never be copied into it): the loader reads each
`gt_<year>.csv` from the first of the folders named in the config that has it. The files hold one
row per hour in time order, but no timestamp, so `load_gas_turbine` builds synthetic ones (see its
docstring).
"""

from __future__ import annotations

import logging
import os

import pandas as pd

from tsformer.data.schema import DataValidationError
from tsformer.data.sources import find_first, shared_data_folders

log = logging.getLogger(__name__)

DATASET = 'UCI Machine Learning Repository, "Gas Turbine CO and NOx Emission Data Set"'
COLUMNS = ["AT", "AP", "AH", "AFDP", "GTEP", "TIT", "TAT", "TEY", "CDP", "CO", "NOX"]
SERIES_ID = "gt"
URL = "https://archive.ics.uci.edu/dataset/551/gas+turbine+co+and+nox+emission+data+set"


def load_gas_turbine(folder, years=(2011, 2012, 2013, 2014)) -> pd.DataFrame:
    """All rows of the chosen years: `time, series_id, AT, AP, AH, AFDP, GTEP, TIT, TAT, TEY, CDP, CO, NOX`.

    The timestamps are synthetic: row i of `gt_<year>.csv` is placed at <year>-01-01 00:00 + i hours.
    A year file has fewer rows than the year has hours, so the years are separated by a gap in time
    and the DataModule's gap handling puts each year in its own segment: no window spans two years.
    Within a year, the hours the files leave out (if any) are unknown; consecutive rows are treated
    as consecutive hours.
    """
    if not list(years):
        raise ValueError("no years asked for: give at least one of 2011..2014")
    years = [int(y) for y in years]
    hint = (
        f"download the {DATASET} from {URL} and put its year files, unmodified, in data/gas_turbine "
        f"(years {years} need {', '.join(f'gt_{y}.csv' for y in years)}; or set data.source.folder)"
    )
    folders = [folder] if isinstance(folder, (str, os.PathLike)) else list(folder)
    folders += shared_data_folders("gas_turbine")
    frames = []
    for year in years:
        path = find_first(folders, file_name=f"gt_{year}.csv", hint=hint)
        table = pd.read_csv(path)
        # some copies of the year files carry spaces around a name ('AFDP '): match the names without them
        padded = {c: c.strip() for c in table.columns if c != c.strip() and c.strip() in COLUMNS}
        if padded:
            log.info("%s: column(s) %s read without the spaces around their names", path, list(padded))
            table = table.rename(columns=padded)
        missing = [c for c in COLUMNS if c not in table.columns]
        if missing:
            raise DataValidationError(
                f"{path}: missing column(s) {missing}; the columns present are {list(table.columns)}"
            )
        start = pd.Timestamp(year=year, month=1, day=1)
        hours_in_year = (pd.Timestamp(year=year + 1, month=1, day=1) - start) // pd.Timedelta(hours=1)
        if len(table) > hours_in_year:
            raise ValueError(f"{path}: {len(table)} rows do not fit into the {hours_in_year} hours of {year}")
        times = pd.date_range(start, periods=len(table), freq="h")
        frames.append(table[COLUMNS].assign(time=times, series_id=SERIES_ID))
        log.info("%s: %d rows, synthetic hourly timestamps %s .. %s", path, len(table), times[0], times[-1])
    log.info(
        "gas turbine: timestamps are synthetic (built from the row order, hourly from Jan 1 of each year)"
    )
    return pd.concat(frames, ignore_index=True)[["time", "series_id", *COLUMNS]]
