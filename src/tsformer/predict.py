"""`python predict.py MODEL DATA --output forecasts.csv`: forecast new data with a trained model.

MODEL is any of
- an MLflow run id (the run's logged model) or a model URI: `runs:/<id>/model`, `models:/<name>/<version>`;
- a folder: a run's output folder (`outputs/<date>/<time>`), its `model/` folder, or a downloaded
  MLflow model folder.
DATA is a CSV or Parquet table laid out like the training data: per series the observed history,
then rows for the future steps with the target cells empty and the known-future covariates filled
(see `tsformer.jobs.forecasting.forecaster`). The forecasts CSV has the columns of training's export and is written
atomically. MLflow is only used to fetch the model (`tsformer.serving.references`); the tracking URI
is `--tracking-uri`, else `$MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db` in the current folder.
DATA is read as the training data was (its time format and CSV separator, decimal mark and encoding
are kept in the model folder) unless `--time-format`, `--sep`, `--decimal` or `--encoding` say otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from tsformer.data.schema import DataValidationError
from tsformer.data.sources import CSV_OPTIONS, load_table
from tsformer.jobs import prediction_params
from tsformer.serving.predictor import Predictor, load_predictor
from tsformer.serving.writers import write_answer
from tsformer.tracking import TrackingServerUnreachable

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="MLflow run id, runs:/ or models:/ URI, or a model/run folder")
    parser.add_argument("data", help="CSV or Parquet table: history plus future rows of known covariates")
    parser.add_argument("--output", "-o", required=True, help="where to write the forecasts CSV")
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or ./mlflow.db)"
    )
    for param in prediction_params().values():  # the options of the jobs' uses (`Prediction.params`)
        kind = {"action": "store_true"} if param.kind is bool else {}
        parser.add_argument(param.flag, dest=param.name, help=param.help.replace("%", "%%"), **kind)
    for option in CSV_OPTIONS:
        parser.add_argument(
            f"--{option}",
            help=f"pandas.read_csv {option} of a CSV DATA file "
            f"(default: the training data's data.csv.{option})",
        )
    args = parser.parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per small download
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    try:
        predictor = load_predictor(args.model, args.tracking_uri)
        given = {option: getattr(args, option) for option in CSV_OPTIONS if getattr(args, option) is not None}
        csv = {**predictor.model.contract.csv, **given}
        table = load_table(args.data, **csv)
        print(_predict(predictor, table, args, csv))
    except (DataValidationError, FileNotFoundError, ValueError, TrackingServerUnreachable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _predict(predictor: Predictor, table, args, csv: dict) -> str:
    """The answer to `table` written to `args.output` (and the tables beside it); what was written."""
    declared = {param.name for param in predictor.params}
    given = {name: getattr(args, name) for name in prediction_params() if getattr(args, name)}
    for name in sorted(set(given) - declared):  # as the predictor would say it, with the option's name
        flag = prediction_params()[name].flag
        raise ValueError(
            f"{flag}: {args.model} is a model of the {predictor.job.name} job, which does not take {flag} "
            f"({predictor.job.usage('MODEL')})"
        )
    answer = predictor.predict(table, given, source=str(args.data))
    as_read = None
    if predictor.job.prediction.written_as_read:  # the input table completed: written as it was read
        as_read = {**csv, "date_format": args.time_format or predictor.model.contract.time_format}
    written = write_answer(answer, Path(args.output), as_read)
    return predictor.job.prediction.report(predictor.model, answer, [path.resolve() for path in written])


if __name__ == "__main__":
    sys.exit(main())
