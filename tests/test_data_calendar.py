"""Calendar features: bounded, periodic, fractional within the day."""

import numpy as np
import pandas as pd
import pytest

from tsformer.data.calendar import calendar_feature_names, calendar_features

FEATURES = ("minute", "hour", "dayofweek", "dayofyear")


def test_calendar_features_are_bounded_unit_circle_pairs():
    times = pd.date_range("2023-12-25", periods=5000, freq="17min")
    cal = calendar_features(times, FEATURES)
    assert list(cal.columns) == calendar_feature_names(FEATURES)
    assert cal.columns[:2].tolist() == ["cal_minute_sin", "cal_minute_cos"]
    assert len(cal) == len(times) and np.isfinite(cal.to_numpy()).all()
    assert (cal.abs() <= 1).all().all()
    for f in FEATURES:
        np.testing.assert_allclose(cal[f"cal_{f}_sin"] ** 2 + cal[f"cal_{f}_cos"] ** 2, 1.0)


@pytest.mark.parametrize("feature, period", [("minute", "1h"), ("hour", "1D"), ("dayofweek", "7D")])
def test_calendar_features_repeat_after_their_period(feature, period):
    times = pd.date_range("2024-03-01", periods=500, freq="7min")
    now, later = (
        calendar_features(times, [feature]),
        calendar_features(times + pd.Timedelta(period), [feature]),
    )
    np.testing.assert_allclose(now.to_numpy(), later.to_numpy(), atol=1e-9)
    half = calendar_features(times + pd.Timedelta(period) / 2, [feature])
    assert not np.allclose(now.to_numpy(), half.to_numpy())


def test_hour_is_fractional_and_days_of_year_wrap():
    cal = calendar_features(pd.to_datetime(["2024-01-01 10:30", "2024-01-01 10:00"]), ["hour"])
    np.testing.assert_allclose(cal.loc[0, "cal_hour_sin"], np.sin(2 * np.pi * 10.5 / 24))
    assert cal.loc[0, "cal_hour_sin"] != cal.loc[1, "cal_hour_sin"]
    year = calendar_features(pd.to_datetime(["2023-12-31 23:59", "2024-01-01 00:00"]), ["dayofyear"])
    np.testing.assert_allclose(year.iloc[0], year.iloc[1], atol=1e-3)  # New Year's Eve meets New Year


def test_unknown_calendar_feature_is_an_error():
    with pytest.raises(ValueError, match="weekofmonth"):
        calendar_features(pd.date_range("2024-01-01", periods=3, freq="h"), ["weekofmonth"])
