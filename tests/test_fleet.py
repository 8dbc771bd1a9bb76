"""The fleet on a local Spark session (`tsformer.serving.fleet`, `tsformer-fleet`): for 200 simulated
series, the answer of each job's model equals predict.py's per series; bad input is one line and
leaves nothing at the output. One session (local[2], no UI) and one tiny run per job for the module.

The model batches windows across the series it is given: predict.py on the whole table, the fleet on
a bucket of series, predict.py on one series alone each batch other windows, and float32 sums differ
in their last bits. So float columns are compared within a relative 1e-5 (every other column exactly),
against predict.py on the whole table and, for three series, on their own rows."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from conftest import TINY, TINY_ANOMALY
from tsformer.data import simulate_plant
from tsformer.data.simulators import simulate_plant_regimes
from tsformer.predict import main as predict_main
from tsformer.serving import fleet
from tsformer.serving.spark import spark_session
from tsformer.train import compose_config, run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

N_SERIES = 200
CONTEXT, HORIZON = 12, 4  # the forecaster's
WINDOW = 12  # the classifier's

# job -> the overrides of its tiny run (no MLflow: the fleet takes the model folder)
RUNS = {
    "forecasting": [*TINY, "model=enc_dec", f"model.context_len={CONTEXT}", f"model.horizon={HORIZON}"],
    "classification": [
        "experiment=plant_regime",
        *[o for o in TINY if not o.startswith("data.source")],
        "data.source.n_series=8",
        "data.source.n_steps=300",
        f"data.context_len={WINDOW}",
    ],
    # no label read: the fleet takes the folder, and the metrics beside the baselines are slow
    "anomaly": [*TINY_ANOMALY, "trainer.limit_train_batches=5", "data.label_col=null"],
}


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]", {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """job -> the model folder of its tiny run."""
    folders = {}
    for job, overrides in RUNS.items():
        cfg = compose_config([*overrides, "logger=none"], tmp_path_factory.mktemp(job) / "out")
        with contextlib.redirect_stdout(io.StringIO()):
            folders[job] = run(cfg).model_folder
    return folders


def forecast_table(n_series: int = N_SERIES, n_steps: int = CONTEXT + 8) -> pd.DataFrame:
    """Simulated plants whose last HORIZON rows have the known inputs only (the future to forecast)."""
    table = simulate_plant(n_series=n_series, n_steps=n_steps, freq="1min", seed=1)
    future = table.groupby("series_id").cumcount(ascending=False) < HORIZON
    table.loc[future, ["dynamic_temperature", "dynamic_pressure"]] = np.nan
    return table


def anomaly_table() -> pd.DataFrame:
    """Simulated plants, a spike in every tenth one (so that some series have alarms and events)."""
    table = simulate_plant(n_series=N_SERIES, n_steps=48, freq="1min", seed=2)
    spiked = (table["series_id"] % 10 == 3) & (table.groupby("series_id").cumcount() == 30)
    table.loc[spiked, "dynamic_temperature"] += 40.0
    return table


def predicted(model: Path, table_csv: Path, out: Path) -> pd.DataFrame:
    """predict.py's CSV of a table, as written."""
    with contextlib.redirect_stdout(io.StringIO()):
        assert predict_main([str(model), str(table_csv), "--output", str(out)]) == 0
    return pd.read_csv(out)


def as_written(answers: Path, columns: list[str]) -> pd.DataFrame:
    """The fleet's Parquet folder as predict.py's CSV would hold it (its columns in predict.py's order),
    ordered by series, each series' rows in their order."""
    frame = pd.read_parquet(answers)
    assert list(frame.columns) == columns
    frame = pd.read_csv(io.StringIO(frame.to_csv(index=False)))
    return frame.sort_values("series_id", kind="stable").reset_index(drop=True)


def events_within_series(frame: pd.DataFrame) -> pd.DataFrame:
    """Event ids counted from 0 in each series (predict.py counts them across the table)."""
    if "event_id" not in frame.columns:
        return frame
    first = frame.groupby("series_id")["event_id"].transform("min")
    return frame.assign(event_id=frame["event_id"] - first)


