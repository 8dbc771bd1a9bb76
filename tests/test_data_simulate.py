"""`tsformer-data simulate <name>`: the simulated data sets as tables, for `data=csv` and `predict.py`.

README "Forecast new data" is followed as a user would: train on the default data (TINY settings),
write new data with the README's own `tsformer-data simulate` line, forecast it with predict.py.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate

from conftest import PLANT_KNOWN, PLANT_TARGETS, REPO, TINY, plant_csv_overrides
from tsformer import predict
from tsformer.data import fetch
from tsformer.train import compose_config, run

KEYS = ["series_id", "origin_time", "target_time", "step", "variable"]
# the TINY plant: the settings TINY gives data.source
TINY_PLANT = ["--n-series", "2", "--n-steps", "800", "--seed", "0"]


def readme_simulate_args() -> list[str]:
    """The arguments of the `tsformer-data simulate` command of README's "Forecast new data" section."""
    section = (REPO / "README.md").read_text().split("## Forecast new data")[1].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith(".venv/bin/tsformer-data simulate")]
    assert len(lines) == 1, lines
    words = shlex.split(lines[0].split("#")[0])
    return words[words.index("simulate") :]


def test_simulated_plant_is_what_data_plant_trains_on_through_data_csv(tmp_path):
    path = tmp_path / "plant.csv"
    assert fetch.cli(["simulate", "plant", "--output", str(path), *TINY_PLANT]) == 0
    from_csv = instantiate(compose_config(plant_csv_overrides(path), tmp_path / "a").data)
    simulated = instantiate(compose_config(TINY, tmp_path / "b").data)  # data=plant, the default
    for dm in (from_csv, simulated):
        dm.setup()
    columns = ["series_id", "time", *PLANT_KNOWN, *PLANT_TARGETS]
    pd.testing.assert_frame_equal(
        from_csv.frame[columns].reset_index(drop=True), simulated.frame[columns].reset_index(drop=True)
    )


def test_wind_table_holds_only_the_columns_data_wind_uses(tmp_path, capsys):
    path = tmp_path / "wind.csv"
    args = ["simulate", "wind", "--output", str(path), "--n-steps", "50", "--future-steps", "5"]
    assert fetch.cli(args) == 0
    table = pd.read_csv(path)
    # wind_direction (degrees) is no input of data=wind: predict.py would refuse the column
    known = ["wind_speed", "wind_direction_sin", "wind_direction_cos"]
    assert list(table.columns) == ["series_id", "time", *known, "power"]
    assert table.power.isna().to_numpy().tolist() == [False] * 45 + [True] * 5
    assert table.drop(columns="power").notna().all().all()
    assert f"{sys.executable} {REPO / 'predict.py'} " in capsys.readouterr().out  # runs from any folder


@pytest.mark.parametrize("future", [[], ["--future-steps", "5"]], ids=["train_hint", "predict_hint"])
def test_printed_commands_name_this_interpreter_and_an_existing_script(tmp_path, capsys, future):
    """The next command `simulate` prints runs as shown, without the environment active."""
    assert (
        fetch.cli(["simulate", "plant", "--n-steps", "40", "--output", str(tmp_path / "a b.csv"), *future])
        == 0
    )
    hint = capsys.readouterr().out.strip().splitlines()[-1]
    command = shlex.split(hint.split(": ", 1)[1])
    assert os.path.samefile(command[0], sys.executable)
    assert Path(command[1]).resolve() in (REPO / "train.py", REPO / "predict.py")  # may be shown relative
    assert str(tmp_path / "a b.csv") in command[2:] or f"data.source={tmp_path / 'a b.csv'}" in command[2:]


def test_future_steps_must_leave_history(tmp_path, capsys):
    args = ["simulate", "sensor", "--output", str(tmp_path / "s.csv"), "--n-steps", "40"]
    assert fetch.cli([*args, "--future-steps", "40"]) == 2
    err = capsys.readouterr().err
    assert "--future-steps 40" in err and "--n-steps 40" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s.csv").exists()


def test_plant_regime_is_the_labelled_stream_data_plant_regime_trains_on(tmp_path, capsys):
    from tsformer.data.simulators import simulate_plant_regimes

    path = tmp_path / "regime.csv"
    assert (
        fetch.cli(["simulate", "plant_regime", "--output", str(path), "--n-series", "2", "--n-steps", "30"])
        == 0
    )
    expected = simulate_plant_regimes(
        n_series=2, n_steps=30
    )  # every column is a channel, the time or the label
    pd.testing.assert_frame_equal(pd.read_csv(path, parse_dates=["time"]), expected, check_dtype=False)
    out = capsys.readouterr().out
    assert "predict.py <run id>" in out and "--output classes.csv" in out and "data.label_col=regime" in out


