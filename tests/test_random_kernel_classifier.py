"""`model=random_kernel_ridge`: train.py composes the real configs and solves it in one epoch; predict.py,
serving and the pyfunc model give the run's probabilities; its folder loads from its files alone."""

from __future__ import annotations

import json
import shutil

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

from tsformer.jobs.classification.classifier import Classifier
from tsformer.models.random_kernel_ridge import RandomKernelRidge
from tsformer.predict import main as predict_main
from tsformer.serving.predictor import Predictor
from tsformer.serving.server import answer
from tsformer.tasks import RandomKernelRidgeTask
from tsformer.tracking import restore_env
from tsformer.train import compose_config, run


def waves_table(n_series: int, seed: int, noise: float = 1.0) -> pd.DataFrame:
    """Series of 30-50 steps, one channel: a sine whose period is set by its class (3 classes), a random
    phase, and noise: told apart by shape, not by level."""
    rng = np.random.default_rng(seed)
    rows = []
    for sid in range(n_series):
        c = sid % 3
        t = np.arange(int(rng.integers(30, 51)))
        values = np.sin(2 * np.pi * t / (4 + 4 * c) + rng.uniform(0, 2 * np.pi)) + rng.normal(
            0, noise, len(t)
        )
        rows += [
            {"series_id": sid, "step": s, "ch0": v, "label": f"c{c}"} for s, v in zip(t, values, strict=True)
        ]
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("random_kernel_ridge")
    train, test = folder / "train.csv", folder / "test.csv"
    waves_table(30, seed=0).to_csv(train, index=False)
    waves_table(30, seed=1).to_csv(test, index=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)  # the run's mlflow.db
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        cfg = compose_config(
            [
                "model=random_kernel_ridge", "data=sequences", f"data.train={train}", f"data.test={test}",
                "data.val_fraction=0", "callbacks=last_weights", "logger=mlflow", "figures=false",
                "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
            ],
            folder / "run",
        )  # fmt: skip
        result = run(cfg)
    return result, folder, train, test


@pytest.mark.slow
def test_train_py_solves_it_beside_the_baselines(trained):
    result, *_ = trained
    m = result.metrics
    # the waves differ by period only: per-channel summaries (the logistic baseline) hardly tell them apart
    assert m["test/accuracy"] >= 0.8 > m["test/baseline_accuracy"]
    assert m["test/accuracy"] > m["test/logistic_accuracy"]
    calibration = json.loads((result.model_folder / "tsformer.json").read_text())["data"]["calibration"]
    assert calibration["fitted_on"] == "leave-one-out" and calibration["n_samples"] == 30
    assert m["calibration/temperature"] == pytest.approx(calibration["temperature"])


@pytest.mark.slow
def test_predict_py_serve_and_pyfunc_give_the_runs_probabilities(trained, tmp_path):
    result, folder, _, test = trained
    model = Classifier.load(result.model_folder)
    p_cols = [f"p_{c}" for c in model.classes]
    table = pd.read_csv(test)
    assert predict_main([str(result.model_folder), str(test), "--output", str(tmp_path / "cli.csv")]) == 0
    cli = pd.read_csv(tmp_path / "cli.csv")
    served = pd.DataFrame(
        json.loads(answer(Predictor.of_folder(result.model_folder), table, {}))["predictions"]
    )
    with restore_env("MLFLOW_TRACKING_URI"):
        mlflow.set_tracking_uri(f"sqlite:///{folder}/mlflow.db")
        pyfunc = mlflow.pyfunc.load_model(f"runs:/{result.run_id}/model").predict(table)
    training = result.forecasts  # the run's own classes CSV rows
    assert 0.05 < training[p_cols].to_numpy(float).max(axis=1).min()  # not every probability 0 or 1
    assert (training[p_cols].to_numpy(float).max(axis=1) < 0.999).any()
    for frame in (cli, served, pyfunc):
        np.testing.assert_allclose(frame[p_cols].to_numpy(float), training[p_cols].to_numpy(float), atol=1e-6)