def assert_fleet_is_predict(job, models, spark, tmp_path, table, data: Path):
    """The fleet's answer for `data` (holding `table`) against predict.py's on `table` for every series,
    and for three series against predict.py on their own rows (floats within 1e-5)."""
    table.to_csv(tmp_path / "all.csv", index=False)
    expected = predicted(models[job], tmp_path / "all.csv", tmp_path / "expected.csv")
    result = fleet.score_fleet(spark, models[job], data, tmp_path / "answers")
    assert (result.job, result.n_series, result.n_rows) == (job, N_SERIES, len(expected))
    got = as_written(tmp_path / "answers", list(expected.columns))
    whole = events_within_series(expected.sort_values("series_id", kind="stable").reset_index(drop=True))
    pd.testing.assert_frame_equal(got, whole, check_exact=False, rtol=1e-5)
    for sid in table["series_id"].unique()[[0, N_SERIES // 2, -1]]:
        table[table["series_id"] == sid].to_csv(tmp_path / "one.csv", index=False)
        alone = events_within_series(predicted(models[job], tmp_path / "one.csv", tmp_path / "one_out.csv"))
        mine = got[got["series_id"] == sid].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, alone, check_exact=False, rtol=1e-5)
    return got


def test_forecasts_of_a_parquet_folder_equal_predict_per_series(models, spark, tmp_path):
    """Each series' rows split across two files (its first rows in one, the rest in the other)."""
    table = forecast_table()
    folder = tmp_path / "fleet"
    folder.mkdir()
    early = table.groupby("series_id").cumcount() < 10
    table[early].to_parquet(folder / "part-0.parquet", index=False)
    table[~early].to_parquet(folder / "part-1.parquet", index=False)
    got = assert_fleet_is_predict("forecasting", models, spark, tmp_path, table, folder)
    assert got["step"].max() == HORIZON


def test_the_answer_keeps_the_series_type_and_place_whole_series_a_file_sorted_by_series(
    models, spark, tmp_path
):
    """Read back as written: the series column where and as predict.py's answer has it (not a category
    of folder names, last); each series in one file, a file's series in order; one series by `filters`."""
    table = forecast_table(30)
    table.to_parquet(tmp_path / "fleet.parquet", index=False)
    fleet.score_fleet(spark, models["forecasting"], tmp_path / "fleet.parquet", tmp_path / "answers")
    answer = pd.read_parquet(tmp_path / "answers")
    table.to_csv(tmp_path / "all.csv", index=False)
    expected = predicted(models["forecasting"], tmp_path / "all.csv", tmp_path / "expected.csv")
    assert list(answer.columns) == list(expected.columns)
    assert answer["series_id"].dtype == table["series_id"].dtype == np.int64
    files = sorted((tmp_path / "answers").glob("part-*.parquet"))
    series_of = [pd.read_parquet(f)["series_id"] for f in files]
    assert all(ids.is_monotonic_increasing for ids in series_of)
    assert sum(ids.nunique() for ids in series_of) == 30  # no series in two files
    one = pd.read_parquet(tmp_path / "answers", filters=[("series_id", "==", 7)])
    pd.testing.assert_frame_equal(one, answer[answer["series_id"] == 7].reset_index(drop=True))


def test_classes_of_a_csv_equal_predict_per_series(models, spark, tmp_path):
    table = simulate_plant_regimes(n_series=N_SERIES, n_steps=WINDOW + 5, seed=1)
    table.to_csv(tmp_path / "fleet.csv", index=False)
    got = assert_fleet_is_predict("classification", models, spark, tmp_path, table, tmp_path / "fleet.csv")
    assert len(got) == N_SERIES * 6  # every window of every series


def test_anomaly_rows_of_a_parquet_file_equal_predict_per_series(models, spark, tmp_path):
    table = anomaly_table()
    table.to_parquet(tmp_path / "fleet.parquet", index=False)
    got = assert_fleet_is_predict("anomaly", models, spark, tmp_path, table, tmp_path / "fleet.parquet")
    assert got["alarm"].sum() > 0 and got["event_id"].notna().any()


# -- bad input: one line, nothing written ----------------------------------------------------------


def fleet_command(capsys, *args) -> tuple[int, list[str]]:
    """(exit status, the lines it wrote to stderr) of `tsformer-fleet ARGS` in this process (what
    it printed: `fleet_command.out`)."""
    status = fleet.main([str(a) for a in args])
    printed = capsys.readouterr()
    fleet_command.out = printed.out
    return status, printed.err.strip().splitlines()


def nothing_written(folder: Path, output: Path) -> bool:
    """Neither the output nor a temporary folder beside it."""
    return not output.exists() and not list(folder.glob(f"{output.name}.partial-*"))


def test_data_without_the_series_column_is_one_line(models, spark, tmp_path, capsys):
    forecast_table(5).drop(columns="series_id").to_parquet(tmp_path / "one.parquet")
    out = tmp_path / "answers"
    status, err = fleet_command(capsys, models["forecasting"], tmp_path / "one.parquet", "--output", out)
    assert status == 2 and len(err) == 1, err
    assert err[0].startswith("error: ") and "no series column 'series_id'" in err[0]
    assert nothing_written(tmp_path, out)


@pytest.mark.parametrize("short", [0, 7], ids=["first-series-on-the-driver", "a-later-series-in-an-executor"])
def test_a_series_too_short_is_named_and_nothing_is_written(models, spark, tmp_path, capsys, short):
    table = forecast_table(20)
    too_short = (table["series_id"] == short) & (table.groupby("series_id").cumcount() < 10)
    table[~too_short].to_parquet(tmp_path / "fleet.parquet", index=False)
    out = tmp_path / "answers"
    status, err = fleet_command(capsys, models["forecasting"], tmp_path / "fleet.parquet", "-o", out)
    assert status == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: series {short}: ") and "too little history" in err[0]
    assert nothing_written(tmp_path, out)


def test_a_model_of_another_job_is_one_line(models, spark, tmp_path, capsys):
    forecast_table(5).to_parquet(tmp_path / "fleet.parquet", index=False)
    out = tmp_path / "answers"
    status, err = fleet_command(capsys, models["classification"], tmp_path / "fleet.parquet", "-o", out)
    assert status == 2 and len(err) == 1 and err[0].startswith("error: series 0: "), err
    assert nothing_written(tmp_path, out)


def test_a_missing_model_or_data_is_one_line(models, spark, tmp_path, capsys):
    forecast_table(5).to_parquet(tmp_path / "fleet.parquet", index=False)
    out = tmp_path / "answers"
    status, err = fleet_command(capsys, tmp_path / "no_model", tmp_path / "fleet.parquet", "-o", out)
    assert status == 2 and len(err) == 1 and "no_model" in err[0], err
    status, err = fleet_command(capsys, models["forecasting"], tmp_path / "no.parquet", "-o", out)
    assert status == 2 and len(err) == 1 and "data not found" in err[0], err
    assert nothing_written(tmp_path, out)


def test_an_existing_output_is_kept_unless_overwrite(models, spark, tmp_path, capsys):
    forecast_table(3).to_parquet(tmp_path / "fleet.parquet", index=False)
    out = tmp_path / "answers"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    args = [models["forecasting"], tmp_path / "fleet.parquet", "-o", out]
    status, err = fleet_command(capsys, *args)
    assert status == 2 and len(err) == 1 and "exists" in err[0], err
    assert (out / "mine.txt").read_text() == "kept"
    assert fleet_command(capsys, *args, "--overwrite") == (0, [])
    assert fleet_command.out.startswith(
        f"forecasting model: 3 series, {3 * 2 * HORIZON} rows answered: {out}"
    )
    assert not (out / "mine.txt").exists() and pd.read_parquet(out)["series_id"].nunique() == 3


def test_an_unreadable_file_is_what_predict_says_of_it(models, spark, tmp_path, capsys):
    """A CSV named .parquet (not Spark's Java message), and a file of a type predict.py does not read."""
    out = tmp_path / "answers"
    said = {
        "fleet.parquet": "fleet.parquet: cannot be read as .parquet (",
        "fleet.txt": "unknown file type '.txt'",
    }
    for name, line in said.items():
        forecast_table(3).to_csv(tmp_path / name, index=False)
        status, err = fleet_command(capsys, models["forecasting"], tmp_path / name, "-o", out)
        assert status == 2 and len(err) == 1 and line in err[0], err
        assert predict_main([str(models["forecasting"]), str(tmp_path / name), "--output", "x.csv"]) == 2
        assert err == capsys.readouterr().err.strip().splitlines()
        assert nothing_written(tmp_path, out)
