"""`tsformer-fleet MODEL DATA --output OUT`: a model applied to every series of a large table on Spark.

MODEL is what predict.py takes (a run id, `runs:/` or `models:/` URI, or a folder), a model of any job
(forecasting, reconstruction, fill-in, classification, anomaly detection). DATA is a CSV file, a
Parquet file or a folder of Parquet files (a local path, or a URI the cluster reads: hdfs://, s3a://),
laid out as predict.py takes it. Its rows are grouped by series: a bucket is a hash of the series
column (`groupBy(bucket).applyInPandas`), so each series reaches one Python worker whole, in file
order, with the other series of its bucket (about `--rows-per-call` rows), and they are answered as
predict.py answers a table of them (a CSV as `pd.read_csv` reads it): each series from its own
history. OUT is a folder of Parquet files (`OUT/part-*.parquet`), each holding whole series sorted by
series: per series, the rows predict.py writes for it, in its order, in its columns and their types
(the series column's too). `pd.read_parquet(OUT)` reads them all, each series' rows together (the
files are not in the order of their series: `.sort_values("series_id", kind="stable")` gives it); one
series: `pd.read_parquet(OUT, filters=[("series_id", "==", 7)])`.

- The model folder is resolved on the driver (downloaded from MLflow if need be) and shipped to the
  executors as a folder (`SparkContext.addFile`); each Python worker loads it once, as predict.py does
  (JSON, and weights with `weights_only=True`: nothing pickled, no code run). Executors need the
  tsformer package and its dependencies, not MLflow.
- The driver answers the series of DATA's first row itself before any Spark job: a model that does
  not fit the data stops there; that answer's columns are the output's.
- A series the model cannot answer in an executor fails the job; the error names the series (the
  bucket's series are then tried one by one).
- OUT is written to a temporary folder beside it and renamed when complete: a failure leaves nothing
  at OUT. An existing OUT is refused unless `--overwrite` (replaced once the new one is complete).

From Python, on any session (`tsformer.serving.spark.spark_session` makes one as the command does):

    from tsformer.serving.fleet import score_fleet
    result = score_fleet(spark, "runs:/<id>/model", "fleet.parquet", "answers")   # a FleetResult

Where the answer differs from predict.py on the whole table: an anomaly model's events are numbered
within each series (predict.py numbers them across the table), and its events table is not written;
floats may differ in their last bits (float32 sums over other batches of windows, as predict.py's
on the whole table differ from its answer for one series alone).
docs/operations.md says how to run it on a cluster.
"""

from __future__ import annotations

import argparse
import io
import logging
import math
import os
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tsformer.data.schema import DataValidationError
from tsformer.jobs import prediction_params
from tsformer.serving.predictor import Predictor
from tsformer.serving.spark import (
    ARROW,
    FILE_COL,
    ROW_COL,
    OutputFolder,
    SparkUnavailable,
    first_line,
    is_csv,
    read_table,
    ship_folder,
    spark_schema,
    spark_session,
)
from tsformer.tracking import TrackingServerUnreachable

log = logging.getLogger(__name__)

DEFAULT_SERIES = "series_id"  # the series column of a model whose contract names none
BUCKET_COL = "_tsformer_bucket"  # the bucket of series a row is answered in
ORDER_COL = "_tsformer_order"  # an answer row's position within its series, until it is written
# About the rows one call of the model answers in a Python worker (whole series). One series a call
# made 300 series 4x slower with the default forecaster, whose batches then hold one window each
# (benchmarks/RESULTS_fleet.md).
ROWS_PER_CALL = 50_000
FAILED = re.compile(r"SeriesFailed: (.+)")  # an executor's error, as it reaches the driver's message
# pyspark 4.3 warns on every use with pandas 3; the equality test (tests/test_fleet.py) is the check
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)


class FleetError(Exception):
    """A fleet that cannot be answered: its message is the one line the command prints."""


class SeriesFailed(Exception):
    """Raised in an executor: the series the model could not answer, and why (one line)."""


@dataclass
class FleetResult:
    output: str  # the folder written
    n_series: int
    n_rows: int  # answer rows
    job: str  # the model's job
    series_col: str  # the answer's series column: each file of OUT holds whole series, sorted by it