@pytest.mark.slow
def test_the_folder_loads_without_the_training_data(trained, tmp_path):
    result, _, train, test = trained
    moved = shutil.copytree(result.model_folder, tmp_path / "model")
    table = pd.read_csv(test)
    kept = test.read_bytes()
    train.unlink()  # no training series to fit anything from
    try:
        proba = Classifier.load(moved).predict(table)
    finally:
        pd.DataFrame().to_csv(train)  # the file exists again (empty) for the module's other tests
        test.write_bytes(kept)
    assert (proba.y_pred == proba.y_true).mean() >= 0.8  # the fitted model, not one of NaN or zero weights
    p_cols = [c for c in proba.columns if c.startswith("p_")]
    np.testing.assert_allclose(
        proba[p_cols].to_numpy(float), result.forecasts[p_cols].to_numpy(float), atol=1e-6
    )


def test_the_tasks_buffers_give_the_ridge_it_was_fitted_as():
    """The task's tensors rebuild the fitted ridge: the same scores as the ridge itself."""
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(12, 40, 2)), dtype=torch.float32)
    valid = torch.ones(12, 40, dtype=torch.bool)
    valid[:4, 30:] = False
    labels = np.arange(12) % 3
    ridge = RandomKernelRidge(336, seed=3).fit(x, valid, labels, 3)
    layout = [[list(d), list(n)] for d, n in ridge.layout()]
    task = RandomKernelRidgeTask(d_in=2, classes=["a", "b", "c"], n_features=336, seed=3, layout=layout)
    task.net.load_state_dict(ridge.fitted_tensors())
    task.temperature = ridge.temperature
    np.testing.assert_allclose(task(x, valid).numpy(), ridge.decision(x, valid), rtol=1e-12)
    batch = {"x": x, "valid": valid}
    np.testing.assert_allclose(task.predict_proba(batch).numpy(), ridge.predict_proba(x, valid), rtol=1e-10)


def test_the_ridge_is_restored_once_not_every_batch_with_the_same_scores(monkeypatch):
    """Scores of several batches restore the ridge from the buffers once, and are the ones a ridge restored
    for each batch gives (to the bit); a load of other buffers restores again: their scores follow."""
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(12, 40, 2)), dtype=torch.float32)
    valid = torch.ones(12, 40, dtype=torch.bool)
    valid[:4, 30:] = False
    labels = np.arange(12) % 3
    fits = [RandomKernelRidge(336, seed=3).fit(x, valid, np.roll(labels, k), 3) for k in (0, 1)]
    layout = [[list(d), list(n)] for d, n in fits[0].layout()]
    assert layout == [[list(d), list(n)] for d, n in fits[1].layout()]  # the same kernels' shapes
    task = RandomKernelRidgeTask(d_in=2, classes=["a", "b", "c"], n_features=336, seed=3, layout=layout)
    restores = []
    restore = RandomKernelRidge.restore
    monkeypatch.setattr(
        RandomKernelRidge, "restore", lambda self, *a: restores.append(1) or restore(self, *a)
    )
    for fit in fits:
        task.load_state_dict({f"net.{k}": v for k, v in fit.fitted_tensors().items()})
        scores = [task(x[lo : lo + 4], valid[lo : lo + 4]).numpy() for lo in (0, 4, 8)]
        alone = RandomKernelRidge(336, seed=3).restore(layout, fit.fitted_tensors(), 1.0)
        for lo, got in zip((0, 4, 8), scores, strict=True):
            np.testing.assert_array_equal(got, alone.decision(x[lo : lo + 4], valid[lo : lo + 4]))
        np.testing.assert_allclose(np.concatenate(scores), fit.decision(x, valid), rtol=1e-12)
    assert len(restores) == 2 + 2  # one for each load (and one for each `alone`), not one a batch
    task.net.load_state_dict(fits[0].fitted_tensors())  # the buffers' own module loaded: restored again
    np.testing.assert_allclose(task(x, valid).numpy(), fits[0].decision(x, valid), rtol=1e-12)
    assert len(restores) == 5
