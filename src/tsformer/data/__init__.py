"""Data layer: column roles and checks, simulated data sets, window datasets and the DataModule."""

from tsformer.data.calendar import calendar_feature_names, calendar_features
from tsformer.data.datamodule import TimeSeriesDataModule, make_scaler
from tsformer.data.forecast_noise import ForecastNoise
from tsformer.data.gas_turbine import load_gas_turbine
from tsformer.data.schema import DataValidationError, SeriesSchema, find_segments, resolve_freq
from tsformer.data.simulators import power_curve, simulate_plant, simulate_sensor, simulate_wind
from tsformer.data.sources import load_table
from tsformer.data.wind_scada import load_wind_scada
from tsformer.data.windows import WindowDataset, window_starts

__all__ = [
    "DataValidationError",
    "ForecastNoise",
    "SeriesSchema",
    "TimeSeriesDataModule",
    "WindowDataset",
    "calendar_feature_names",
    "calendar_features",
    "find_segments",
    "load_gas_turbine",
    "load_table",
    "load_wind_scada",
    "make_scaler",
    "power_curve",
    "resolve_freq",
    "simulate_plant",
    "simulate_sensor",
    "simulate_wind",
    "window_starts",
]
