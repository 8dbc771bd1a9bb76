"""The simulated plant with injected, labelled sensor faults (`experiment=plant_anomaly`).

`simulate_plant` (tsformer.data.simulators) runs normally; in the last `test_fraction` of each series
one fault per series is written into the measured values, and `label` is 1 on its rows:

| series | fault | sensor(s) |
|---|---|---|
| 0 | spike: +8 sd of the sensor for 3 steps | dynamic_pressure |
| 1 | stuck sensor: the reading frozen for 300 steps | dynamic_temperature |
| 2 | slow drift: a bias growing to +4 sd of the sensor over 400 steps | dynamic_temperature |
| 3 | changed relation: the pressure's rise over ambient cut to a quarter for 300 steps | dynamic_pressure (with dynamic_temperature) |

Each fault starts a random step into the test rows (from `seed`); the rows before `test_fraction`
are normal (training and validation rows). `FAULTS` names the faulty sensor(s) of each series.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tsformer.data.simulators import simulate_plant

CHANNELS = [
    "ambient_pressure",
    "ambient_temperature",
    "supply_voltage",
    "dynamic_temperature",
    "dynamic_pressure",
]
FAULTS = {  # series -> (fault, its length in steps, the sensors it concerns)
    0: ("spike", 3, ("dynamic_pressure",)),
    1: ("stuck", 300, ("dynamic_temperature",)),
    2: ("drift", 400, ("dynamic_temperature",)),
    3: ("relation", 300, ("dynamic_pressure", "dynamic_temperature")),
}


def simulate_plant_anomaly(
    n_steps: int = 5000, test_fraction: float = 0.3, seed: int = 0, freq: str = "1min"
) -> pd.DataFrame:
    """`series_id, time, <CHANNELS>, label`: four plants, one injected fault each (see the module)."""
    table = simulate_plant(n_series=len(FAULTS), n_steps=n_steps, freq=freq, seed=seed)
    rng = np.random.default_rng(seed + 1)
    table["label"] = 0
    test_start = round((1.0 - test_fraction) * n_steps)
    longest = max(length for _, length, _ in FAULTS.values())
    if n_steps - test_start < longest + 201:
        raise ValueError(
            f"n_steps={n_steps} x test_fraction={test_fraction}: the test rows must hold the longest fault "
            f"({longest} steps) with 100 normal steps either side"
        )
    for series, (fault, length, sensors) in FAULTS.items():
        rows = np.flatnonzero(table["series_id"].to_numpy() == np.unique(table["series_id"])[series])
        start = test_start + int(rng.integers(100, n_steps - test_start - length - 100))
        hit = rows[start : start + length]
        sensor = sensors[0]
        values = table[sensor].to_numpy(dtype=float)
        sd = values[rows[:test_start]].std()
        ambient = table["ambient_pressure"].to_numpy(dtype=float)
        table[sensor] = inject_fault(values, hit, fault, sd, reference=ambient)
        table.loc[table.index[hit], "label"] = 1
    return table


def inject_fault(
    values: np.ndarray, hit: np.ndarray, fault: str, sd: float, reference: np.ndarray
) -> np.ndarray:
    """A copy of one sensor's `values (T,)` with `fault` written on the rows `hit` (consecutive): a spike
    of +8 `sd`, the reading stuck at its first value, a drift growing to +4 `sd`, or its rise over
    `reference (T,)` cut to a quarter (a changed relation)."""
    values = np.array(values, dtype=float)
    if fault == "spike":
        values[hit] += 8 * sd
    elif fault == "stuck":
        values[hit] = values[hit[0]]
    elif fault == "drift":
        values[hit] += np.linspace(0, 4 * sd, len(hit))
    elif fault == "relation":
        values[hit] = reference[hit] + 0.25 * (values[hit] - reference[hit])
    else:
        raise ValueError(f"fault {fault!r}: one of spike, stuck, drift, relation")
    return values


def normal_split(table: pd.DataFrame, test_fraction: float = 0.3, val_fraction: float = 0.2):
    """(train, val, test) rows of each series: the first (1 - test_fraction) are normal, of which the
    last `val_fraction` share is held out for validation."""
    parts: dict[str, list] = {"train": [], "val": [], "test": []}
    for rows in table.groupby("series_id", sort=False).indices.values():
        n_normal = round((1.0 - test_fraction) * len(rows))
        n_train = round((1.0 - val_fraction) * n_normal)
        parts["train"].append(rows[:n_train])
        parts["val"].append(rows[n_train:n_normal])
        parts["test"].append(rows[n_normal:])
    return tuple(table.iloc[np.concatenate(parts[k])] for k in ("train", "val", "test"))
