"""`init_from=`: a training that starts from a saved model's weights (`tsformer.init_from`).

One tiny masked fill-in run is the source of every test: refitted as itself through train.py, its
Transformer blocks taken by a classifier, and refused by another family and other sizes."""

from __future__ import annotations

import dataclasses
import logging
import os

import mlflow
import pytest
import torch
from hydra.utils import instantiate
from mlflow import MlflowClient

from conftest import TINY
from tsformer import init_from
from tsformer.jobs.forecasting.forecaster import WEIGHTS_FILE, Forecaster
from tsformer.settings import SettingError
from tsformer.tracking import restore_env
from tsformer.train import build_task, compose_config, run

MASKED = ["model=enc_only_masked", "model.context_len=48", *TINY]
# lr so small that the refit's weights stay the source's (AdamW moves each by about lr a step)
STILL = ["model.lr=1e-12", "model.weight_decay=0.0"]


def db(folder) -> str:
    return f"logger.mlflow.tracking_uri=sqlite:///{folder}/mlflow.db"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The masked fill-in run every test starts from: its RunResult and its folder."""
    folder = tmp_path_factory.mktemp("source")
    return run(compose_config([*MASKED, db(folder)], folder / "out")), folder


def build(overrides: list[str], folder):
    """The task of `overrides`, built for its data as train.py builds it (untrained)."""
    cfg = compose_config(overrides, folder)
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    return build_task(cfg.model, datamodule)


def test_unknown_references_stop_with_one_line_before_the_data_is_read(tmp_path):
    for reference in (str(tmp_path / "nowhere"), str(tmp_path)):  # no such path; a folder without a model
        overrides = [
            *TINY,
            "logger=none",
            f"init_from={reference}",
            "data.source.n_steps=1",
        ]  # data: unreadable
        with pytest.raises(SettingError) as err:
            run(compose_config(overrides, tmp_path / "out"))
        message = str(err.value)
        assert message.startswith(f"init_from={reference}: ") and "\n" not in message


@pytest.mark.slow
def test_a_refit_starts_from_every_weight_and_its_scalers_and_records_where_from(source, tmp_path, caplog):
    result, _ = source
    newer = ["data.source.seed=1"]  # other rows: scalers fitted on them would differ
    with caplog.at_level(logging.INFO, logger="tsformer.init_from"):
        refit = run(
            compose_config(
                [*MASKED, *STILL, *newer, db(tmp_path), f"init_from={result.model_folder}"], tmp_path / "o"
            )
        )
    kept, theirs = Forecaster.load(refit.model_folder).contract, Forecaster.load(result.model_folder).contract
    fresh = instantiate(compose_config([*MASKED, *newer], tmp_path / "f").data)
    fresh.setup()
    assert fresh.features.target_scaler != theirs.target_scaler  # the test would mean nothing otherwise
    assert kept.target_scaler == theirs.target_scaler and kept.covariate_scaler == theirs.covariate_scaler
    before = torch.load(result.model_folder / WEIGHTS_FILE, weights_only=True)
    after = torch.load(refit.model_folder / WEIGHTS_FILE, weights_only=True)
    assert before.keys() == after.keys()
    for key in before:  # a fresh initialisation is nowhere near
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=1e-6, msg=key)
    (line,) = [r.getMessage() for r in caplog.records if "loaded" in r.getMessage()]
    assert f"loaded {len(before)} of {len(before)} tensors" in line and line.endswith("initialisation: none")
    run_ = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(refit.run_id)
    assert run_.data.tags["init_from"] == str(result.model_folder.resolve())
    assert run_.data.tags["init_from_run_id"] == result.run_id
    assert run_.data.params["init_from"] == str(result.model_folder)


@pytest.mark.slow
def test_a_run_id_names_the_model_of_that_run(source):
    result, folder = source
    elsewhere = f"sqlite:///{folder}/elsewhere.db"  # where this process logs, as far as MLflow knows
    with restore_env("MLFLOW_TRACKING_URI"):
        mlflow.set_tracking_uri(elsewhere)
        loaded = init_from.resolve(result.run_id, f"sqlite:///{folder}/mlflow.db")
        # the process's runs after it still log where they did
        assert mlflow.get_tracking_uri() == os.environ["MLFLOW_TRACKING_URI"] == elsewhere
    assert loaded.location == f"runs:/{result.run_id}/model" and loaded.run_id == result.run_id
    weights = torch.load(result.model_folder / WEIGHTS_FILE, weights_only=True)
    assert all(torch.equal(loaded.state[k], weights[k]) for k in weights)


@pytest.mark.slow
def test_a_classifier_takes_the_transformer_blocks_and_keeps_its_own_input_and_head(source, tmp_path):
    result, _ = source
    weights = torch.load(result.model_folder / WEIGHTS_FILE, weights_only=True)
    classifier = build(["experiment=plant_regime", *TINY[:3], "data.source.n_series=4",
                        "data.source.n_steps=600"], tmp_path)  # fmt: skip
    fresh = {k: v.clone() for k, v in classifier.state_dict().items()}
    loaded = init_from.resolve(str(result.model_folder.parent), None)  # the run's output folder
    assert loaded.location == str(result.model_folder.resolve())
    parts = init_from.load_into(classifier, loaded)
    state = classifier.state_dict()
    blocks = [k for k in state if k.startswith("net.encoder.")]
    assert blocks and sorted(parts["taken"]) == sorted(blocks)
    for key in blocks:
        assert torch.equal(state[key], weights[key]), key
        assert not torch.equal(fresh[key], weights[key]), key
    # the masked model's input projection reads values, flags and covariates; the classifier's the channels
    assert sorted(parts["fresh"]) == sorted(set(state) - set(blocks))
    for key in parts["fresh"]:
        assert torch.equal(state[key], fresh[key]), key


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["model=dec_only"], "network EncoderOnly); this run builds DecoderOnlyForecaster"),
        (["model=enc_only", "model.net.n_heads=4"], "model.net.n_heads=4 here, 2 in the model"),
        (
            [*MASKED[:2], "data.target_cols=[dynamic_temperature]"],
            "data.target_cols=['dynamic_temperature'] here",
        ),
    ],
)
def test_a_model_that_does_not_fit_stops_with_one_line_and_no_mlflow_run(source, tmp_path, overrides, says):
    result, _ = source
    keys = {o.split("=")[0] for o in overrides}
    tiny = [o for o in TINY if o.split("=")[0] not in keys]
    config = [*tiny, *overrides, db(tmp_path), f"init_from={result.model_folder}"]
    with pytest.raises(SettingError) as err:
        run(compose_config(config, tmp_path / "out"))
    message = str(err.value)
    assert message.startswith(f"init_from={result.model_folder}")
    assert says in message and "\n" not in message
    if (tmp_path / "mlflow.db").exists():
        client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
        assert not client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.mark.slow
def test_a_refit_refuses_static_embeddings_of_other_categories(source, tmp_path):
    result, _ = source
    loaded = init_from.resolve(str(result.model_folder), None)
    loaded.features = dataclasses.replace(loaded.features, static_vocabularies={"series_id": ["0", "1"]})
    task = build(MASKED, tmp_path)
    init_from.load_into(task, loaded, {"series_id": ["0", "1"]})
    with pytest.raises(SettingError, match=r"static embeddings .* a refit needs the same categories"):
        init_from.load_into(task, loaded, {"series_id": ["0", "2"]})


@pytest.mark.slow
def test_a_frozen_refit_trains_the_output_layer_alone(source, tmp_path):
    result, _ = source
    refit = run(
        compose_config(
            [*MASKED, db(tmp_path), f"init_from={result.model_folder}", "init_from_freeze=true"],
            tmp_path / "o",
        )
    )
    before = torch.load(result.model_folder / WEIGHTS_FILE, weights_only=True)
    after = torch.load(refit.model_folder / WEIGHTS_FILE, weights_only=True)
    moved = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert moved == ["net.head.bias", "net.head.weight"]


def test_init_from_freeze_without_init_from_stops_with_one_line(tmp_path):
    with pytest.raises(SettingError, match=r"^init_from_freeze=true: nothing to freeze without init_from"):
        run(compose_config([*TINY, "logger=none", "init_from_freeze=true"], tmp_path / "out"))
