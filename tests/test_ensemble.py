"""An ensemble folder (tsformer.jobs.classification.ensemble): the mean of its members' probabilities, through every loader."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from test_classification import NET, sequences_table
from tsformer import predict
from tsformer.data.sequences import SequenceDataModule
from tsformer.jobs import load_model
from tsformer.jobs.classification.classifier import Classifier, save_classifier_folder
from tsformer.jobs.classification.ensemble import train_ensemble, write_ensemble_folder
from tsformer.model_folder import ModelFolderError, ModelInfo
from tsformer.settings import SettingError
from tsformer.tasks.classification import ClassificationTask


def members(tmp_path, n=3):
    train, test = sequences_table(), sequences_table(n_series=6, seed=2)
    dm = SequenceDataModule(train, test)
    dm.setup()
    folders = []
    for i in range(n):
        torch.manual_seed(i)  # members differ by their initial weights only
        task = ClassificationTask(NET, dm.d_in, dm.classes).eval()
        info = ModelInfo("enc_only_classifier", "x")
        folders.append(save_classifier_folder(tmp_path / f"m{i}", task, dm, info))
    return folders, test


def test_an_ensemble_folder_predicts_the_mean_of_its_members_probabilities(tmp_path):
    folders, test = members(tmp_path)
    ensemble = write_ensemble_folder(tmp_path / "ensemble", folders)
    columns = ["p_c0", "p_c1", "p_c2"]
    each = np.stack([Classifier.load(f).predict(test)[columns].to_numpy() for f in folders])  # (3, S, C)
    assert np.abs(each[0] - each[1]).max() > 1e-3  # the members do differ
    got = load_model(ensemble).predict(test)  # the pyfunc model loads through load_model
    np.testing.assert_allclose(got[columns].to_numpy(), each.mean(axis=0), atol=1e-6)
    assert (got.y_pred == np.array(["c0", "c1", "c2"])[each.mean(axis=0).argmax(axis=1)]).all()
    test.drop(columns="label").to_csv(tmp_path / "test.csv", index=False)
    assert (
        predict.main([str(ensemble), str(tmp_path / "test.csv"), "--output", str(tmp_path / "out.csv")]) == 0
    )
    np.testing.assert_allclose(
        pd.read_csv(tmp_path / "out.csv")[columns].to_numpy(), each.mean(axis=0), atol=1e-6
    )


def test_members_that_read_the_data_differently_are_refused_and_member_names_stay_inside(tmp_path):
    folders, _ = members(tmp_path, n=2)
    config = json.loads((folders[1] / "tsformer.json").read_text())
    config["data"]["channel_scaler"]["loc"] = [9.0, 9.0]
    (folders[1] / "tsformer.json").write_text(json.dumps(config))
    with pytest.raises(ModelFolderError, match="data contract differs"):
        write_ensemble_folder(tmp_path / "ensemble", folders)
    folders, _ = members(tmp_path / "again", n=2)
    ensemble = write_ensemble_folder(tmp_path / "ok", folders)
    config = json.loads((ensemble / "tsformer.json").read_text())
    (ensemble / "tsformer.json").write_text(json.dumps({**config, "members": ["../m0"]}))
    with pytest.raises(ModelFolderError, match="member folders inside"):
        load_model(ensemble)


@pytest.mark.slow
def test_one_command_trains_the_members_with_their_own_seeds(tmp_path):
    train = tmp_path / "train.csv"
    sequences_table(n_series=15).to_csv(train, index=False)
    sequences_table(n_series=6, seed=1).to_csv(tmp_path / "test.csv", index=False)
    overrides = [
        "model=enc_only_classifier", "data=sequences", f"data.train={train}", f"data.test={tmp_path / 'test.csv'}",
        "data.val_fraction=0", "callbacks=last_weights", "logger=none", "trainer.max_epochs=2",
        "model.net.d_model=16", "model.net.n_heads=2", "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false", "seed=7",
    ]  # fmt: skip
    with pytest.raises(SettingError, match="each seed holds out other validation series"):
        train_ensemble([*overrides, "data.val_fraction=0.2", "callbacks=default"], 2, tmp_path / "refused")
    done = train_ensemble(overrides, 2, tmp_path / "ens")
    folder = done["folder"]
    assert json.loads((folder / "tsformer.json").read_text())["members"] == ["member_0", "member_1"]
    assert len(done["test_accuracy"]["members"]) == 2 and 0 <= done["test_accuracy"]["ensemble"] <= 1
    weights = [torch.load(folder / f"member_{i}" / "weights.pt", weights_only=True) for i in range(2)]
    assert any((weights[0][k] != weights[1][k]).any() for k in weights[0])  # seeds 7 and 8 differ
