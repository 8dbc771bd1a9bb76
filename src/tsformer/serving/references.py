"""What a model reference names: an MLflow run id, a `runs:/` or `models:/` URI, or a folder (a run's
output folder, its `model/`, a downloaded MLflow model), resolved to the local model folder
(`serving.predictor.load_predictor` loads it). predict.py, tsformer-serve, init_from= and the fleet
all start here.

MLflow is only used to fetch the model; the tracking URI is the one given, else
`$MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db` in the current folder, as in training. A tracking
server that does not answer, or a database file that is not there, stops it at once
(`tracking.require_reachable`); it creates no database.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tsformer.model_folder import CONFIG_FILE

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
