"""`python predict.py MODEL DATA --output forecasts.csv`: forecast new data with a trained model.

MODEL is any of
- an MLflow run id (the run's logged model) or a model URI: `runs:/<id>/model`, `models:/<name>/<version>`;
- a folder: a run's output folder (`outputs/<date>/<time>`), its `model/` folder, or a downloaded
  MLflow model folder.
DATA is a CSV or Parquet table laid out like the training data: per series the observed history,
then rows for the future steps with the target cells empty and the known-future covariates filled
(see `tsformer.forecaster`). The forecasts CSV has the columns of training's export and is written
atomically. MLflow is only used to fetch the model; the tracking URI is `--tracking-uri`, else
`$MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db` in the current folder, as in training. A
tracking server that does not answer, or a database file that is not there, stops it at once
(`tracking.require_reachable`); it creates no database.
DATA is read as the training data was (its time format and CSV separator, decimal mark and encoding
are kept in the model folder) unless `--time-format`, `--sep`, `--decimal` or `--encoding` say otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import tempfile
from pathlib import Path

from tsformer.data.schema import DataValidationError
from tsformer.data.sources import CSV_OPTIONS, load_table
from tsformer.jobs import JOBS, job_of_folder
from tsformer.model_folder import CONFIG_FILE
from tsformer.tracking import TrackingServerUnreachable

log = logging.getLogger(__name__)

RUN_ID = re.compile(r"^[0-9a-f]{32}$")
# where a model folder lies inside the folders a user may point at
MODEL_FOLDER_PLACES = (".", "model", "artifacts/model")


def find_model_folder(folder: Path) -> Path:
    for place in MODEL_FOLDER_PLACES:
        if (folder / place / CONFIG_FILE).is_file():
            return folder / place
    raise FileNotFoundError(
        f"no tsformer model in {folder}: looked for {CONFIG_FILE} in "
        f"{', '.join(str(folder / p) for p in MODEL_FOLDER_PLACES)}"
    )


def load_job_and_model(reference: str, tracking_uri: str | None):
    """(job, inference object) of a run id, model URI or folder; a downloaded copy is removed once loaded."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = resolve_model(reference, tracking_uri, Path(tmp))
        job = job_of_folder(folder)
        return job, job.load(folder)


def resolve_model(reference: str, tracking_uri: str | None, download_to: Path) -> Path:
    """The local model folder of a run id, model URI or folder (downloaded from MLflow if needed)."""
    path = Path(reference).expanduser()
    if path.is_dir():
        return find_model_folder(path)
    if RUN_ID.match(reference):
        reference = f"runs:/{reference}/model"
    if not reference.startswith(("runs:/", "models:/")):
        raise FileNotFoundError(
            f"model {reference!r} is neither a folder nor an MLflow run id / runs:/ or models:/ URI"
        )
    import mlflow

    from tsformer.tracking import absolute_sqlite_uri, require_reachable, tracking_uri_for

    if tracking_uri:
        uri, setting = tracking_uri, "--tracking-uri"
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        uri, setting = os.environ["MLFLOW_TRACKING_URI"], "$MLFLOW_TRACKING_URI"
    else:
        uri, setting = "sqlite:///mlflow.db", "the default (no --tracking-uri, no $MLFLOW_TRACKING_URI)"
    uri = absolute_sqlite_uri(uri)
    instead = "or give the model folder instead"
    database = Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None
    if database is not None and not database.is_file():  # MLflow would create an empty one, then find no run
        raise FileNotFoundError(
            f"no MLflow tracking database here: {database} does not exist (tracking URI {uri}, from "
            f"{setting}); run predict.py in the folder that training ran in, give --tracking-uri, {instead}"
        )
    # the check does not retry; the download keeps the user's MLFLOW_HTTP_REQUEST_* settings
    require_reachable(uri, setting, f"start the server, correct the URI, {instead}")
    try:  # MLflow finds a run's logged model through its process-wide URI: set for the download only
        with tracking_uri_for(uri):
            local = mlflow.artifacts.download_artifacts(artifact_uri=reference, dst_path=str(download_to))
    except mlflow.exceptions.MlflowException as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(f"cannot fetch model {reference!r} from MLflow at {uri}: {reason}") from err
    return find_model_folder(Path(local))


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
    for flag, help_text in _job_flags().items():  # a use of the model some job asks for
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


def _check_flags(job, args) -> None:
    """A job's option (`Job.predict_flag`) is given for its model, and for no other."""
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
