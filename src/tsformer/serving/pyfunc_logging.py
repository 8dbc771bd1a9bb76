"""Logging a run's model folder as its MLflow pyfunc model (the model itself: `pyfunc.py`).

Called by the run's MLflow callback (`callbacks.MLflowRun.log_outputs`) after the test; it sits with
the model it logs, above the tracking layer (`tsformer.tracking`), which knows nothing of serving.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tsformer.tracking import restore_env

if TYPE_CHECKING:
    from lightning.pytorch.loggers import MLFlowLogger

log = logging.getLogger(__name__)

MODEL_NAME = "model"  # the run's logged pyfunc model: runs:/<run id>/model
MODEL_FROM_CODE = Path(__file__).with_name("pyfunc.py")  # MLflow's "model from code" file


def log_pyfunc_model(
    logger: MLFlowLogger,
    model_folder: Path,
    example_input,
    example_output,
    registry_name: str | None = None,
    params: Mapping | None = None,
    example_params: Mapping | None = None,
) -> str:
    """Log the run's model folder as the run's MLflow pyfunc model `model`; register it when named.

    MLflow 3's model logging (`pyfunc.log_model`'s path, `Model.log`) makes it a "logged model" of
    the run: listed on the run's page and the experiment's Models tab, found at `runs:/<run id>/model`
    (and `models:/<model id>`); its files are kept with the logged model, not in the run's artifacts.
    A model from code (`pyfunc.py` beside this file) with the tsformer package as its code: loading it unpickles
    nothing and needs no Hydra config. The signature holds the answer's columns (from the example
    table's answer) and `params`, the options of the model's job with the value that means "not given"
    ("" or false) as their defaults; `example_params`: those the example is answered with. Returns the
    model URI.

    The signature holds no input schema: MLflow would hand the model the schema's columns only, in its
    order and types, so that the pyfunc model would answer otherwise than predict.py and tsformer-serve
    (a filled table without the columns it did not know, in another order; MLflow's own message for a
    table it refuses). The model checks its tables itself, as they do; the logged input example shows
    the layout.
    """
    import warnings
    from importlib.metadata import PackageNotFoundError, version

    import mlflow
    from mlflow.models import Model, infer_signature

    import tsformer

    with warnings.catch_warnings():  # "integer columns cannot hold missing values": series ids never may
        warnings.simplefilter("ignore", UserWarning)
        signature = infer_signature(example_input, example_output, params=dict(params or {}) or None)
    signature.inputs = None
    requirements = []
    for package in ("torch", "lightning", "pandas", "numpy", "scikit-learn", "mlflow"):
        try:
            requirements.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            requirements.append(package)
    client, run_id = logger.experiment, logger.run_id
    # Created here in the run's experiment: MLflow's model logging, given a run that is not its active
    # (fluent) run, would put the model into its default experiment. The run's params, as MLflow copies them.
    model = client.create_logged_model(
        logger.experiment_id, name=MODEL_NAME, source_run_id=run_id, params=client.get_run(run_id).data.params
    )
    with restore_env("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"):
        os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"  # logging copies with a bar per file
        mlflow.set_tracking_uri(client.tracking_uri)  # Model.log's client: the run's database or server
        info = Model.log(  # what mlflow.pyfunc.log_model runs, with the run and the model given
            artifact_path=None,  # MLflow 3: the model is named, not placed among the run's artifacts
            name=MODEL_NAME,
            flavor=mlflow.pyfunc,
            run_id=run_id,
            model_id=model.model_id,
            python_model=str(MODEL_FROM_CODE),  # not imported here: loading it sets MLflow's model
            artifacts={"model_folder": str(model_folder)},
            code_paths=[str(Path(tsformer.__file__).parent)],
            signature=signature,
            # shown in the MLflow UI: the table layout a user must give (and the params of its answer)
            input_example=(example_input, dict(example_params)) if example_params else example_input,
            pip_requirements=requirements,
            registered_model_name=registry_name,
        )
    if info.registered_model_version is not None:
        uri = f"models:/{registry_name}/{info.registered_model_version}"
        log.info("registered the run's model as %s", uri)
        return uri
    return f"runs:/{run_id}/{MODEL_NAME}"