def test_plant_anomaly_is_the_labelled_table_data_plant_anomaly_judges(tmp_path, capsys):
    """The README's "Detect anomalies" new table: the channels and labels of the plant with faults."""
    from tsformer.data.plant_anomaly import simulate_plant_anomaly

    path = tmp_path / "new.csv"
    assert (
        fetch.cli(["simulate", "plant_anomaly", "--output", str(path), "--n-steps", "2500", "--seed", "1"])
        == 0
    )
    expected = simulate_plant_anomaly(n_steps=2500, seed=1)
    pd.testing.assert_frame_equal(pd.read_csv(path, parse_dates=["time"]), expected, check_dtype=False)
    out = capsys.readouterr().out
    assert f"predict.py <run id> {path.resolve()} --output anomalies.csv" in out
    assert fetch.cli(["simulate", "plant_anomaly", "--output", str(path), "--future-steps", "5"]) == 2
    assert capsys.readouterr().err.startswith("error: --future-steps: plant_anomaly is a labelled table")
    path.unlink()  # a table too short for the faults: one line, nothing written
    assert fetch.cli(["simulate", "plant_anomaly", "--output", str(path), "--n-steps", "2000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: plant_anomaly: n_steps=2000") and len(err.strip().splitlines()) == 1
    assert not path.exists()


@pytest.mark.parametrize(
    "option, named",
    [(["--heating-drift", "0.2"], "--heating-drift"), (["--future-steps", "5"], "--future-steps")],
    ids=["not_its_setting", "no_forecast"],
)
def test_an_option_the_data_set_cannot_use_is_one_line_and_writes_nothing(tmp_path, capsys, option, named):
    path = tmp_path / "regime.csv"
    assert fetch.cli(["simulate", "plant_regime", "--output", str(path), "--n-steps", "30", *option]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named}") and len(err.strip().splitlines()) == 1
    assert not path.exists()


def test_a_parquet_output_is_written_as_parquet_with_the_csv_tables_values(tmp_path, capsys):
    args = ["simulate", "plant", *TINY_PLANT, "--future-steps", "5", "--output"]
    assert fetch.cli([*args, str(tmp_path / "plant.csv")]) == 0
    assert fetch.cli([*args, str(tmp_path / "fleet.parquet")]) == 0
    as_csv = pd.read_csv(tmp_path / "plant.csv", parse_dates=["time"])
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "fleet.parquet"), as_csv, check_dtype=False)
    assert f"{tmp_path / 'fleet.parquet'} --output forecasts.csv" in capsys.readouterr().out


def test_an_output_of_another_type_is_one_line_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "plant.txt"
    assert fetch.cli(["simulate", "plant", "--n-steps", "40", "--output", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    line = f"error: --output {path}: a .txt suffix; name a .csv or .parquet file (the tables predict.py and "
    assert err == [line + "data=csv read)"]
    assert not path.exists()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """README step 1 with TINY settings: `python train.py` (make train's model), in its own folder."""
    folder = tmp_path_factory.mktemp("readme")
    old = os.getcwd()
    try:
        os.chdir(folder)
        result = run(compose_config(TINY, folder / "out"))
    finally:
        os.chdir(old)
    return result, folder


@pytest.mark.slow
def test_readme_simulate_then_predict(trained, monkeypatch):
    result, folder = trained
    monkeypatch.chdir(folder)
    args = readme_simulate_args()
    assert fetch.cli(args) == 0
    new = folder / args[args.index("--output") + 1]
    future = int(args[args.index("--future-steps") + 1])
    assert predict.main([result.run_id, str(new), "--output", "forecasts.csv"]) == 0
    forecasts = pd.read_csv(folder / "forecasts.csv", parse_dates=["origin_time", "target_time"])
    table = pd.read_csv(new, parse_dates=["time"])
    n_series = table.series_id.nunique()
    assert len(forecasts) == n_series * future * len(PLANT_TARGETS)
    assert forecasts.y_pred.notna().all() and forecasts.y_true.isna().all()
    last_observed = table.dropna().groupby("series_id").time.max()
    origins = forecasts.groupby("series_id").origin_time.max()
    pd.testing.assert_series_equal(origins, last_observed, check_names=False)


@pytest.mark.slow
def test_simulated_table_of_the_training_data_gives_training_forecasts(trained, monkeypatch):
    """The same plant as training, its last `horizon` targets left empty: predict.py forecasts the last
    test window, as training did."""
    result, folder = trained
    monkeypatch.chdir(folder)
    horizon = int(result.forecasts.step.max())
    args = ["simulate", "plant", "--output", "same.csv", *TINY_PLANT, "--future-steps", str(horizon)]
    assert fetch.cli(args) == 0
    assert predict.main([result.run_id, "same.csv", "--output", "same_forecasts.csv"]) == 0
    out = pd.read_csv(folder / "same_forecasts.csv", parse_dates=["origin_time", "target_time"])
    both = result.forecasts.merge(out, on=KEYS, suffixes=("_train", "_new"))
    assert len(both) == len(out) == 2 * horizon * len(PLANT_TARGETS)
    np.testing.assert_allclose(both.y_pred_new, both.y_pred_train, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_the_command_printed_for_a_parquet_table_forecasts_it(trained, monkeypatch, capsys):
    """`--output fleet.parquet` (the name a fleet's table gets) writes Parquet, and the command printed
    after it runs as shown on that file."""
    result, folder = trained
    monkeypatch.chdir(folder)
    horizon = int(result.forecasts.step.max())
    args = ["simulate", "plant", "--output", "fleet.parquet", *TINY_PLANT, "--future-steps", str(horizon)]
    assert fetch.cli(args) == 0
    hint = capsys.readouterr().out.strip().splitlines()[-1]
    command = shlex.split(hint.split(": ", 1)[1].replace("<run id>", result.run_id))
    assert Path(command[1]).resolve() == REPO / "predict.py"
    assert predict.main(command[2:]) == 0
    forecasts = pd.read_csv(folder / "forecasts.csv")
    assert len(forecasts) == 2 * horizon * len(PLANT_TARGETS) and forecasts.y_pred.notna().all()
