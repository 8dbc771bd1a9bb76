"""Data layer: column roles and checks, simulated data sets, window datasets and the DataModule."""

from tsformer.data.calendar import calendar_feature_names, calendar_features
from tsformer.data.datamodule import TimeSeriesDataModule, make_scaler
from tsformer.data.schema import DataValidationError, SeriesSchema, find_segments, resolve_freq
from tsformer.data.simulators import power_curve, simulate_plant, simulate_sensor, simulate_wind
from tsformer.data.sources import load_table
from tsformer.data.windows import WindowDataset, window_starts

__all__ = [
    "DataValidationError",
    "SeriesSchema",
    "TimeSeriesDataModule",
    "WindowDataset",
    "calendar_feature_names",
    "calendar_features",
    "find_segments",
    "load_table",
    "make_scaler",
    "power_curve",
    "resolve_freq",
    "simulate_plant",
    "simulate_sensor",
    "simulate_wind",
    "window_starts",
]
