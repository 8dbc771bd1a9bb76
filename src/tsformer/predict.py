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

from tsformer.data.schema import DataValidationError
from tsformer.data.sources import CSV_OPTIONS, load_table
from tsformer.jobs import JOBS
from tsformer.serving.references import load_job_and_model
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
        "--origin",
        help="forecast from this time for every series (default: each "
        "series' last row with all targets observed); later targets are ignored",
    )
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or ./mlflow.db)"
    )
    parser.add_argument(
        "--time-format",
        help="strftime format of DATA's times, e.g. '%%d/%%m/%%Y %%H:%%M' "
        "(default: the training data's data.time_format)",
    )
    for flag, help_text in {**_job_flags(), **_job_options()}.items():  # what some job's models take
        parser.add_argument(flag, action="store_true", help=help_text)
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
        job, model = load_job_and_model(args.model, args.tracking_uri)  # model: what the job predicts with
        _check_flags(job, args)
        flags = {option: getattr(args, option) for option in CSV_OPTIONS if getattr(args, option) is not None}
        table = load_table(args.data, **{**model.contract.csv, **flags})
        print(job.predict(model, table, args))
    except (DataValidationError, FileNotFoundError, ValueError, TrackingServerUnreachable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _job_flags() -> dict[str, str]:
    """The options with which some job's models are used (`Job.predict_flag`), and their help."""
    return dict(job.predict_flag for job in JOBS.values() if job.predict_flag is not None)


def _job_options() -> dict[str, str]:
    """The options some job's models may take (`Job.predict_options`), and their help."""
    return {flag: text for job in JOBS.values() for flag, text in job.predict_options}


def _check_flags(job, args) -> None:
    """A job's option (`Job.predict_flag`) is given for its model, and for no other; a job's optional
    ones (`Job.predict_options`) for its models only."""
    for flag in _job_options():
        given = getattr(args, flag.lstrip("-").replace("-", "_"))
        if given and flag not in dict(job.predict_options):
            raise ValueError(
                f"{flag}: {args.model} is a model of the {job.name} job, which does not take {flag} "
                f"({job.usage('MODEL')})"
            )
    for flag in _job_flags():
        given = getattr(args, flag.lstrip("-").replace("-", "_"))
        own = job.predict_flag is not None and job.predict_flag[0] == flag
        if given and not own:
            raise ValueError(
                f"{flag}: {args.model} is a model of the {job.name} job, which does not take {flag} "
                f"({job.usage('MODEL')})"
            )
        if own and not given:
            raise ValueError(
                f"{args.model} is a model of the {job.name} job: add {flag} ({job.usage(args.model)})"
            )


if __name__ == "__main__":
    sys.exit(main())
