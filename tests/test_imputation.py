"""`predict.py MODEL table.csv --impute`: empty cells filled by a masked fill-in model, observed cells
never changed, flags right, rows that cannot be filled named, and windows independent of each other.

The window logic is tested with an untrained model built in memory (fast); one tiny model trained
through train.py checks the command end to end (slow)."""

from __future__ import annotations

import contextlib
import io
import os

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import TINY
from tsformer.data.features import Affine
from tsformer.jobs.forecasting.forecaster import DataContract, Forecaster, ModelInfo
from tsformer.jobs.imputation.job import fill_windows, impute, window_of
from tsformer.predict import main as predict_main
from tsformer.tasks.masked import MaskedFillIn

N = 8  # the model's window
COLS = ["a", "b"]


def forecaster(known: list[str] = ()) -> Forecaster:
    torch.manual_seed(0)
    task = MaskedFillIn({"d_model": 16, "n_heads": 2, "n_layers": 1}, 2, len(known), 0, N, 0)
    contract = DataContract(
        time_col="time",
        series_col="series_id",
        target_cols=COLS,
        known_cols=list(known),
        observed_cols=[],
        calendar=[],
        freq="h",
        context_len=N,
        horizon=0,
        target_scaler=Affine(scale=[2.0, 0.5], offset=[10.0, -1.0]),
        covariate_scaler=Affine(scale=[1.0] * len(known), offset=[0.0] * len(known)) if known else None,
    )
    return Forecaster(task, contract, ModelInfo(family="enc_only", dataset="test"))


def table(n_rows: int = 30, seed: int = 0, series: str = "s1") -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "series_id": series,
            "time": pd.date_range("2024-01-01", periods=n_rows, freq="h").strftime("%Y-%m-%d %H:%M"),
            "a": rng.normal(10, 2, n_rows).round(3),
            "note": "x",  # a column without a role in the model: carried over untouched
            "b": rng.normal(-1, 0.5, n_rows),
        }
    )


def test_windows_tile_a_run_and_the_last_one_ends_with_it():
    assert fill_windows(7, 8).tolist() == []
    assert fill_windows(16, 8).tolist() == [0, 8]
    assert fill_windows(21, 8).tolist() == [0, 8, 13]
    assert window_of(np.arange(21), 21, 8).tolist() == [0] * 8 + [8] * 8 + [13] * 5
    assert set(window_of(np.arange(21), 21, 8)) <= set(fill_windows(21, 8))


def test_observed_cells_unchanged_empty_cells_filled_and_flagged():
    df = table()
    df.loc[[2, 3, 17], "a"] = np.nan
    df.loc[[3, 29], "b"] = np.nan
    result = impute(forecaster(), df)
    out = result.table
    assert list(out.columns) == [*df.columns, "a_imputed", "b_imputed"]
    assert len(out) == len(df) and (out["note"] == df["note"]).all() and (out["time"] == df["time"]).all()
    for col in COLS:
        empty = df[col].isna().to_numpy()
        # bit for bit: the same float64 words
        assert np.array_equal(
            out[col].to_numpy()[~empty].view(np.int64), df[col].to_numpy()[~empty].view(np.int64)
        )
        assert np.isfinite(out[col]).all()
        assert (out[f"{col}_imputed"].to_numpy() == empty).all()
    assert result.n_filled == 5 and result.unfilled_rows == []


def test_filling_one_position_never_changes_a_fill_outside_its_window():
    base = table(n_rows=21)  # windows start at rows 0, 8 and 13 (the last one aligned to the end)
    base.loc[[1, 10, 15, 20], "a"] = np.nan
    f = forecaster()
    before = impute(f, base).table["a"].to_numpy()
    for t, window in [(5, range(8)), (11, range(8, 16))]:
        changed = base.copy()
        changed.loc[t, ["a", "b"]] = np.nan  # masking position t
        after = impute(f, changed).table["a"].to_numpy()
        outside = np.setdiff1d(np.arange(21), list(window))
        assert np.array_equal(after[outside], before[outside])
        inside_fill = [r for r in (1, 10) if r in window]
        assert not np.array_equal(after[inside_fill], before[inside_fill])  # the window itself sees it


def test_rows_without_enough_context_are_named_and_left_empty():
    df = pd.concat([table(20, series="long"), table(5, seed=1, series="short")], ignore_index=True)
    df.loc[[3, 22], "a"] = np.nan  # row 22: in a series of 5 rows, shorter than the window
    df = df.drop(index=[10]).reset_index(drop=True)  # a gap: rows 10.. of "long" are a run of 9
    df.loc[14, "b"] = np.nan
    result = impute(forecaster(), df, source="gaps.csv")
    assert result.unfilled_rows == [21]
    assert np.isnan(result.table.loc[21, "a"]) and not result.table.loc[21, "a_imputed"]
    assert result.table.loc[[3], "a_imputed"].all() and result.table.loc[14, "b_imputed"]
    line = result.unfilled_line("gaps.csv")
    assert "\n" not in line and "row 21 (line 23)" in line and "5 row(s)" in line


def test_a_window_with_nothing_observed_is_named():
    df = table(16)
    df.loc[8:15, COLS] = np.nan
    result = impute(forecaster(), df)
    assert result.unfilled_rows == list(range(8, 16))
    assert result.table.loc[:7, "a_imputed"].sum() == 0