# -- tables as predict.py reads them, answers as it writes them ---------------------------------------


def series_column_of(model) -> str | None:
    """The series column the model reads (None: trained on one series, it names none)."""
    return getattr(getattr(model, "contract", None), "series_col", DEFAULT_SERIES)


def csv_options_of(model) -> dict:
    """The training CSV's read options the model keeps (sep, decimal, encoding)."""
    csv = getattr(getattr(model, "contract", None), "csv", None) or {}
    return {k: v for k, v in csv.items() if v is not None}


def as_table(rows: pd.DataFrame, series: str, csv: dict | None) -> pd.DataFrame:
    """Rows from Spark as predict.py reads a table of their series: each series' rows together and in
    file order, without the fleet's columns. `csv`: the rows are Spark's text cells of a CSV file, read
    again as `pd.read_csv` reads the file (types inferred from these cells); None: typed (Parquet)."""
    table = rows.sort_values([series, FILE_COL, ROW_COL], kind="stable")
    table = table.drop(columns=[c for c in (FILE_COL, ROW_COL, BUCKET_COL) if c in table.columns])
    table = table.reset_index(drop=True)
    if csv is not None:
        sep = csv.get("sep", ",")
        text = table.to_csv(index=False, sep=sep)
        table = pd.read_csv(io.StringIO(text), sep=sep, decimal=csv.get("decimal", "."))
    return table


def numbered_within_series(answer: pd.DataFrame, series: str, ids: tuple[str, ...]) -> pd.DataFrame:
    """The answer with its columns `ids` (that count across a table: the job's
    `Prediction.per_series_ids`) counted from 0 in each series, and each row's position in its series
    (`ORDER_COL`)."""
    by_series = answer.groupby(series, sort=False, dropna=False)
    renumbered = {col: answer[col] - by_series[col].transform("min") for col in ids if col in answer.columns}
    return answer.assign(**renumbered, **{ORDER_COL: by_series.cumcount()})


def shown(series_id) -> str:
    """A series id as a user wrote it: 7, 'pump-3' (a numpy scalar as its Python value)."""
    return repr(series_id.item() if hasattr(series_id, "item") else series_id)


# -- in the executors ---------------------------------------------------------------------------------

_LOADED: dict[str, Predictor] = {}  # a Python worker's loaded models, by shipped folder name


def _worker_predictor(name: str) -> Predictor:
    """The model shipped as `name` (`ship_folder`), loaded once per Python worker (workers are reused)."""
    if name not in _LOADED:
        from pyspark import SparkFiles

        _LOADED[name] = Predictor.of_folder(SparkFiles.get(name))
    return _LOADED[name]


def answer_bucket(key: tuple, rows: pd.DataFrame, plan: dict) -> pd.DataFrame:
    """In an executor: the answer for the series of one bucket (the output's columns, ids counted
    within each series, each row's `ORDER_COL`), predicted together as predict.py predicts a table of
    them. `plan`: the shipped model's name, the series column, params, CSV options, the output's
    columns and series column, the accumulators of series and rows answered."""
    predictor = _worker_predictor(plan["model"])
    table = as_table(rows, plan["series"], plan["csv"])
    try:
        answer = predictor.predict(table, plan["params"], source=plan["source"])[plan["columns"]]
    except Exception as err:  # the driver prints this line
        raise SeriesFailed(_failing_series(predictor, table, plan, err)) from err
    series, answered = plan["counts"]
    series.add(table[plan["series"]].nunique(dropna=False))
    answered.add(len(answer))
    return numbered_within_series(answer, plan["answer_series"], plan["per_series_ids"])


def _failing_series(predictor, table: pd.DataFrame, plan: dict, err: Exception) -> str:
    """'series <id>: <error>' of the first series of `table` the model cannot answer alone (the
    bucket's error and its first series when each answers alone)."""
    ids = table[plan["series"]]
    for sid in ids.unique():
        try:
            alone = table[ids == sid].reset_index(drop=True)
            predictor.predict(alone, plan["params"], source=plan["source"])[plan["columns"]]
        except Exception as failed:  # noqa: BLE001 (named in the line returned)
            return f"series {shown(sid)}: {type(failed).__name__}: {first_line(failed)}"
    return f"series {shown(ids.iloc[0])} and others: {type(err).__name__}: {first_line(err)}"


