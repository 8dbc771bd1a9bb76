"""Every kind of model folder is checked alike before a network is built (`tsformer.model_folder`): a
hostile or damaged `tsformer.json` is one line naming the file and the key, and settings that describe
another (or a huge) network are refused from the weights' shapes without allocating it. Each case
damages a copy of a folder written by an older tsformer (tests/fixtures); no training. Also: the time
format a run read its file with, given or inferred, is what its model folder keeps."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, CountAllocations
from tsformer import model_folder, predict
from tsformer.data.datamodule import TimeSeriesDataModule
from tsformer.jobs import load_model
from tsformer.jobs.classification.classifier import FOLDER as CLASSIFIER
from tsformer.jobs.classification.classifier import ClassifierContract
from tsformer.jobs.forecasting.forecaster import DataContract
from tsformer.model_folder import CONFIG_FILE, WEIGHTS_FILE, ModelFolderError, Upgrade

FIXTURES = REPO / "tests" / "fixtures"
KINDS = ["forecaster_v2", "classifier_1", "anomaly_1"]  # folders of a network (an ensemble has none)


def copy_of(name: str, tmp_path: Path) -> Path:
    return shutil.copytree(FIXTURES / name, tmp_path / name)


def edit(folder: Path, change) -> None:
    path = folder / CONFIG_FILE
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def refused(folder: Path, name: str, capsys) -> str:
    """The one-line message of loading `folder`, as predict.py prints it (exit 2, nothing written)."""
    with pytest.raises(ModelFolderError) as err:
        load_model(folder)
    message = str(err.value)
    assert "\n" not in message
    out = folder.parent / "out.csv"
    assert predict.main([str(folder), str(FIXTURES / f"{name}_input.csv"), "--output", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not out.exists()
    return message


def set_data(key, value):
    return lambda c: c["data"].update({key: value})


def set_hparam(key, value):
    return lambda c: c["hparams"].update({key: value})


# (kind, change of tsformer.json, words the message holds besides the file's path)
CASES = {
    "classes not a list": ("classifier_1", set_data("classes", 3), ["data.classes is a number (3)"]),
    "context_len as text": ("classifier_1", set_data("context_len", "60"), ["data.context_len is a string"]),
    "context_len negative": ("classifier_1", set_data("context_len", -5), ["data.context_len is -5"]),
    "one-number scaler": (
        "classifier_1",
        lambda c: c["data"]["channel_scaler"].update(scale=[1.0], offset=[0.0]),
        ["data.channel_scaler.scale has 1 number(s)"],
    ),
    "zero scale": (
        "classifier_1",
        lambda c: c["data"]["channel_scaler"]["scale"].__setitem__(0, 0.0),
        ["data.channel_scaler.scale", "above 0"],
    ),
    "classes of another model": (
        "classifier_1",
        set_data("classes", ["a", "b", "c"]),
        ["hparams.classes is ['c0', 'c1', 'c2'], but data makes it ['a', 'b', 'c']"],
    ),
    "a channel more": (
        "classifier_1",
        lambda c: c["data"].update(channel_cols=["ch0", "ch1", "ch2"]),
        ["data.channel_scaler.scale has 2 number(s)"],
    ),
    "unknown layout": ("classifier_1", set_data("layout", "grid"), ["data.layout is 'grid'"]),
    "classifier key missing": (
        "classifier_1",
        lambda c: c["data"].pop("label_col"),
        ["['label_col'] missing"],
    ),
    "classifier extra hparam": ("classifier_1", set_hparam("colour", "red"), ["unknown key(s) ['colour']"]),
    "classifier hparam of a wrong type": (
        "classifier_1",
        set_hparam("lr", "fast"),
        ["hparams.lr is a string"],
    ),
    "classifier of another format": (
        "classifier_1",
        lambda c: c.update(format="classifier-9"),
        ["'classifier-9'"],
    ),
    "forecaster hparam of a wrong type": (
        "forecaster_v2",
        set_hparam("lr", "fast"),
        ["hparams.lr is a string"],
    ),
    "forecaster context_len as text": ("forecaster_v2", set_data("context_len", "12"), ["data.context_len"]),
    "anomaly label column a number": (
        "anomaly_1",
        set_data("label_col", 3),
        ["data.label_col is a number (3)"],
    ),
    "anomaly channels unnamed": ("anomaly_1", set_hparam("target_names", []), ["hparams.target_names"]),
    "ensemble member outside": (
        "ensemble_0",
        lambda c: c.update(members=["../classifier_1"]),
        ["'members' must name the member folders inside"],
    ),
    "ensemble without members": ("ensemble_0", lambda c: c.update(members=[]), ["'members'"]),
    "ensemble of another task": (
        "ensemble_0",
        lambda c: c.update(task_class="tsformer.tasks.pretraining.MaskedPretraining"),
        ["is not a task of a classifier ensemble"],
    ),
    "ensemble with hparams": ("ensemble_0", lambda c: c.update(hparams={}), ["unknown key(s) ['hparams']"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_or_damaged_folder_is_refused_in_one_line(case, tmp_path, capsys):
    name, change, words = CASES[case]
    folder = copy_of(name, tmp_path)
    load_model(folder)  # sound before the damage
    edit(folder, change)
    message = refused(folder, name, capsys)
    for word in [str(folder / CONFIG_FILE), *words]:
        assert word in message, (word, message)


# d_model -> (the file at fault, words): 1024 gives the shapes of a network that could exist (tens of
# millions of numbers); 10**9 one whose sizes overflow even on the meta device
LARGER = {1024: (WEIGHTS_FILE, "of another shape"), 10**9: (CONFIG_FILE, "hparams do not build a network")}


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("d_model", list(LARGER))
def test_settings_of_a_larger_network_are_refused_from_the_weights_shapes_without_building_it(
    name, d_model, tmp_path, capsys
):
    """The fixtures' weights are 8 wide; settings making them wider are refused before a network of
    that size exists."""
    folder = copy_of(name, tmp_path)
    edit(folder, lambda c: c["hparams"]["net"].update(d_model=d_model))
    with CountAllocations() as counted, pytest.raises(ModelFolderError) as err:
        load_model(folder)
    assert counted.elements < 200_000, counted.elements  # the fixture's own weights are ~10k numbers
    message = str(err.value)
    at_fault, words = LARGER[d_model]
    assert str(folder / at_fault) in message and words in message, message
    assert refused(folder, name, capsys) == message


def test_the_model_folder_keeps_the_time_format_training_inferred(tmp_path):
    """Day-first dates without a data.time_format: the folder says how they were read, so that a new
    table whose dates could be read either way is read as the training file was."""
    times = pd.date_range("2024-01-10", periods=300, freq="h")
    frame = pd.DataFrame(
        {"time": times.strftime("%d/%m/%Y %H:%M"), "y": range(300), "x": [i % 7 for i in range(300)]}
    )
    dm = TimeSeriesDataModule(
        frame, target_cols=["y"], known_cols=["x"], context_len=12, horizon=4, name="dates"
    )
    dm.setup()
    assert DataContract.of(dm).time_format == "%d/%m/%Y %H:%M"
    iso = frame.assign(time=times.strftime("%Y-%m-%d %H:%M:%S"))
    dm = TimeSeriesDataModule(iso, target_cols=["y"], known_cols=["x"], context_len=12, horizon=4, name="iso")
    dm.setup()
    assert DataContract.of(dm).time_format == "%Y-%m-%d %H:%M:%S"
    given = TimeSeriesDataModule(
        frame, target_cols=["y"], known_cols=["x"], context_len=12, horizon=4, time_format="%d/%m/%Y %H:%M"
    )
    given.setup()
    assert DataContract.of(given).time_format == "%d/%m/%Y %H:%M"


@dataclass
class WithTemperature(ClassifierContract):
    temperature: float = 1.0  # a field a later classifier folder holds


def test_a_field_added_with_a_version_bump_reads_the_older_folders_with_its_upgrade(tmp_path):
    """The way docs/architecture.md says a kind grows a field: the field in the contract, the version one
    up, an `Upgrade` from the version before. Folders of every older version read as the newest (the
    chain of upgrades); one of the new version without the field is refused, naming it."""
    add = Upgrade(config=lambda c: {**c, "data": {**c["data"], "temperature": 1.0}})
    later = replace(CLASSIFIER, version=CLASSIFIER.version + 1, contract=WithTemperature,
                    upgrades={**CLASSIFIER.upgrades, CLASSIFIER.version: add})  # fmt: skip
    assert later.oldest == 1
    contract = model_folder.read(FIXTURES / "classifier_1", later)[1]  # classifier-1 -> 2 -> 3 -> 4
    assert isinstance(contract, WithTemperature) and contract.temperature == 1.0
    folder = copy_of("classifier_1", tmp_path)
    edit(folder, lambda c: c.update(format=later.format))
    with pytest.raises(ModelFolderError, match=r"\['calibration', 'temperature'\] missing in data"):
        model_folder.read(folder, later)
    with pytest.raises(ModelFolderError, match=r"format 'classifier-4' is newer than this tsformer reads"):
        model_folder.read(folder, CLASSIFIER)  # the tsformer before the field
