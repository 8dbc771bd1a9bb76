"""A model folder is checked when it is loaded: a damaged file (`weights.pt`, `tsformer.json`) or a
contract whose lists do not fit its own column roles is refused with one line that names the file and
what is wrong, and `predict.py` exits 2 with it. Every case damages a copy of one real folder, written
by one tiny training with targets, known-future and past-only covariates and static columns (module
fixture)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import PLANT_TARGETS, TINY
from tsformer import predict
from tsformer.data import simulate_plant
from tsformer.jobs import load_model
from tsformer.jobs.forecasting.forecaster import CONFIG_FILE, WEIGHTS_FILE, Forecaster, ModelFolderError
from tsformer.tasks.forecasting import DecoderOnlyForecaster, EncoderDecoderForecaster
from tsformer.train import compose_config, run

# every test here trains through train.py (or reads a module fixture that does)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, Path]:
    """(the model folder of a tiny enc_dec run, the table it trained on as a CSV)."""
    folder = tmp_path_factory.mktemp("trained")
    df = simulate_plant(n_series=2, n_steps=800, freq="1min", seed=0)
    df = df.assign(rated_kw=df.series_id.map({0: 50.0, 1: 75.0}), kind=df.series_id.map({0: "A", 1: "B"}))
    df.to_csv(folder / "plant.csv", index=False)
    overrides = [
        "model=enc_dec", *[o for o in TINY if not o.startswith("data.source")], "data=csv",
        f"data.source={folder / 'plant.csv'}", f"data.target_cols=[{','.join(PLANT_TARGETS)}]",
        "data.known_cols=[ambient_pressure,ambient_temperature]", "data.observed_cols=[supply_voltage]",
        "data.series_col=series_id", "data.static_cols=[rated_kw]", "data.static_categorical_cols=[kind]",
        "logger=none",
    ]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        result = run(compose_config(overrides, folder / "out"))
    return result.model_folder, folder / "plant.csv"


def edit_config(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        config = json.loads((folder / CONFIG_FILE).read_text())
        change(config)
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2))

    return damage


def edit_weights(change: Callable[[dict, dict], dict]) -> Callable[[Path], None]:
    """`change(state, hparams)` -> the state dict written instead."""

    def damage(folder: Path) -> None:
        state = torch.load(folder / WEIGHTS_FILE, weights_only=True)
        hparams = json.loads((folder / CONFIG_FILE).read_text())["hparams"]
        torch.save(change(state, hparams), folder / WEIGHTS_FILE)

    return damage


def cut_file(name: str, keep: float) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: int(len(data) * keep)])

    return damage


def random_weights(folder: Path) -> None:
    size = (folder / WEIGHTS_FILE).stat().st_size
    (folder / WEIGHTS_FILE).write_bytes(np.random.default_rng(0).bytes(size))


def another_family(state: dict, hparams: dict) -> dict:
    """The weights of a decoder-only network of the same sizes."""
    net = {
        k: v
        for k, v in hparams["net"].items()
        if k not in ("n_decoder_layers", "start_token", "feed_back", "decoder_patch_len")
    }
    return DecoderOnlyForecaster(**{**hparams, "net": net}).state_dict()


def another_size(state: dict, hparams: dict) -> dict:
    net = {**hparams["net"], "d_model": 2 * hparams["net"]["d_model"]}
    return EncoderDecoderForecaster(**{**hparams, "net": net}).state_dict()


def pop(d: dict, *keys):
    for key in keys[:-1]:
        d = d[key]
    d.pop(keys[-1])


def nan_weight(state: dict, hparams: dict) -> dict:
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name][0] = float("nan")
    return state


# name -> (damage, the file at fault, words the message must hold)
DAMAGES = {
    "weights truncated": (cut_file(WEIGHTS_FILE, 0.5), WEIGHTS_FILE, ["not a weights file torch can read"]),
    "weights empty": (cut_file(WEIGHTS_FILE, 0.0), WEIGHTS_FILE, ["is empty"]),
    "weights random bytes": (random_weights, WEIGHTS_FILE, ["not a weights file torch can read"]),
    "weights of another family": (
        edit_weights(another_family), WEIGHTS_FILE, ["does not fit the network", "missing", "unknown"]
    ),
    "weights of another size": (
        edit_weights(another_size), WEIGHTS_FILE, ["does not fit the network", "of another shape"]
    ),
    "weights not tensors": (edit_weights(lambda s, h: {"a": [1.0, 2.0]}), WEIGHTS_FILE, ["named tensors"]),
    "weights with NaN": (edit_weights(nan_weight), WEIGHTS_FILE, ["NaN or infinite"]),
    "weights missing": (lambda f: (f / WEIGHTS_FILE).unlink(), WEIGHTS_FILE, ["is missing"]),
    "config truncated": (cut_file(CONFIG_FILE, 0.5), CONFIG_FILE, ["not readable as JSON"]),
    "config key missing": (edit_config(lambda c: pop(c, "data", "target_scaler")), CONFIG_FILE,
                           ["['target_scaler'] missing in data"]),
    "config key with a default missing": (edit_config(lambda c: pop(c, "data", "time_format")), CONFIG_FILE,
                                          ["['time_format'] missing in data"]),  # written always: required
    "config top key missing": (edit_config(lambda c: pop(c, "task_class")), CONFIG_FILE,
                               ["['task_class'] missing"]),
    "config hparam missing": (edit_config(lambda c: pop(c, "hparams", "d_target")), CONFIG_FILE,
                              ["['d_target'] missing in hparams"]),
    "config wrong type": (edit_config(lambda c: c["data"].update(context_len="30")), CONFIG_FILE,
                          ["data.context_len is a string ('30'), expected int"]),
    "config wrong type in a list": (
        edit_config(lambda c: c["data"]["target_scaler"]["scale"].__setitem__(1, "x")), CONFIG_FILE,
        ["data.target_scaler.scale[1] is a string ('x'), expected float"],
    ),
    "config wrong hparam type": (edit_config(lambda c: c["hparams"].update(d_known=None)), CONFIG_FILE,
                                 ["hparams.d_known is null, expected int"]),
    "config extra key": (edit_config(lambda c: c["data"].update(colour="red")), CONFIG_FILE,
                         ["unknown key(s) ['colour'] in data"]),
    "config extra hparam": (edit_config(lambda c: c["hparams"].update(colour="red")), CONFIG_FILE,
                            ["unknown key(s) ['colour'] in hparams"]),
    "config not a task": (edit_config(lambda c: c.update(task_class="os.system")), CONFIG_FILE,
                          ["task_class 'os.system' is not a task"]),
    "config not an object": (lambda f: (f / CONFIG_FILE).write_text("[1, 2]"), CONFIG_FILE,
                             ["the file is a list, expected an object"]),
    "config of a later format": (edit_config(lambda c: c.update(format="forecaster-4", new_part={})), CONFIG_FILE,
                                 ["format 'forecaster-4' is newer than this tsformer reads (forecaster-3)"]),
    "config of an older format": (edit_config(lambda c: c.update(format="forecaster-1")), CONFIG_FILE,
                                  ["is older than this tsformer reads (forecaster-2 to forecaster-3)",
                                   "train the model again"]),
    "config of an unknown kind": (edit_config(lambda c: c.update(format="regressor-1")), CONFIG_FILE,
                                  ["format 'regressor-1' is no kind of model folder this tsformer reads",
                                   "anomaly, classifier, ensemble, forecaster"]),
    "config of another kind": (edit_config(lambda c: c.update(format="anomaly-2")), CONFIG_FILE,
                               ["unknown key(s) ['calendar', ", "in data"]),  # an anomaly model's data
    "config without a format": (edit_config(lambda c: pop(c, "format")), CONFIG_FILE,
                                ["no format, not the header of a tsformer model folder"]),
}  # fmt: skip

# name -> (change of tsformer.json, words): lists whose length follows from the column roles, and
# the network's sizes, which must be the contract's
INCONSISTENT = {
    "target scale one short": (lambda c: c["data"]["target_scaler"]["scale"].pop(),
                               ["data.target_scaler.scale has 1 number(s)", "dynamic_pressure"]),
    "target offset one extra": (lambda c: c["data"]["target_scaler"]["offset"].append(0.0),
                                ["data.target_scaler.offset has 3 number(s)"]),
    "covariate scale one short": (lambda c: c["data"]["covariate_scaler"]["scale"].pop(),
                                  ["data.covariate_scaler.scale has 2 number(s)", "supply_voltage"]),
    "past-only column dropped": (lambda c: c["data"].update(observed_cols=[]),
                                 ["data.covariate_scaler.scale has 3 number(s)"]),
    "static scale one extra": (lambda c: c["data"]["static_scaler"]["scale"].append(1.0),
                               ["data.static_scaler.scale has 2 number(s)", "rated_kw"]),
    "static scaler missing": (lambda c: c["data"].update(static_scaler=None),
                              ["data.static_scaler is null", "rated_kw"]),
    "static category dropped": (lambda c: c["data"]["static_vocabularies"]["kind"].pop(),
                                ["hparams.static_vocab_sizes is [3], but data makes it [2]"]),
    "static vocabulary of another column": (lambda c: c["data"].update(static_vocabularies={"site": ["A"]}),
                                            ["data.static_vocabularies", "['kind']"]),
    "target column added": (lambda c: c["data"]["target_cols"].append("vibration"),
                            ["data.target_scaler.scale has 2 number(s)", "vibration"]),
    "calendar feature added": (lambda c: c["data"]["calendar"].append("dayofweek"),
                               ["hparams.d_known is 2, but data makes it 4"]),
    "network of another width": (lambda c: c["hparams"].update(d_target=3),
                                 ["hparams.d_target is 3, but data makes it 2"]),
    "window of another length": (lambda c: c["data"].update(context_len=31),
                                 ["hparams.context_len is 30, but data makes it 31"]),
    "zero scale": (lambda c: c["data"]["target_scaler"]["scale"].__setitem__(0, 0.0),
                   ["data.target_scaler.scale", "above 0"]),
    "unknown calendar feature": (lambda c: c["data"].update(calendar=["week"]), ["data.calendar", "'week'"]),
}  # fmt: skip


def refused(folder: Path, data: Path, capsys) -> str:
    """The message of `load_model(folder)`, checked to be one line and what predict.py prints."""
    with pytest.raises(ModelFolderError) as err:
        load_model(folder)
    message = str(err.value)
    assert "\n" not in message
    assert predict.main([str(folder), str(data), "--output", str(folder / "out.csv")]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not (folder / "out.csv").exists()
    return message


@pytest.mark.parametrize("case", list(DAMAGES))
def test_damaged_model_folder_is_refused_in_one_line(case, saved, tmp_path, capsys):
    folder, data = saved
    damage, at_fault, words = DAMAGES[case]
    copy = shutil.copytree(folder, tmp_path / "model")
    Forecaster.load(copy)  # the copy is sound before the damage
    damage(copy)
    message = refused(copy, data, capsys)
    for word in [str(copy / at_fault), *words]:
        assert word in message, (word, message)


@pytest.mark.parametrize("case", list(INCONSISTENT))
def test_model_folder_whose_lists_do_not_fit_its_columns_is_refused(case, saved, tmp_path, capsys):
    """A target scale list of the wrong length forecast wrong numbers (exit 0) before it was checked."""
    folder, data = saved
    change, words = INCONSISTENT[case]
    copy = shutil.copytree(folder, tmp_path / "model")
    edit_config(change)(copy)
    message = refused(copy, data, capsys)
    for word in [str(copy / CONFIG_FILE), *words]:
        assert word in message, (word, message)


def test_sound_model_folder_loads_and_forecasts(saved, tmp_path):
    """The checks pass a folder as training writes it (so the refusals above are the damage's)."""
    folder, data = saved
    out = tmp_path / "forecasts.csv"
    origin = pd.read_csv(data).time.iloc[400]  # mid-table: the horizon's rows follow
    assert predict.main([str(folder), str(data), "--output", str(out), "--origin", origin]) == 0
    assert pd.read_csv(out).y_pred.notna().all()
