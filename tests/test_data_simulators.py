"""Simulated data sets: deterministic, documented columns, and dynamics that make the three jobs real."""

import numpy as np
import pandas as pd
import pytest

from tsformer.data.simulators import power_curve, simulate_plant, simulate_sensor, simulate_wind

PLANT_INPUTS = ["ambient_pressure", "ambient_temperature", "supply_voltage"]
PLANT_STATES = ["dynamic_temperature", "dynamic_pressure"]

SIMULATORS = {
    "plant": (simulate_plant, {"n_series": 2, "n_steps": 500}, [*PLANT_INPUTS, *PLANT_STATES]),
    "wind": (
        simulate_wind,
        {"n_series": 2, "n_steps": 500},
        ["wind_speed", "wind_direction", "wind_direction_sin", "wind_direction_cos", "power"],
    ),
    "sensor": (simulate_sensor, {"n_series": 2, "n_steps": 500}, ["load", "sensor"]),
}


@pytest.mark.parametrize("kind", SIMULATORS)
def test_simulators_are_seeded_tidy_and_complete(kind):
    simulate, kwargs, columns = SIMULATORS[kind]
    a, b, other = simulate(seed=1, **kwargs), simulate(seed=1, **kwargs), simulate(seed=2, **kwargs)
    pd.testing.assert_frame_equal(a, b)
    assert not np.allclose(a[columns].to_numpy(), other[columns].to_numpy())
    assert list(a.columns) == ["series_id", "time", *columns]
    assert len(a) == 2 * 500 and not a.isna().any().any()
    for _, series in a.groupby("series_id"):
        steps = np.diff(series["time"].to_numpy())
        assert (steps == steps[0]).all() and (steps > np.timedelta64(0)).all()
    # series differ by their parameters, not only by noise
    first, second = (a[a.series_id == s][columns[-1]].to_numpy() for s in (0, 1))
    assert not np.allclose(first, second)


def _r2(features, y):
    """R^2 of an ordinary least-squares fit (with intercept) of y on features, per column of y."""
    X = np.hstack([features, np.ones((len(features), 1))])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    residual = y - X @ coef
    return 1 - residual.var(axis=0) / y.var(axis=0)


def _lag_features(inputs, taus=(5, 10, 20, 40)):
    """Inputs and their squares, plus causal exponential filters of them: a crude linear model with memory."""
    base = np.hstack([inputs, inputs**2])
    feats = [base]
    for tau in taus:
        filtered = np.empty_like(base)
        filtered[0] = base[0]
        for t in range(1, len(base)):
            filtered[t] = filtered[t - 1] + (base[t - 1] - filtered[t - 1]) / tau
        feats.append(filtered)
    return np.hstack(feats)


def test_plant_states_need_the_past_of_the_inputs():
    """A per-row regression on the inputs explains clearly less than one that sees their recent past."""
    df = simulate_plant(n_series=1, n_steps=3000, seed=3)
    inputs, states = df[PLANT_INPUTS].to_numpy(), df[PLANT_STATES].to_numpy()
    per_row = _r2(np.hstack([inputs, inputs**2]), states)
    with_memory = _r2(_lag_features(inputs), states)
    assert (with_memory > 0.93).all(), with_memory
    assert (per_row < with_memory - 0.08).all(), (per_row, with_memory)
    # states move a lot within 70 steps: repeating the last value is a poor forecast
    persistence = 1 - ((states[70:] - states[:-70]) ** 2).mean(axis=0) / states.var(axis=0)
    assert (persistence < 0.7).all() and (with_memory - persistence > 0.3).all(), persistence


def test_plant_temperature_follows_a_voltage_step_with_a_lag():
    df = simulate_plant(n_series=1, n_steps=4000, seed=0)
    volts, temp = df["supply_voltage"].to_numpy(), df["dynamic_temperature"].to_numpy()
    jumps = np.flatnonzero(np.abs(np.diff(volts)) > 30) + 1  # first step at the new set-point
    jumps = jumps[(jumps > 1) & (jumps < len(df) - 30)]
    assert len(jumps) >= 5
    immediate = np.abs(temp[jumps + 1] - temp[jumps - 1])
    later = np.abs(temp[jumps + 25] - temp[jumps - 1])
    assert np.median(immediate) < 0.3 * np.median(later), (immediate, later)


def test_wind_power_follows_the_power_curve():
    df = simulate_wind(n_series=1, n_steps=3000, seed=0)
    assert df["power"].between(0, 3600).all() and (df["wind_speed"] > 0).all()
    assert df["wind_direction"].between(0, 360, inclusive="left").all()
    np.testing.assert_allclose(df["wind_direction_sin"] ** 2 + df["wind_direction_cos"] ** 2, 1.0)
    calm = df["wind_speed"] < 2.5
    assert calm.any() and (df.loc[calm, "power"] < 60).all()  # below cut-in: noise only
    np.testing.assert_allclose(power_curve([2.9, 3.0, 12.0, 24.9, 25.0]), [0, 0, 3600, 3600, 0])
    assert np.corrcoef(df["power"], power_curve(df["wind_speed"]))[0, 1] > 0.95


def test_sensor_overshoots_after_a_load_step():
    """A damped oscillation: after a load step the sensor swings past its new level before settling."""
    df = simulate_sensor(n_series=1, n_steps=6000, seed=0)
    load, sensor = df["load"].to_numpy(), df["sensor"].to_numpy()
    steps = np.flatnonzero(np.abs(np.diff(load)) > 30) + 1
    steps = steps[(steps > 10) & (steps < len(df) - 20)]
    assert len(steps) >= 5
    swing = np.array(
        [np.abs(sensor[s : s + 15] - sensor[s - 1]).max() / abs(load[s] - load[s - 1]) for s in steps]
    )
    assert np.median(swing) > 1.1, swing


def test_plant_heating_drift_changes_the_plant_from_its_start_only():
    plain = simulate_plant(n_series=2, n_steps=1000, seed=0)
    aged = simulate_plant(n_series=2, n_steps=1000, seed=0, heating_drift=0.2, drift_start=0.6)
    pd.testing.assert_frame_equal(plain[PLANT_INPUTS], aged[PLANT_INPUTS])  # no random number drawn
    before = plain.groupby("series_id").cumcount() < 600
    pd.testing.assert_frame_equal(plain[before], aged[before])
    # more heating: the temperature settles higher above ambient once the drift has acted (~3 tau_T)
    later = ~before & (plain.groupby("series_id").cumcount() >= 700)
    assert (aged.dynamic_temperature[later] > plain.dynamic_temperature[later]).mean() > 0.95
