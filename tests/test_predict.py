"""Forecasting new data after training: the model folder, `predict.py`, the MLflow pyfunc model.

One tiny model per family is trained once (module fixture); then, as a user would:
- `python predict.py <run id> new.csv --output ...` (its `main`, in this process: the contract runs the
  printed command as a process) and `mlflow.pyfunc.load_model(...).predict(...)` in a fresh process (no
  tsformer module imported before) agree with each other and with training's own test forecasts;
- every bad input gets a message naming the series, the column and the time;
- forecasts never change when values they must not see (targets and past-only covariates after the
  origin) change, and do change with the known future covariates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import TINY
from tsformer.data import DataValidationError, simulate_plant
from tsformer.jobs.forecasting.forecaster import Forecaster
from tsformer.predict import main as predict_main
from tsformer.train import compose_config, run

# every test here trains through train.py (or reads a module fixture that does)
pytestmark = pytest.mark.slow

TARGETS = ["dynamic_temperature", "dynamic_pressure"]
KEYS = ["series_id", "origin_time", "target_time", "step", "variable"]
FAMILIES = ["enc_dec", "dec_only", "enc_only_forecast", "enc_only"]


def plant() -> pd.DataFrame:
    """The table the tiny runs trained on (TINY: 2 series, 800 steps, seed 0)."""
    return simulate_plant(n_series=2, n_steps=800, freq="1min", seed=0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """family -> (run result, folder it ran in); each trained once, logged to ./mlflow.db there."""
    results = {}
    old = os.getcwd()
    try:
        for family in FAMILIES:
            folder = tmp_path_factory.mktemp(family)
            os.chdir(folder)
            overrides = [f"model={family}", *TINY, "model_registry.name=tiny-" + family]
            results[family] = (run(compose_config(overrides, folder / "out")), folder)
    finally:
        os.chdir(old)
    return results


def future_table(horizon: int, origin: pd.Timestamp) -> pd.DataFrame:
    """History up to `origin`, then `horizon` rows with the targets empty, for both series."""
    df = plant()
    df = df[df.time <= origin + horizon * pd.Timedelta("1min")].copy()
    df.loc[df.time > origin, TARGETS] = np.nan
    return df


def last_test_origin(result) -> pd.Timestamp:
    return pd.Timestamp(result.forecasts.origin_time.max())


@pytest.mark.parametrize("family", FAMILIES)
def test_model_folder_reproduces_training_forecasts(family, trained):
    """The saved folder, loaded alone, gives the forecasts training exported for the same windows."""
    result, _ = trained[family]
    forecaster = Forecaster.load(result.model_folder)
    if forecaster.task.reconstructs:
        table = plant().drop(columns=TARGETS)  # reconstruction: inputs only
    else:
        table = future_table(forecaster.contract.horizon, last_test_origin(result))
    out = forecaster.predict(table)
    merged = result.forecasts.merge(out, on=KEYS, suffixes=("_train", "_new"))
    assert len(merged) > 0
    if not forecaster.task.reconstructs:
        assert len(merged) == len(out) == 2 * forecaster.contract.horizon * len(TARGETS)
    np.testing.assert_allclose(merged.y_pred_new, merged.y_pred_train, rtol=1e-5, atol=1e-5)
    assert out.y_pred.notna().all()


PYFUNC_SCRIPT = """
import sys, json
import mlflow, pandas as pd
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
table = pd.read_csv(sys.argv[3], parse_dates=["time"])
model.predict(table).to_csv(sys.argv[4], index=False)
print(json.dumps({"hydra": any(m == "hydra" or m.startswith("hydra.") for m in sys.modules),
                  "params": [p.name for p in model.metadata.get_params_schema().params],
                  "example": model.metadata.saved_input_example_info is not None}))