# -- on the driver ------------------------------------------------------------------------------------


def score_fleet(
    spark,
    model: str | Path,
    data: str | Path,
    output: str | Path,
    *,
    series_col: str | None = None,
    params: dict | None = None,
    rows_per_call: int = ROWS_PER_CALL,
    tracking_uri: str | None = None,
    overwrite: bool = False,
) -> FleetResult:
    """Every series of `data` answered by `model` on `spark`, written to `output` (the module docstring).
    `series_col`: DATA's series column (default: the model's); `params`: the options of the model's
    use, as `Predictor.predict` takes them ({"origin": "2024-05-01 12:00"}, {"impute": True}); `rows_per_call`: about how many rows a Python worker answers
    in one call of the model (whole series). Bad input raises `FleetError` (or the model reference's
    `FileNotFoundError` / `ValueError`) with one line, before anything is written."""
    data, output = str(data), str(output)
    for setting, value in ARROW.items():  # a session the caller made: its time zone is its own
        spark.conf.set(setting, value)
    with tempfile.TemporaryDirectory() as downloads:
        folder, predictor = _load(model, tracking_uri, Path(downloads))
        series = series_col or series_column_of(predictor.model)
        if series is None:
            raise FleetError(
                f"model {model} was trained on one series (it names no series column): give --series"
            )
        csv = csv_options_of(predictor.model)
        frame = _read(spark, data, series, csv)
        out = OutputFolder(spark, output)
        if out.exists() and not overwrite:
            raise FleetError(f"{output} exists: remove it, choose another --output, or give --overwrite")
        plan = {"series": series, "params": params, "csv": csv if is_csv(data) else None, "source": data}
        first = _first_series_answer(frame, predictor, plan)
        plan["model"] = ship_folder(spark, folder, "tsformer-model")
    plan["answer_series"] = next((c for c in (series, DEFAULT_SERIES) if c in first.columns), None)
    if plan["answer_series"] is None:
        raise FleetError(f"the {predictor.job.name} model's answer names no series: {list(first.columns)}")
    plan["columns"] = list(first.columns)
    plan["per_series_ids"] = predictor.job.prediction.per_series_ids
    plan["counts"] = (spark.sparkContext.accumulator(0), spark.sparkContext.accumulator(0))  # series, rows

    def answer(key: tuple, rows: pd.DataFrame) -> pd.DataFrame:  # pickled to the executors
        return answer_bucket(key, rows, plan)

    schema = spark_schema(first).add(ORDER_COL, "long")
    scored = _buckets(frame, series, rows_per_call).groupBy(BUCKET_COL).applyInPandas(answer, schema)
    # a partition of the answer holds whole buckets, so a file whole series: each file sorted by series,
    # each series' rows in their order (no further shuffle; the series column keeps its type and place)
    scored = scored.sortWithinPartitions(plan["answer_series"], ORDER_COL).drop(ORDER_COL)
    _write(scored, out, overwrite)
    series_count, rows = plan["counts"]
    return FleetResult(output, series_count.value, rows.value, predictor.job.name, plan["answer_series"])


def _buckets(frame, series: str, rows_per_call: int):
    """`frame` with each row's bucket (`BUCKET_COL`): a hash of its series, so that a bucket holds whole
    series, about `rows_per_call` rows on average; at least as many buckets as the session's cores."""
    from pyspark.sql import functions as F

    n_rows = frame.count()  # a Parquet file's footers; a CSV file is read once more
    cores = frame.sparkSession.sparkContext.defaultParallelism
    n_buckets = max(cores, math.ceil(n_rows / max(1, rows_per_call)))
    return frame.withColumn(BUCKET_COL, F.pmod(F.xxhash64(frame[series]), F.lit(n_buckets)))


def _load(model, tracking_uri: str | None, downloads: Path) -> tuple[Path, Predictor]:
    """(the model's folder, its predictor) on the driver."""
    from tsformer.serving.references import resolve_model

    folder = resolve_model(str(model), tracking_uri, downloads)
    return folder, Predictor.of_folder(folder)


