"""What `mlflow ui` shows of a run, read through MLflow's client API (the pages themselves are looked at
with `tools/look_at_runs.py`).

One tiny run, registered under a name: its pyfunc model is the run's MLflow 3 "logged model" (the
run page's "Logged models", the experiment's Models tab), `runs:/<id>/model` and the registered
version still load it, `predict.py <run id>` still finds it, and the experiment is marked as one of
model training (`mlflow.experimentKind`), not a GenAI app.
"""

from __future__ import annotations

import os

import mlflow
import pytest
from mlflow import MlflowClient

from conftest import TINY
from tsformer.predict import resolve_model
from tsformer.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG
from tsformer.train import compose_config, run

# every test here trains through train.py (or reads a module fixture that does)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """(run result, client, folder) of one tiny run logged to ./mlflow.db in an empty folder."""
    folder = tmp_path_factory.mktemp("logged")
    old, uri_before = os.getcwd(), os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        os.chdir(folder)
        result = run(compose_config([*TINY, "model_registry.name=tiny-logged"], folder / "out"))
    finally:
        os.chdir(old)
        if uri_before is not None:
            os.environ["MLFLOW_TRACKING_URI"] = uri_before
    return result, MlflowClient(f"sqlite:///{folder}/mlflow.db"), folder


def test_the_pyfunc_model_is_the_runs_logged_model(logged):
    result, client, _ = logged
    run_ = client.get_run(result.run_id)
    outputs = run_.outputs.model_outputs if run_.outputs else []
    assert len(outputs) == 1, "the run has no logged model (the run page says 'Logged models: -')"
    model = client.get_logged_model(outputs[0].model_id)
    assert model.name == "model" and model.source_run_id == result.run_id
    assert model.experiment_id == run_.info.experiment_id
    found = client.search_logged_models([run_.info.experiment_id])  # the experiment's Models tab
    assert [m.model_id for m in found] == [model.model_id]
    (version,) = client.search_model_versions("name='tiny-logged'")
    assert version.source == f"models:/{model.model_id}" and version.run_id == result.run_id


def test_runs_uri_registry_uri_and_predict_py_find_the_logged_model(logged, tmp_path, monkeypatch):
    result, client, _ = logged
    # set_tracking_uri also sets $MLFLOW_TRACKING_URI: monkeypatch takes it back after the test
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    mlflow.set_tracking_uri(client.tracking_uri)
    for uri in [f"runs:/{result.run_id}/model", "models:/tiny-logged/1"]:
        pyfunc = mlflow.pyfunc.load_model(uri)
        assert pyfunc.metadata.get_input_schema() is not None, uri
    # what `predict.py <run id>` fetches: the run's model folder
    model_folder = resolve_model(result.run_id, client.tracking_uri, tmp_path)
    names = sorted(p.name for p in model_folder.iterdir())
    assert names == sorted(p.name for p in result.model_folder.iterdir())


def test_the_experiment_opens_as_model_training(logged):
    result, client, _ = logged
    experiment = client.get_experiment(client.get_run(result.run_id).info.experiment_id)
    assert experiment.tags.get(EXPERIMENT_KIND_TAG) == EXPERIMENT_KIND == "custom_model_development"