"""


def test_predict_py_and_pyfunc_agree(trained, tmp_path, capsys, monkeypatch):
    """Acceptance: a CSV with future covariate rows, through predict.py and through mlflow.pyfunc."""
    result, folder = trained["enc_dec"]
    origin = last_test_origin(result)
    future_table(70, origin).to_csv(tmp_path / "new.csv", index=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with monkeypatch.context() as mp:
        mp.chdir(folder)  # the run id is looked up in ./mlflow.db, as where train.py ran
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        assert (
            predict_main([result.run_id, str(tmp_path / "new.csv"), "--output", str(tmp_path / "cli.csv")])
            == 0
        )
    assert "forecasts CSV:" in capsys.readouterr().out
    uri = f"sqlite:///{folder}/mlflow.db"
    # the registered version, in a process of its own (runs:/ URIs: the contract tests, tests/contract.py)
    for name, model_uri in [("registry", "models:/tiny-enc_dec/1")]:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                PYFUNC_SCRIPT,
                uri,
                model_uri,
                str(tmp_path / "new.csv"),
                str(tmp_path / f"{name}.csv"),
            ],
            check=False,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        assert not report["hydra"]  # the model needs no Hydra config
        assert report["params"] == ["origin", "time_format"] and report["example"]
        cli_out = pd.read_csv(tmp_path / "cli.csv")
        pyfunc_out = pd.read_csv(tmp_path / f"{name}.csv")
        pd.testing.assert_frame_equal(cli_out, pyfunc_out)
    assert len(cli_out) == 2 * 70 * 2 and cli_out.y_true.isna().all()
    # and the CLI's forecasts are training's for that origin
    cli_out[["origin_time", "target_time"]] = cli_out[["origin_time", "target_time"]].apply(pd.to_datetime)
    both = result.forecasts.merge(cli_out, on=KEYS, suffixes=("_train", "_cli"))
    assert len(both) == len(cli_out)
    np.testing.assert_allclose(both.y_pred_cli, both.y_pred_train, rtol=1e-5, atol=1e-5)


def test_predict_py_takes_a_run_folder_and_reports_bad_input(trained, tmp_path, capsys):
    result, folder = trained["dec_only"]
    table = future_table(30, last_test_origin(result))
    table.loc[table.index[-5], "supply_voltage"] = np.nan  # a missing future covariate
    table.to_csv(tmp_path / "bad.csv", index=False)
    assert (
        predict_main([str(folder / "out"), str(tmp_path / "bad.csv"), "-o", str(tmp_path / "out.csv")]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "supply_voltage" in err and "series 1" in err
    assert not (tmp_path / "out.csv").exists()


def bad_inputs(origin: pd.Timestamp, horizon: int) -> dict:
    """name -> (table, words the error must contain)."""
    base = future_table(horizon, origin)
    t_fut = origin + 3 * pd.Timedelta("1min")
    cases = {}
    t = base.copy()
    t.loc[(t.series_id == 1) & (t.time == t_fut), "ambient_temperature"] = np.nan
    cases["missing future covariate"] = (t, ["'ambient_temperature'", "series 1", str(t_fut)])
    t = base[base.time <= origin + (horizon - 2) * pd.Timedelta("1min")]
    cases["too few future rows"] = (t, ["series 0", f"horizon={horizon}", "ambient_temperature"])
    t = base.iloc[::2]  # every other minute: a different frequency
    cases["other frequency"] = (t, ["series 0", "0 days 00:02:00", "freq 'min'"])
    cases["missing column"] = (base.drop(columns="supply_voltage"), ["missing column", "supply_voltage"])
    t = base.groupby("series_id").tail(horizon + 5)
    cases["too little history"] = (t, ["too little history", "series 0", "5 row(s)", str(origin)])
    t = base.copy()
    t.loc[(t.series_id == 0) & (t.time == origin - pd.Timedelta("3min")), "dynamic_pressure"] = np.nan
    cases["empty history target"] = (
        t,
        ["'dynamic_pressure'", "series 0", str(origin - pd.Timedelta("3min"))],
    )
    t = base[base.time != origin - pd.Timedelta("10min")]
    cases["gap in history"] = (t, ["series 0", str(origin - pd.Timedelta("11min")), "fill the gap"])
    return cases


@pytest.mark.parametrize("case", list(bad_inputs(pd.Timestamp("2024-01-01 10:00"), 30)))
def test_bad_input_names_series_column_and_time(case, trained):
    result, _ = trained["dec_only"]
    forecaster = Forecaster.load(result.model_folder)
    table, words = bad_inputs(last_test_origin(result), forecaster.contract.horizon)[case]
    with pytest.raises(DataValidationError) as err:
        forecaster.predict(table, source="new.csv")
    for word in ["new.csv", *words]:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize("family", ["enc_dec", "dec_only", "enc_only_forecast"])
def test_forecasts_ignore_values_after_the_origin(family, trained):
    """Leakage check: with an explicit origin, targets and past-only values after it change nothing;
    the known future covariates do change the forecast (so the check can fail)."""
    result, _ = trained[family]
    forecaster = Forecaster.load(result.model_folder)
    origin = last_test_origin(result)
    full = plant()
    full = full[full.time <= origin + (forecaster.contract.horizon + 10) * pd.Timedelta("1min")]
    reference = forecaster.predict(full, origin=origin)
    assert reference.y_true.notna().all()  # the truth after the origin is reported, not used
    rng = np.random.default_rng(0)
    after = full.time > origin
    changed = full.copy()
    changed.loc[after, TARGETS] = rng.normal(0, 1e3, size=(after.sum(), 2))
    out = forecaster.predict(changed, origin=origin)
    np.testing.assert_array_equal(out.y_pred.to_numpy(), reference.y_pred.to_numpy())
    assert not np.allclose(out.y_true, reference.y_true)
    moved = full.copy()
    moved.loc[after, "supply_voltage"] += 50.0
    assert not np.allclose(forecaster.predict(moved, origin=origin).y_pred, reference.y_pred)
    # and the default origin (last observed target) is the same forecast as the explicit one
    blank = full.copy()
    blank.loc[after, TARGETS] = np.nan
    np.testing.assert_array_equal(forecaster.predict(blank).y_pred.to_numpy(), reference.y_pred.to_numpy())


def test_model_folder_loads_with_weights_only(trained):
    import torch

    result, _ = trained["enc_dec"]
    state = torch.load(result.model_folder / "weights.pt", weights_only=True)
    assert all(torch.is_tensor(v) for v in state.values())
    config = json.loads((result.model_folder / "tsformer.json").read_text())
    assert config["data"]["known_cols"] == ["ambient_pressure", "ambient_temperature", "supply_voltage"]
    assert config["data"]["freq"] == "min" and config["info"]["run_id"] == result.run_id
