"""Calendar features: where a timestamp falls in the day, week and year, as sin/cos pairs.

Why sin/cos: hour 23 and hour 0 are neighbours, which a raw hour number hides; a point on the unit
circle keeps them close, and the pair (sin, cos) identifies the phase uniquely. All values lie in
[-1, 1], so these channels are fed to the model unscaled, as extra known covariates (the calendar of
the future is known in advance).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

CALENDAR_FEATURES = ("minute", "hour", "dayofweek", "dayofyear")


def _phase(times: pd.DatetimeIndex, feature: str):
    """(position within the period, period length) for one feature, both in the period's units."""
    seconds = times.second.to_numpy() + times.microsecond.to_numpy() / 1e6
    minute = times.minute.to_numpy() + seconds / 60.0  # fractional minute of the hour
    hour = times.hour.to_numpy() + minute / 60.0  # fractional hour of the day
    if feature == "minute":
        return minute, 60.0
    if feature == "hour":
        return hour, 24.0
    if feature == "dayofweek":
        return times.dayofweek.to_numpy() + hour / 24.0, 7.0
    if feature == "dayofyear":
        days_in_year = np.where(times.is_leap_year, 366.0, 365.0)  # period varies with the year
        return times.dayofyear.to_numpy() - 1 + hour / 24.0, days_in_year
    raise ValueError(f"unknown calendar feature {feature!r}; choose from {CALENDAR_FEATURES}")


def calendar_feature_names(features=("hour", "dayofweek", "dayofyear")) -> list[str]:
    """Column names produced by `calendar_features`, in order: cal_<feature>_sin, cal_<feature>_cos."""
    return [f"cal_{f}_{trig}" for f in features for trig in ("sin", "cos")]


def calendar_features(times, features=("hour", "dayofweek", "dayofyear")) -> pd.DataFrame:
    """One (sin, cos) column pair per feature, one row per timestamp.

    `hour` uses the fractional hour (10:30 -> 10.5), `dayofweek` and `dayofyear` also advance within
    the day, so every feature is smooth in time.
    """
    times = pd.DatetimeIndex(times)
    columns = {}
    for feature in features:
        phase, period = _phase(times, feature)
        angle = 2.0 * np.pi * phase / period
        columns[f"cal_{feature}_sin"] = np.sin(angle)
        columns[f"cal_{feature}_cos"] = np.cos(angle)
    return pd.DataFrame(columns, index=range(len(times)), columns=calendar_feature_names(features))
