"""Calibrated class probabilities (`tsformer.jobs.classification.calibration`): the temperature is the one
the samples call for, it is fitted without a test series (validation series, or cross-fitting on the
training series), the model folder keeps it, and predict.py, tsformer-serve and the pyfunc model give the
same calibrated probabilities."""

from __future__ import annotations

import json
import shutil

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

from conftest import REPO
from test_classification import sequences_table
from tsformer.jobs.classification.calibration import fit_temperature, nll, stratified_folds
from tsformer.jobs.classification.classifier import FOLDER, Classifier
from tsformer.model_folder import ModelFolderError
from tsformer.predict import main as predict_main
from tsformer.serving.predictor import Predictor
from tsformer.serving.server import answer
from tsformer.tracking import restore_env
from tsformer.train import compose_config, run


def test_the_fitted_temperature_is_the_one_the_labels_were_drawn_with():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, size=(4000, 4))  # (S, C)
    true_t = 2.5
    p = torch.softmax(torch.as_tensor(logits / true_t), dim=1).numpy()
    labels = np.array([rng.choice(4, p=row) for row in p])
    found = fit_temperature(logits, labels)
    assert abs(found - true_t) < 0.15
    assert nll(logits, labels, found) < nll(logits, labels, 1.0)  # over-confident logits: T > 1 helps


def test_samples_all_classified_right_never_sharpen_the_probabilities():
    """Error-free samples' log loss falls as T shrinks: T stays at 1 (not the search's lower bound), while
    the same logits with one error in ten are sharpened or softened as their log loss says."""
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, size=200)
    logits = rng.normal(0, 0.3, size=(200, 3))
    logits[np.arange(200), labels] += 2.0  # (S, C): every sample right, with modest confidence
    assert (logits.argmax(axis=1) == labels).all()
    assert nll(logits, labels, 0.2) < nll(logits, labels, 1.0)  # sharpening would "help" these samples
    assert fit_temperature(logits, labels) == pytest.approx(1.0, abs=1e-3)
    wrong = logits.copy()
    wrong[::10] = wrong[::10, ::-1] * 4  # (S, C): one sample in ten confidently wrong
    assert (wrong.argmax(axis=1) != labels).any()
    assert fit_temperature(wrong, labels) > 1.0


def test_stratified_folds_cover_every_sample_once_with_each_class_spread():
    labels = np.array([0] * 7 + [1] * 5 + [2] * 3)
    fold = stratified_folds(labels, 3, seed=0)
    assert sorted(np.bincount(fold)) == [5, 5, 5]
    for c in range(3):  # each class as evenly over the folds as its count allows
        counts = np.bincount(fold[labels == c], minlength=3)
        assert counts.max() - counts.min() <= 1


TINY = [
    "model.net.d_model=16", "model.net.n_heads=2", "model.net.n_layers=1", "model.warmup_steps=2",
    "trainer.max_steps=30", "trainer.max_epochs=-1", "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
]  # fmt: skip


def tables(tmp_path, test_seed=1, flip_test_labels=False):
    """A training file of 24 series and a test file (its labels reversed on request)."""
    train, test = tmp_path / "train.csv", tmp_path / f"test_{test_seed}_{flip_test_labels}.csv"
    sequences_table(n_series=24, seed=0).to_csv(train, index=False)
    other = sequences_table(n_series=9, seed=test_seed)
    if flip_test_labels:
        other["label"] = other["label"].map({"c0": "c2", "c1": "c0", "c2": "c1"})
    other.to_csv(test, index=False)
    return train, test


def train_tiny(tmp_path, name, train, test, *overrides, logger="none"):
    cfg = compose_config(
        [
            "model=enc_only_classifier", "data=sequences", f"data.train={train}", f"data.test={test}",
            f"logger={logger}", *TINY, *overrides,
        ],
        tmp_path / name,
    )  # fmt: skip
    return run(cfg)


