"""Data layer: column roles and checks, simulated data sets, window datasets and the DataModule.

The names below are loaded on first use (PEP 562), so that `tsformer-data fetch` and the other
light modules of the package start without importing torch and Lightning through the DataModule.
"""

from __future__ import annotations

import importlib

_WHERE = {  # name -> its module in this package
    "calendar_feature_names": "calendar",
    "calendar_features": "calendar",
    "TimeSeriesDataModule": "datamodule",
    "Affine": "features",
    "FeaturePipeline": "features",
    "ForecastNoise": "forecast_noise",
    "load_gas_turbine": "gas_turbine",
    "DataValidationError": "schema",
    "SeriesSchema": "schema",
    "find_segments": "schema",
    "resolve_freq": "schema",
    "power_curve": "simulators",
    "simulate_plant": "simulators",
    "simulate_sensor": "simulators",
    "simulate_wind": "simulators",
    "load_table": "sources",
    "load_wind_scada": "wind_scada",
    "WindowDataset": "windows",
    "window_starts": "windows",
}

__all__ = list(_WHERE)  # every name above, loaded on use


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
