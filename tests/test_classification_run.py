"""End to end: `python train.py experiment=plant_regime` (tiny) in an empty folder, then predict.py and the
pyfunc model on the same stream: the classes and probabilities of the training CSV.

train.py's and predict.py's code runs in this process (`run`, predict.py's `main`): their processes are
the contract's (tests/contract.py runs the classification job's printed command and tsformer-serve as
processes) and the README's; a process here would add only its imports."""

from __future__ import annotations

import contextlib
import io

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from tsformer.data import fetch
from tsformer.predict import main as predict_main
from tsformer.tasks.classification import METRICS
from tsformer.tracking import restore_env
from tsformer.train import compose_config, run

pytestmark = pytest.mark.slow

TINY_REGIME = [
    "model.net.d_model=16",
    "model.net.n_heads=2",
    "model.net.n_layers=1",
    "model.warmup_steps=2",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=3",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "data.source.n_series=8",
    "data.source.n_steps=600",
]
KEYS = ["series_id", "window_end_time"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(what the run printed, the folder it ran in): one tiny run shared by the tests, its MLflow
    database ./mlflow.db of that folder, as train.py's default."""
    folder = tmp_path_factory.mktemp("plant_regime")
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.chdir(folder)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        run(compose_config(["experiment=plant_regime", *TINY_REGIME], folder / "out"))
    return printed.getvalue(), folder


def the_run(folder):
    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "tsformer"]
    (run,) = client.search_runs([experiment.experiment_id])
    return client, run


def test_a_finished_run_with_metrics_beside_the_baselines_figures_and_csv(trained):
    printed, folder = trained
    client, run = the_run(folder)
    assert run.info.status == "FINISHED"
    assert run.data.tags["family"] == "enc_only_classifier"
    for name in METRICS:
        for key in (f"test/{name}", f"test/baseline_{name}", f"test/logistic_{name}"):
            assert np.isfinite(run.data.metrics[key]), key
    assert "val/loss" in run.data.metrics
    # each augmentation is named in the run's params (off in this run: plant_regime sets none)
    augment = ("jitter", "scaling", "shift", "circular", "window_warp", "mixup")
    assert {k: run.data.params.get(f"model/augment/{k}") for k in augment} == {
        **dict.fromkeys(augment, "0.0"),
        "circular": "False",
    }
    artifacts = {
        a.path for f in ("plots", "classes", "checkpoints") for a in client.list_artifacts(run.info.run_id, f)
    }
    for path in [
        "plots/confusion_matrix.png",
        "plots/reliability.png",
        "classes/classes.csv",
        "checkpoints/best.ckpt",
    ]:
        assert path in artifacts, (path, artifacts)
    csv = pd.read_csv(folder / "out" / "classes.csv")
    assert list(csv.columns) == [*KEYS, "y_true", "y_pred", "p_low", "p_normal", "p_high"]  # data.class_order
    assert len(csv) == run.data.metrics["test/n_samples"]
    assert np.allclose(csv[["p_low", "p_normal", "p_high"]].sum(axis=1), 1.0, atol=1e-6)
    assert "balanced_accuracy" in printed and "classes CSV:" in printed


def test_predict_py_and_the_pyfunc_model_give_the_training_csvs_classes(trained, tmp_path):
    _, folder = trained
    _, run = the_run(folder)
    # the stream as a user writes it: `tsformer-data simulate plant_regime`, the data the run trained on
    simulate = ["simulate", "plant_regime", "--output", str(tmp_path / "stream.csv")]
    assert fetch.cli([*simulate, "--n-series", "8", "--n-steps", "600"]) == 0
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.chdir(folder)  # the run id is looked up in ./mlflow.db, as predict.py run where train.py ran
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        status = predict_main(
            [run.info.run_id, str(tmp_path / "stream.csv"), "--output", str(tmp_path / "classes.csv")]
        )
    assert status == 0 and "classes CSV:" in printed.getvalue()
    training = pd.read_csv(folder / "out" / "classes.csv", parse_dates=["window_end_time"])
    probs = ["p_high", "p_low", "p_normal"]
    with restore_env("MLFLOW_TRACKING_URI"):  # set_tracking_uri sets it for the rest of the process
        mlflow.set_tracking_uri(f"sqlite:///{folder}/mlflow.db")
        pyfunc = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    table = pd.read_csv(tmp_path / "stream.csv")  # times as text: the model reads them as predict.py does
    unlabelled = pyfunc.predict(table.drop(columns="regime"))  # labels are optional in the signature
    assert unlabelled.y_true.isna().all() and len(unlabelled) == len(pyfunc.predict(table))
    for new in (
        pd.read_csv(tmp_path / "classes.csv", parse_dates=["window_end_time"]),
        pyfunc.predict(table),
    ):
        new["window_end_time"] = pd.to_datetime(new["window_end_time"])
        merged = training.merge(new, on=KEYS, suffixes=("", "_new"))
        assert len(merged) == len(training)  # every test window is among the stream's windows
        assert (merged.y_pred == merged.y_pred_new).all() and (merged.y_true == merged.y_true_new).all()
        assert np.abs(merged[probs].to_numpy() - merged[[p + "_new" for p in probs]].to_numpy()).max() <= 1e-5