def calibration_of(result) -> dict:
    return json.loads((result.model_folder / "tsformer.json").read_text())["data"]["calibration"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides, fitted_on, n_samples",
    [
        # every series trains: 2 fold networks, each trained on the other half, score the 24 series
        (["data.val_fraction=0", "callbacks=last_weights", "model.calibration_folds=2"], "cross-fitting", 24),
        # 20 % of each class of the training file held out (2 of 8 each): their logits, the best weights
        (["data.val_fraction=0.2"], "validation", 6),
    ],
)
def test_the_temperature_never_sees_a_test_series(tmp_path, overrides, fitted_on, n_samples):
    """The same training file with two test files, one of other series and reversed labels: the same
    temperature, fitted on the training file's series only (the run's test figures differ)."""
    train, test = tables(tmp_path)
    _, other_test = tables(tmp_path, test_seed=5, flip_test_labels=True)
    first = train_tiny(tmp_path, "a", train, test, *overrides)
    second = train_tiny(tmp_path, "b", train, other_test, *overrides)
    a, b = calibration_of(first), calibration_of(second)
    assert a["fitted_on"] == fitted_on and a["n_samples"] == n_samples
    assert a["temperature"] == b["temperature"] and a["temperature"] != 1.0
    assert first.metrics["test/accuracy"] != second.metrics["test/accuracy"]  # the test files did differ
    assert first.metrics["calibration/temperature"] == pytest.approx(a["temperature"])


@pytest.mark.slow
def test_predict_py_serve_and_pyfunc_give_the_same_calibrated_probabilities(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the run's mlflow.db
    train, test = tables(tmp_path)
    every = ["data.val_fraction=0", "callbacks=last_weights", "model.calibration_folds=2"]
    result = train_tiny(tmp_path, "run", train, test, *every, logger="mlflow")
    model = Classifier.load(result.model_folder)
    temperature = calibration_of(result)["temperature"]
    assert model.task.temperature == temperature != 1.0
    table = pd.read_csv(test)
    p_cols = [f"p_{c}" for c in model.classes]

    assert predict_main([str(result.model_folder), str(test), "--output", str(tmp_path / "cli.csv")]) == 0
    cli = pd.read_csv(tmp_path / "cli.csv")
    served_json = answer(Predictor.of_folder(result.model_folder), table, {})
    served = pd.DataFrame(json.loads(served_json)["predictions"])
    with restore_env("MLFLOW_TRACKING_URI"):
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
        pyfunc = mlflow.pyfunc.load_model(f"runs:/{result.run_id}/model").predict(table)
    training = result.forecasts  # the run's own test CSV rows (the same test file)
    for frame in (cli, served, pyfunc):
        assert np.allclose(frame[p_cols].sum(axis=1), 1.0, atol=1e-6)
        np.testing.assert_allclose(frame[p_cols].to_numpy(float), training[p_cols].to_numpy(float), atol=1e-5)
    # and they are the calibrated ones: T = 1 gives other probabilities
    model.task.temperature = 1.0
    raw = model.predict(table)
    assert np.abs(raw[p_cols].to_numpy() - cli[p_cols].to_numpy()).max() > 1e-3


def test_older_folders_read_as_temperature_1_and_a_bad_temperature_is_refused_in_one_line(tmp_path):
    fixture = tmp_path / "model"
    shutil.copytree(REPO / "tests" / "fixtures" / "classifier_1", fixture)
    # classifier-1 (-> 2 -> 3): a folder from before the calibration
    assert Classifier.load(fixture).task.temperature == 1.0
    config = json.loads((fixture / "tsformer.json").read_text())
    config["format"] = FOLDER.format
    config["data"]["calibration"] = {"method": "temperature", "temperature": -2.0, "fitted_on": "validation",
                                     "n_samples": 5, "folds": 0}  # fmt: skip
    (fixture / "tsformer.json").write_text(json.dumps(config))
    refused = "data.calibration.temperature is -2.0, expected a number above 0"
    with pytest.raises(ModelFolderError, match=refused):
        Classifier.load(fixture)
    del config["data"]["calibration"]
    (fixture / "tsformer.json").write_text(json.dumps(config))
    with pytest.raises(ModelFolderError, match=r"key\(s\) \['calibration'\] missing in data"):
        Classifier.load(fixture)
