"""Bad input through the whole application: a clear error naming file, column and row, and no MLflow
run left RUNNING (data is checked before a run exists; a failure after that marks the run FAILED)."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from conftest import TINY

# the data tests' broken tables and their settings, through train.run
from test_data_validation import BAD_INPUTS, good_table, good_table_overrides
from tsformer.data import DataValidationError
from tsformer.train import compose_config, run

N_STEPS = 400  # per series: enough for train/val/test windows of the enc_dec default (30 -> 70)


def config_for(csv_path, out_dir, extra=()):
    overrides = [o for o in TINY if not o.startswith("data.source.")] + list(extra)
    return compose_config(overrides + good_table_overrides(csv_path), out_dir)


def statuses(folder) -> list[str]:
    db = folder / "mlflow.db"
    if not db.exists():
        return []
    client = MlflowClient(f"sqlite:///{db}")
    return [r.info.status for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


# the words that must appear: column and row (the data tests check the rest of each message)
WHERE = {
    "missing column": ["'u'", "columns present"],
    "non-numeric value": ["column 'y'", "row 47 (line 49)", "'12,5'"],
    "NaN cell": ["column 'z'", "row 47 (line 49)"],
    "duplicate time": ["column 'time'", "row 47 (line 49)", "duplicate"],
    "unsorted time": ["column 'time'", "row 47 (line 49)", "unsorted"],
    "unparseable time": ["column 'time'", "row 47 (line 49)", "'yesterday noon'"],
}
CASES = {name: (BAD_INPUTS[name][0], WHERE[name]) for name in BAD_INPUTS}
CASES["too few rows"] = (
    lambda df: df.groupby("site").head(150),
    ["no complete window", "context_len=30", "horizon=70"],
)


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_named_and_leaves_no_running_run(case, in_tmp):
    corrupt, expected = CASES[case]
    path = in_tmp / "bad_plant.csv"
    corrupt(good_table(N_STEPS)).to_csv(path, index=False)
    cfg = config_for(path, in_tmp / "out")
    with pytest.raises(DataValidationError) as err:
        run(cfg)
    message = str(err.value)
    assert "bad_plant.csv" in message
    for word in expected:
        assert word in message, (word, message)
    assert "RUNNING" not in statuses(in_tmp)
    assert not (in_tmp / "out" / "forecasts.csv").exists()


@pytest.mark.slow
def test_good_csv_trains_and_a_crash_after_start_marks_the_run_failed(in_tmp, monkeypatch):
    path = in_tmp / "plant.csv"
    good_table(N_STEPS).to_csv(path, index=False)
    cfg = config_for(path, in_tmp / "ok")
    run(cfg)
    assert statuses(in_tmp) == ["FINISHED"]

    def explode(self, batch, batch_idx):
        raise RuntimeError("simulated crash in training")

    monkeypatch.setattr("tsformer.tasks.forecasting.EncoderDecoderForecaster.training_step", explode)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(config_for(path, in_tmp / "crash"))
    assert sorted(statuses(in_tmp)) == ["FAILED", "FINISHED"]


@pytest.mark.slow
def test_logger_none_trains_without_mlflow(in_tmp):
    path = in_tmp / "plant.csv"
    good_table(N_STEPS).to_csv(path, index=False)
    result = run(config_for(path, in_tmp / "out", extra=["logger=none"]))
    assert result.run_id is None and result.csv_path.exists()
    assert not (in_tmp / "mlflow.db").exists()