def test_impute_refuses_a_table_that_has_a_flag_column_already():
    df = table().assign(a_imputed=1)
    with pytest.raises(ValueError, match="a_imputed"):
        impute(forecaster(), df)


# -- end to end: a tiny masked model trained through train.py, then predict.py --impute -------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from tsformer.train import compose_config, run

    folder = tmp_path_factory.mktemp("masked")
    old = os.getcwd()
    os.chdir(folder)
    summary = io.StringIO()
    try:
        overrides = ["model=enc_only_masked", "model.context_len=50", *TINY]
        with contextlib.redirect_stdout(summary):
            result = run(compose_config(overrides, folder / "out"))
        return result, folder, summary.getvalue()
    finally:
        os.chdir(old)


@pytest.mark.slow
def test_predict_impute_end_to_end(trained, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from tsformer.data import simulate_plant
    from tsformer.jobs.forecasting.job import WINDOW_MSE

    result, folder, summary = trained
    assert {"test/mse", "test/baseline_mse", "test/mae_orig"} <= set(result.metrics)
    # the summary's predict.py line is the one that works for this model
    (line,) = [line for line in summary.splitlines() if "predict" in line and "<table.csv>" in line]
    assert line.startswith("fill in missing values: ") and line.endswith("--impute --output filled.csv")
    # each test window's error is over its hidden values (the others have no y_pred)
    client = MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db")
    window_mse = pd.read_csv(client.download_artifacts(result.run_id, WINDOW_MSE, str(tmp_path))).mse
    assert np.isfinite(window_mse).all() and (window_mse > 0).any()
    df = simulate_plant(n_series=2, n_steps=800, freq="1min", seed=0)
    df = df[df.time < df.time.min() + pd.Timedelta("200min")].reset_index(drop=True)
    rng = np.random.default_rng(0)
    holes = rng.random((len(df), 2)) < 0.1
    targets = ["dynamic_temperature", "dynamic_pressure"]
    df[targets] = df[targets].mask(holes)
    source = tmp_path / "gaps.csv"
    df.to_csv(source, index=False)
    out = tmp_path / "filled.csv"
    assert predict_main([str(result.model_folder), str(source), "--impute", "--output", str(out)]) == 0
    filled = pd.read_csv(out)
    given = pd.read_csv(source)
    assert list(filled.columns) == [*given.columns, *(f"{c}_imputed" for c in targets)]
    for j, col in enumerate(targets):
        assert np.array_equal(filled[col].to_numpy()[~holes[:, j]], given[col].to_numpy()[~holes[:, j]])
        assert np.isfinite(filled[col]).all() and (filled[f"{col}_imputed"] == holes[:, j]).all()
    assert "filled" in capsys.readouterr().out
    # without --impute, a masked model does not pretend to forecast
    assert predict_main([str(result.model_folder), str(source), "--output", str(tmp_path / "f.csv")]) == 2
    assert "--impute" in capsys.readouterr().err


# -- training on a table with empty target cells (data.allow_empty_targets) ---------------------------


def gappy_csv(folder) -> tuple[str, list[str]]:
    """A plant table with 10 % of its target cells empty, as a CSV; the overrides that read it."""
    from tsformer.data import simulate_plant

    df = simulate_plant(n_series=2, n_steps=800, freq="1min", seed=0)
    targets = ["dynamic_temperature", "dynamic_pressure"]
    df[targets] = df[targets].mask(np.random.default_rng(1).random((len(df), 2)) < 0.1)
    path = folder / "gappy.csv"
    df.to_csv(path, index=False)
    data = [
        "data=csv",
        f"data.source={path}",
        "data.series_col=series_id",
        f"data.target_cols=[{','.join(targets)}]",
        "data.known_cols=[ambient_pressure,ambient_temperature,supply_voltage]",
    ]
    return str(path), data


@pytest.mark.slow
def test_a_masked_model_trains_on_a_table_with_empty_target_cells(tmp_path):
    from tsformer.data.schema import DataValidationError
    from tsformer.settings import SettingError
    from tsformer.train import compose_config, run

    path, data = gappy_csv(tmp_path)
    masked = ["model=enc_only_masked", "model.context_len=50", *TINY, *data]
    tiny = [o for o in masked if not o.startswith("data.source.")]
    db = f"logger.mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(DataValidationError, match=f"{path}: empty/NaN cell"):  # the default: refused
        run(compose_config([*tiny, db], tmp_path / "refused"))
    result = run(compose_config([*tiny, db, "data.allow_empty_targets=true"], tmp_path / "out"))
    assert all(np.isfinite(v) for k, v in result.metrics.items() if k.startswith("test/"))
    assert result.best_val is not None and np.isfinite(result.best_val)
    forecaster = ["model=enc_only", "model.context_len=50", *TINY, *data, "data.allow_empty_targets=true"]
    forecaster = [o for o in forecaster if not o.startswith("data.source.")]
    with pytest.raises(SettingError, match="only model=enc_only_masked trains on them"):
        run(compose_config([*forecaster, "logger=none"], tmp_path / "forecaster"))
