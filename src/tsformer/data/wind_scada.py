"""The Turkish wind turbine SCADA data set (Kaggle "Wind Turbine Scada Dataset", file T1.csv).

One turbine, 10-minute steps over 2018, with 32 gaps in the timeline (the DataModule splits the
series there, so no window spans a gap). The file is not in the repository and must never be copied
into it: `load_wind_scada` reads it where it lies, from the first existing path among the candidates
the config names. It comes from Kaggle (`URL`).

`theoretical_power` is the manufacturer's power curve evaluated at the measured wind speed. It
knows the future wind exactly, so it must never be a model input: it is kept only for the
power-curve baseline (`tasks.baselines.PowerCurve`).
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from tsformer.data.schema import DataValidationError, describe_row
from tsformer.data.sources import find_first, shared_data_folders

SERIES_ID = "T1"
TIME_FORMAT = "%d %m %Y %H:%M"  # e.g. "01 01 2018 00:10"
# tidy name <- start of the column name in the file (the degree sign is spelled differently by copies)
COLUMNS = {
    "time": "Date/Time",
    "power": "LV ActivePower",
    "wind_speed": "Wind Speed",
    "theoretical_power": "Theoretical_Power_Curve",
    "wind_direction": "Wind Direction",
}
URL = "https://www.kaggle.com/datasets/berkerisen/wind-turbine-scada-dataset"


def load_wind_scada(path, start=None, end=None) -> pd.DataFrame:
    """T1.csv as a tidy table, one row per 10-minute step present in the file.

    Columns: `time, series_id, power, wind_speed, wind_direction, wind_direction_sin,
    wind_direction_cos, theoretical_power` (kW, m/s, degrees). `start`/`end` keep the times in
    [start, end) (e.g. a small slice for tests). Gaps stay gaps: nothing is filled in.
    """
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    file = find_first(
        paths + [folder / "T1.csv" for folder in shared_data_folders("wind_turbine_scada")],
        hint=f'download T1.csv, the wind turbine SCADA data, from the Kaggle data set "Wind Turbine Scada '
        f'Dataset" ({URL}) and put it, unmodified, at data/wind_turbine_scada/T1.csv '
        "(or set data.source.path)",
    )
    # encoding_errors: some copies of the file spell the degree sign in Latin-1
    raw = pd.read_csv(file, encoding_errors="replace")
    names = {}
    for tidy, prefix in COLUMNS.items():
        found = [c for c in raw.columns if str(c).strip().startswith(prefix)]
        if len(found) != 1:
            raise DataValidationError(
                f"{file}: expected one column starting with {prefix!r}, found {found}; "
                f"the columns present are {list(raw.columns)}"
            )
        names[found[0]] = tidy
    df = raw.rename(columns=names)[list(COLUMNS)]

    times = pd.to_datetime(df["time"], format=TIME_FORMAT, errors="coerce")
    bad = np.flatnonzero(times.isna().to_numpy())
    if bad.size:
        raise DataValidationError(
            f"{file}: time {df['time'].iloc[bad[0]]!r} at {describe_row(str(file), int(bad[0]))} does not "
            f"match the format {TIME_FORMAT!r} ({bad.size} such cell(s))"
        )
    df["time"] = times
    df.insert(1, "series_id", SERIES_ID)
    angle = np.deg2rad(df["wind_direction"].to_numpy(dtype=np.float64))  # where the wind comes from
    df["wind_direction_sin"] = np.sin(angle)
    df["wind_direction_cos"] = np.cos(angle)
    df = df[[c for c in df.columns if c != "theoretical_power"] + ["theoretical_power"]]

    keep = np.ones(len(df), dtype=bool)
    if start is not None:
        keep &= (df["time"] >= pd.Timestamp(start)).to_numpy()
    if end is not None:
        keep &= (df["time"] < pd.Timestamp(end)).to_numpy()
    return df[keep].reset_index(drop=True)
