"""Simulated data sets, generated deterministically from a seed, so that the project runs out of the box.

Each generator returns a tidy long DataFrame `series_id, time, <columns>`, one row per series and time
step. Series differ by their parameters, all drawn from `np.random.default_rng(seed)`. Time constants
and schedules are counted in time steps; daily cycles follow the real clock of the timestamps.
Notation: t is the step, xi ~ N(0, 1) fresh noise at every step, U(a, b) a uniform draw per series.

1. Plant (`simulate_plant`, default 1 min steps): inputs known in advance, hidden states with inertia.

   Known inputs
     ambient_temperature  Ta_t = Ta0 + A sin(2 pi (hour_t - 9) / 24) + w_t + 0.1 xi     [degC]
                          Ta0 ~ U(12, 24), A ~ U(3, 7); weather w: AR(1), time constant 600 steps, sd 2
     ambient_pressure     Pa_t = 101.3 + p_t + 0.03 xi                                    [kPa]
                          p: AR(1), time constant 1500 steps, sd 0.8
     supply_voltage       V_t = Vset_t + 0.5 sin(2 pi t / 37) + 0.3 xi                     [V]
                          Vset: set-point held for U{30..120} steps, then a new level ~ U(170, 250)
   Hidden regime
     fouling factor f_t, piecewise constant: Poisson(3) jumps per series at random steps, f ~ U(0.9, 1.1)
   States (Euler steps of first-order lags; parameters per series)
     R(T)     = R0 (1 + 0.004 (T - 20))                 heater resistance rises with temperature [Ohm]
     Q_t      = V_t^2 / R(T_t)                          ohmic heating [W]
     T*_t     = Ta_t + k f_t Q_t                        temperature the plant tends to
     T_{t+1}  = T_t + (T*_t - T_t) / tau_T + 0.05 xi
     P*_t     = Pa_t + beta (exp(gamma (T_t - 20)) - 1) pressure the plant tends to (vapour-like)
     P_{t+1}  = P_t + (P*_t - P_t) / tau_P + 0.02 xi
     R0 ~ U(45, 55), k ~ U(0.03, 0.04) K/W (times 1 + heating_drift from the drift on), tau_T ~ U(10, 30),
     beta ~ U(2, 4) kPa,
     gamma ~ U(0.03, 0.045) 1/K, tau_P ~ U(5, 15)
   Measured states
     dynamic_temperature = T_t + 0.2 xi   [degC],   dynamic_pressure = P_t + 0.1 xi   [kPa]
   The simulation runs 300 warm-up steps that are discarded, so the series start in a settled state.
   A voltage step moves the temperature by up to ~25 degC within 2-3 tau_T, and the pressure follows
   with a second lag: the states depend on the last ~100 steps of inputs, nonlinearly.

2. Wind farm turbine (`simulate_wind`, default 10 min steps): known weather, target power.
     log wind speed x: x_{t+1} = mu + phi (x_t - mu) + 0.45 sqrt(1 - phi^2) xi,  phi = exp(-1/36)
                       mu = log(U(6.5, 8.5))
     wind_speed        v_t = exp(x_t) (1 + 0.15 sin(2 pi (hour_t - 9) / 24))            [m/s]
     wind_direction    d_{t+1} = (d_t + 4 xi) mod 360, plus its sin and cos               [deg]
     power curve       c(v) = 0 for v < 3 or v >= 25 (cut-out); 3600 (v^3 - 3^3) / (12^3 - 3^3)
                       for 3 <= v < 12; 3600 for 12 <= v < 25 (rated)                    [kW]
     wake loss         L(d) = 1 - 0.12 exp(-(delta(d, d_wake) / 20)^2), d_wake ~ U(0, 360)
     power             clip(c(v) L(d) (1 + 0.03 xi) + 15 xi, 0, cap_t)                  [kW]
                       cap_t = 1800 during curtailments (start with probability 1/500 per step,
                       last U{6..36} steps), else 3600.

3. High-frequency sensor (`simulate_sensor`, default 1 s steps): a 30 s -> 70 s forecasting job.
     load              set-point held U{20..120} steps, then a new level ~ U(20, 100)   [%]  (known)
     response          y_t = a1 y_{t-1} + a2 y_{t-2} + g (1 - a1 - a2) load_{t-1}
                       a1 = 2 r cos(theta), a2 = -r^2, r = exp(-zeta omega), theta = omega sqrt(1 - zeta^2),
                       omega = 2 pi / period: a damped oscillation (poles r e^{+-i theta}) settling at g load
                       period ~ U(8, 16) steps, zeta ~ U(0.08, 0.2), g ~ U(0.8, 1.2)
     drift             AR(1), time constant 3600 steps, sd 2
     sensor            y_t + drift_t + 0.5 xi
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def _time_axis(start, n_steps: int, freq: str) -> pd.DatetimeIndex:
    return pd.date_range(start=start, periods=n_steps, freq=freq)


def _hours(times: pd.DatetimeIndex) -> np.ndarray:
    """Fractional hour of the day, (T,)."""
    return times.hour.to_numpy() + times.minute.to_numpy() / 60.0 + times.second.to_numpy() / 3600.0


def _ar1(rng, n_series: int, n_steps: int, tau: float, sd: float) -> np.ndarray:
    """Stationary AR(1) noise with time constant `tau` steps and standard deviation `sd`, (S, T)."""
    phi = np.exp(-1.0 / tau)
    shocks = rng.standard_normal((n_series, n_steps)) * sd * np.sqrt(1.0 - phi**2)
    out = np.empty((n_series, n_steps))
    out[:, 0] = rng.standard_normal(n_series) * sd
    for t in range(1, n_steps):
        out[:, t] = phi * out[:, t - 1] + shocks[:, t]
    return out


def _schedule(rng, n_series: int, n_steps: int, min_hold: int, max_hold: int, low: float, high: float):
    """Piecewise-constant set-points: each level is held for U{min_hold..max_hold} steps, (S, T)."""
    n_levels = n_steps // min_hold + 1
    holds = rng.integers(min_hold, max_hold + 1, size=(n_series, n_levels))
    levels = rng.uniform(low, high, size=(n_series, n_levels))
    ends = np.cumsum(holds, axis=1)  # step at which each level ends
    steps = np.arange(n_steps)
    which = np.stack([np.searchsorted(ends[s], steps, side="right") for s in range(n_series)])
    return np.take_along_axis(levels, which, axis=1)


def _regimes(rng, n_series: int, n_steps: int, mean_changes: float, low: float, high: float):
    """Hidden piecewise-constant factor that jumps a Poisson number of times at random steps, (S, T)."""
    out = np.empty((n_series, n_steps))
    for s in range(n_series):
        n_changes = rng.poisson(mean_changes)
        change_at = np.sort(rng.integers(1, n_steps, size=n_changes))
        values = rng.uniform(low, high, size=n_changes + 1)
        out[s] = values[np.searchsorted(change_at, np.arange(n_steps), side="right")]
    return out


def _tidy(times: pd.DatetimeIndex, columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """(S, T) arrays -> long frame sorted by (series_id, time)."""
    n_series, n_steps = next(iter(columns.values())).shape
    frame = {
        "series_id": np.repeat(np.arange(n_series), n_steps),
        "time": np.tile(times.to_numpy(), n_series),
    }
    frame.update({name: values.reshape(-1) for name, values in columns.items()})  # (S, T) -> (S*T,)
    return pd.DataFrame(frame)


def simulate_plant(
    n_series: int = 3,
    n_steps: int = 6000,
    freq: str = "1min",
    start: str = "2024-01-01",
    seed: int = 0,
    with_fouling: bool = False,
    heating_drift: float = 0.0,
    drift_start: float = 0.7,
) -> pd.DataFrame:
    """Plant with known inputs (ambient pressure and temperature, supply voltage) and two lagged states.

    Columns: series_id, time, ambient_pressure, ambient_temperature, supply_voltage,
    dynamic_temperature, dynamic_pressure (and, `with_fouling`, the hidden fouling factor `fouling` and the
    plant's rated heating gain `rated_gain` = 1000 k / R0: its temperature rise in K per 1000 V^2 of supply
    when clean, a number per series known from its commissioning; it draws no random number).
    Equations in the module docstring. `heating_drift`: from the step at fraction `drift_start` of the
    series on, every series heats by that fraction more (k (1 + heating_drift), an aging heater): a
    drift no input shows, for models refitted on the newer rows (`init_from`). It draws no random number:
    the plant is otherwise the one without it.
    """
    if not 0.0 <= drift_start <= 1.0:
        raise ValueError(f"drift_start={drift_start}: a fraction of the steps, between 0 and 1")
    rng = np.random.default_rng(seed)
    warmup = 300
    n_total = n_steps + warmup
    times = _time_axis(start, n_total, freq) - warmup * pd.tseries.frequencies.to_offset(freq)
    S = n_series

    def per_series(low, high):  # (S, 1), broadcasts over time
        return rng.uniform(low, high, size=(S, 1))

    # known inputs, (S, T)
    ta0, amplitude = per_series(12, 24), per_series(3, 7)
    ambient_temperature = (
        ta0
        + amplitude * np.sin(2 * np.pi * (_hours(times) - 9) / 24)
        + _ar1(rng, S, n_total, tau=600, sd=2.0)
        + 0.1 * rng.standard_normal((S, n_total))
    )
    ambient_pressure = (
        101.3 + _ar1(rng, S, n_total, tau=1500, sd=0.8) + 0.03 * rng.standard_normal((S, n_total))
    )
    supply_voltage = (
        _schedule(rng, S, n_total, 30, 120, 170.0, 250.0)
        + 0.5 * np.sin(2 * np.pi * np.arange(n_total) / 37)
        + 0.3 * rng.standard_normal((S, n_total))
    )
    fouling = _regimes(rng, S, n_total, mean_changes=3, low=0.9, high=1.1)

    # plant parameters, (S,)
    r0, k = per_series(45, 55)[:, 0], per_series(0.03, 0.04)[:, 0]
    tau_t, tau_p = per_series(10, 30)[:, 0], per_series(5, 15)[:, 0]
    beta, gamma = per_series(2, 4)[:, 0], per_series(0.03, 0.045)[:, 0]
    process_noise = rng.standard_normal((2, S, n_total))
    drift_step = warmup + round(drift_start * n_steps)

    temperature = np.empty((S, n_total))
    pressure = np.empty((S, n_total))
    temperature[:, 0] = ambient_temperature[:, 0]
    pressure[:, 0] = ambient_pressure[:, 0]
    for t in range(n_total - 1):
        T = temperature[:, t]
        heating = supply_voltage[:, t] ** 2 / (r0 * (1 + 0.004 * (T - 20)))
        aging = 1.0 + heating_drift if t >= drift_step else 1.0
        T_target = ambient_temperature[:, t] + k * aging * fouling[:, t] * heating
        P_target = ambient_pressure[:, t] + beta * (np.exp(gamma * (T - 20)) - 1)
        temperature[:, t + 1] = T + (T_target - T) / tau_t + 0.05 * process_noise[0, :, t]
        pressure[:, t + 1] = (
            pressure[:, t] + (P_target - pressure[:, t]) / tau_p + 0.02 * process_noise[1, :, t]
        )

    measured_temperature = temperature + 0.2 * rng.standard_normal((S, n_total))
    measured_pressure = pressure + 0.1 * rng.standard_normal((S, n_total))
    keep = slice(warmup, None)
    columns = {
        "ambient_pressure": ambient_pressure[:, keep],
        "ambient_temperature": ambient_temperature[:, keep],
        "supply_voltage": supply_voltage[:, keep],
        "dynamic_temperature": measured_temperature[:, keep],
        "dynamic_pressure": measured_pressure[:, keep],
    }
    if with_fouling:
        columns["fouling"] = fouling[:, keep]
        columns["rated_gain"] = np.repeat(1000 * (k / r0)[:, None], n_steps, axis=1)  # (S, T), constant
    return _tidy(times[keep], columns)


REGIMES = ("low", "normal", "high")  # fouling in U(0.9, 1.1) cut into thirds


def simulate_plant_regimes(
    n_series: int = 32, n_steps: int = 1500, freq: str = "1min", start: str = "2024-01-01", seed: int = 0
) -> pd.DataFrame:
    """The plant of `simulate_plant` with its hidden fouling regime as a label on every step: `regime`
    is low (fouling < 0.9667), normal or high (> 1.0333), the thirds of its range U(0.9, 1.1); the
    factor itself is not a column. Fouling scales the heating, so the regime shows in how far the
    temperature rises above ambient for a given supply voltage. Each series' own heating coefficient
    k / R0 varies too, by more than fouling does: without it, a window cannot tell a high fouling from a
    strong heater on a plant not trained on. `rated_gain` (1000 k / R0, the plant's commissioning value,
    constant per series) is that coefficient, as an engineer knows it; `data=plant_regime` reads it
    (benchmarks/RESULTS_classification.md: the plant demo on new plants)."""
    table = simulate_plant(n_series, n_steps, freq, start, seed, with_fouling=True)
    edges = np.linspace(0.9, 1.1, len(REGIMES) + 1)[1:-1]  # (2,): the inner edges of the thirds
    regime = np.asarray(REGIMES)[np.searchsorted(edges, table.pop("fouling").to_numpy())]
    return table.assign(regime=regime)


def power_curve(wind_speed: np.ndarray, cut_in=3.0, rated_speed=12.0, cut_out=25.0, rated_power=3600.0):
    """Turbine power [kW] for a wind speed [m/s]: cubic between cut-in and rated, flat to cut-out."""
    v = np.asarray(wind_speed, dtype=float)
    ramp = rated_power * (v**3 - cut_in**3) / (rated_speed**3 - cut_in**3)
    power = np.where(v < rated_speed, ramp, rated_power)
    return np.where((v < cut_in) | (v >= cut_out), 0.0, power)


def simulate_wind(
    n_series: int = 1, n_steps: int = 8640, freq: str = "10min", start: str = "2024-01-01", seed: int = 0
) -> pd.DataFrame:
    """Wind turbine: wind speed and direction (weather, known as forecasts) and the power produced.

    Columns: series_id, time, wind_speed, wind_direction, wind_direction_sin, wind_direction_cos,
    power. Equations in the module docstring; default 8640 steps = 60 days.
    """
    rng = np.random.default_rng(seed)
    times = _time_axis(start, n_steps, freq)
    S = n_series
    log_mean = np.log(rng.uniform(6.5, 8.5, size=(S, 1)))
    log_speed = log_mean + _ar1(rng, S, n_steps, tau=36, sd=0.45)
    wind_speed = np.exp(log_speed) * (1 + 0.15 * np.sin(2 * np.pi * (_hours(times) - 9) / 24))

    direction0 = rng.uniform(0, 360, size=(S, 1))
    wind_direction = np.mod(direction0 + np.cumsum(4.0 * rng.standard_normal((S, n_steps)), axis=1), 360)

    wake_centre = rng.uniform(0, 360, size=(S, 1))
    off_wake = np.abs((wind_direction - wake_centre + 180) % 360 - 180)  # angular distance in [0, 180]
    wake_loss = 1 - 0.12 * np.exp(-((off_wake / 20) ** 2))

    cap = np.full((S, n_steps), 3600.0)
    starts = rng.random((S, n_steps)) < 1 / 500
    durations = rng.integers(6, 37, size=(S, n_steps))
    for s, t in zip(*np.nonzero(starts)):
        cap[s, t : t + durations[s, t]] = 1800.0

    power = power_curve(wind_speed) * wake_loss * (1 + 0.03 * rng.standard_normal((S, n_steps)))
    power = np.clip(power + 15 * rng.standard_normal((S, n_steps)), 0.0, cap)
    radians = np.deg2rad(wind_direction)
    return _tidy(
        times,
        {
            "wind_speed": wind_speed,
            "wind_direction": wind_direction,
            "wind_direction_sin": np.sin(radians),
            "wind_direction_cos": np.cos(radians),
            "power": power,
        },
    )


def simulate_sensor(
    n_series: int = 2, n_steps: int = 20000, freq: str = "1s", start: str = "2024-01-01", seed: int = 0
) -> pd.DataFrame:
    """High-frequency sensor: a load set-point (known) and a damped-oscillation sensor response.

    Columns: series_id, time, load, sensor. Equations in the module docstring.
    """
    rng = np.random.default_rng(seed)
    times = _time_axis(start, n_steps, freq)
    S = n_series
    load = _schedule(rng, S, n_steps, 20, 120, 20.0, 100.0)

    omega = 2 * np.pi / rng.uniform(8, 16, size=S)
    zeta = rng.uniform(0.08, 0.2, size=S)
    gain = rng.uniform(0.8, 1.2, size=S)
    r = np.exp(-zeta * omega)
    a1 = 2 * r * np.cos(omega * np.sqrt(1 - zeta**2))
    a2 = -(r**2)
    b = gain * (1 - a1 - a2)  # unit DC gain times g: y settles at g * load

    response = np.empty((S, n_steps))
    response[:, 0] = response[:, 1] = gain * load[:, 0]
    for t in range(2, n_steps):
        response[:, t] = a1 * response[:, t - 1] + a2 * response[:, t - 2] + b * load[:, t - 1]

    drift = _ar1(rng, S, n_steps, tau=3600, sd=2.0)
    sensor = response + drift + 0.5 * rng.standard_normal((S, n_steps))
    return _tidy(times, {"load": load, "sensor": sensor})
