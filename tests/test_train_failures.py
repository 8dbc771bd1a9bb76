"""Bad input through the whole application: a clear error naming file, column and row, and no MLflow
run left RUNNING (data is checked before a run exists; a failure after that marks the run FAILED)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from conftest import TINY, compose_config
from tsformer.data import DataValidationError
from tsformer.train import run

N = 400  # rows of the good file: enough for train/val/test windows of the enc_dec default (30 -> 70)


def good_frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    t = np.arange(N)
    return pd.DataFrame(
        {
            "time": pd.date_range("2024-03-01", periods=N, freq="min").strftime("%Y-%m-%d %H:%M:%S"),
            "load": np.sin(t / 20) + rng.normal(0, 0.1, N),
            "temp": np.cos(t / 30) + rng.normal(0, 0.1, N),
        }
    )


def config_for(csv_path, out_dir):
    overrides = [o for o in TINY if not o.startswith("data.source.")]
    overrides += [
        "data=csv",
        f"data.source={csv_path}",
        "data.target_cols=[temp]",
        "data.known_cols=[load]",
        "data.val_fraction=0.3",
        "data.test_fraction=0.3",
    ]
    return compose_config(overrides, out_dir)


def statuses(folder) -> list[str]:
    db = folder / "mlflow.db"
    if not db.exists():
        return []
    client = MlflowClient(f"sqlite:///{db}")
    return [r.info.status for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def _missing(df):
    return df.drop(columns="load")


def _text(df):
    df["temp"] = df["temp"].astype(object)
    df.loc[123, "temp"] = "n/a?"
    return df


def _nan(df):
    df.loc[123, "load"] = np.nan
    return df


def _duplicate(df):
    df.loc[123, "time"] = df.loc[122, "time"]
    return df


def _unsorted(df):
    df.loc[[122, 123], "time"] = df.loc[[123, 122], "time"].to_numpy()
    return df


def _too_short(df):
    return df.iloc[:150]


CASES = {
    "missing column": (_missing, ["load", "columns"]),
    "non-numeric value": (_text, ["temp", "row 123", "n/a?"]),
    "NaN": (_nan, ["load", "row 123"]),
    "duplicate timestamp": (_duplicate, ["time", "row 123", "duplicate"]),
    "unsorted timestamps": (_unsorted, ["time", "row 123"]),
    "too few rows": (_too_short, ["window", "context_len=30", "horizon=70"]),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_named_and_leaves_no_running_run(case, in_tmp):
    corrupt, expected = CASES[case]
    path = in_tmp / "bad_plant.csv"
    corrupt(good_frame()).to_csv(path, index=False)
    cfg = config_for(path, in_tmp / "out")
    with pytest.raises(DataValidationError) as err:
        run(cfg)
    message = str(err.value)
    assert "bad_plant.csv" in message
    for word in expected:
        assert word in message, (word, message)
    assert "RUNNING" not in statuses(in_tmp)
    assert not (in_tmp / "out" / "forecasts.csv").exists()


def test_good_csv_trains_and_a_crash_after_start_marks_the_run_failed(in_tmp, monkeypatch):
    path = in_tmp / "plant.csv"
    good_frame().to_csv(path, index=False)
    cfg = config_for(path, in_tmp / "ok")
    run(cfg)
    assert statuses(in_tmp) == ["FINISHED"]

    def explode(self, batch, batch_idx):
        raise RuntimeError("simulated crash in training")

    monkeypatch.setattr("tsformer.tasks.forecasting.EncoderDecoderForecaster.training_step", explode)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(config_for(path, in_tmp / "crash"))
    assert sorted(statuses(in_tmp)) == ["FAILED", "FINISHED"]