def _read(spark, data: str, series: str, csv: dict):
    """DATA as a Spark DataFrame, with its series column."""
    try:
        frame = read_table(spark, data, csv)
    except (FileNotFoundError, DataValidationError):  # predict.py's lines for the same file
        raise
    except Exception as err:  # Spark's AnalysisException: a folder of no Parquet, a file it cannot read
        raise FleetError(f"{data}: cannot be read: {first_line(err)}") from err
    if series not in frame.columns:
        columns = [c for c in frame.columns if c not in (FILE_COL, ROW_COL)]
        raise FleetError(f"{data}: no series column {series!r} (its columns: {columns}); --series names it")
    return frame


def _first_series_answer(frame, predictor, plan: dict) -> pd.DataFrame:
    """The driver's answer for the series of DATA's first row: a model that does not fit the data stops
    here, before any Spark job; the answer's columns are the output's."""
    series = plan["series"]
    head = frame.select(series).head(1)
    if not head:
        raise FleetError("DATA has no rows")
    sid = head[0][0]
    rows = frame.filter(frame[series].isNull() if sid is None else frame[series] == sid).toPandas()
    try:
        return predictor.predict(as_table(rows, series, plan["csv"]), plan["params"], source=plan["source"])
    except (DataValidationError, ValueError, KeyError) as err:
        raise FleetError(f"series {shown(sid)}: {type(err).__name__}: {first_line(err)}") from err


def _write(scored, out: OutputFolder, overwrite: bool) -> None:
    """The answers written to the temporary folder, which becomes the output when complete; on any
    failure it is deleted, and a failed series' line raised."""
    try:
        # a file a partition, however large (a session's maxRecordsPerFile would split a series)
        scored.write.option("maxRecordsPerFile", 0).mode("errorifexists").parquet(out.tmp_uri)
        out.commit(overwrite)
    except BaseException as err:
        out.discard()
        if isinstance(err, Exception):
            found = FAILED.search(str(err))
            line = found.group(1).strip() if found else f"the Spark job failed: {first_line(err)}"
            raise FleetError(line) from err
        raise


# -- the command --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per small download
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its connection notes: nothing to act on
    params = {name: getattr(args, name) for name in prediction_params() if getattr(args, name)}
    try:
        spark = spark_session(args.master, dict(_setting(s) for s in args.conf))
        result = score_fleet(
            spark, args.model, args.data, args.output, series_col=args.series, params=params,
            rows_per_call=args.rows_per_call, tracking_uri=args.tracking_uri, overwrite=args.overwrite,
        )  # fmt: skip
    except (
        FleetError, SparkUnavailable, DataValidationError, FileNotFoundError, ValueError, TrackingServerUnreachable
    ) as err:  # fmt: skip
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"{result.job} model: {result.n_series} series, {result.n_rows} rows answered: {result.output} "
        f"(Parquet files, whole series per file, sorted by {result.series_col})"
    )
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tsformer-fleet", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="MLflow run id, runs:/ or models:/ URI, or a model/run folder")
    parser.add_argument("data", help="CSV file, Parquet file or folder of Parquet files (a path or a URI)")
    parser.add_argument(
        "--output", "-o", required=True, help="the answers' folder (Parquet files of whole series)"
    )
    parser.add_argument("--series", help="DATA's series column (default: the model's)")
    for param in prediction_params().values():  # predict.py's options of the jobs' uses
        kind = {"action": "store_true"} if param.kind is bool else {}
        parser.add_argument(param.flag, dest=param.name, help=param.help.replace("%", "%%"), **kind)
    parser.add_argument(
        "--rows-per-call",
        type=int,
        default=ROWS_PER_CALL,
        help=f"about how many rows (whole series) one call of the model answers (default {ROWS_PER_CALL:,})",
    )
    parser.add_argument(
        "--master", help="Spark master (default: spark-submit's, else $SPARK_MASTER, else local[*])"
    )
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace OUTPUT once the new answers are complete"
    )
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or ./mlflow.db)"
    )
    return parser


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise FleetError(f"--conf {text!r}: give KEY=VALUE, e.g. spark.executor.memory=4g")
    return key.strip(), value


if __name__ == "__main__":
    sys.exit(main())
