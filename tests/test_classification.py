"""Sequence classification: padding and masking, the data contract's refusals, the baselines' features,
the model folder and predict.py, the config dispatch; a train.py run (slow) and the archive sets
(needs_data)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import REPO
from tsformer import predict
from tsformer.data.schema import DataValidationError
from tsformer.data.sequences import SequenceDataModule, StreamDataModule, pad_batch
from tsformer.jobs import JOBS, job_of_folder
from tsformer.jobs.base import csv_file
from tsformer.jobs.classification.classifier import Classifier, save_classifier_folder
from tsformer.jobs.classification.job import write_outputs
from tsformer.jobs.forecasting.forecaster import ModelInfo
from tsformer.jobs.forecasting.job import FORECASTS_FILE
from tsformer.serving.predictor import Predictor
from tsformer.settings import SettingError
from tsformer.tasks.classification import ClassificationTask, summary_features
from tsformer.train import build_task, compose_config

NET = {"d_model": 16, "n_heads": 2, "n_layers": 2, "positional": "sinusoidal"}
ARCHIVE = REPO.parent / "shared" / "data" / "classification"


def sequences_table(n_series=12, n_classes=3, lengths=(5, 12), channels=2, seed=0) -> pd.DataFrame:
    """Series of random lengths, each a noisy level set by its class."""
    rng = np.random.default_rng(seed)
    rows = []
    for sid in range(n_series):
        label = f"c{sid % n_classes}"
        T = int(rng.integers(lengths[0], lengths[1] + 1))
        values = rng.normal(sid % n_classes, 0.3, size=(T, channels))
        for t in range(T):
            rows.append({"series_id": sid, "step": t, **{f"ch{j}": values[t, j] for j in range(channels)}})
            rows[-1]["label"] = label
    return pd.DataFrame(rows)


def task(pooling="cls", revin=False, d_in=2, n_classes=3, **net) -> ClassificationTask:
    torch.manual_seed(0)
    classes = [f"c{i}" for i in range(n_classes)]
    return ClassificationTask({**NET, **net}, d_in=d_in, classes=classes, pooling=pooling, revin=revin).eval()


def probabilities(model, samples: list[torch.Tensor]) -> torch.Tensor:
    items = [{"x": x, "label": torch.tensor(0), "sample": torch.tensor(i)} for i, x in enumerate(samples)]
    with torch.no_grad():
        return model.predict_proba(pad_batch(items))  # (B, C)


# -- padding: a sample's probabilities are its own -------------------------------------------------------


@pytest.mark.parametrize("pooling, revin, positional", [("cls", False, "sinusoidal"), ("mean", True, "rope")])
def test_a_short_sample_alone_and_padded_among_longer_ones_gets_the_same_probabilities(
    pooling, revin, positional
):
    g = torch.Generator().manual_seed(1)
    short = torch.randn(7, 2, generator=g)  # JapaneseVowels-like: 7 steps among sequences of up to 29
    longer = [torch.randn(n, 2, generator=g) for n in (29, 18)]
    model = task(pooling, revin, positional=positional)
    alone = probabilities(model, [short])[0]
    in_batch = probabilities(model, [longer[0], short, longer[1]])[1]
    assert torch.allclose(alone, in_batch, atol=1e-5), (alone, in_batch)
    # never reads another sample: other samples changed, the short one's probabilities are not
    other = probabilities(model, [longer[0] * 5 + 3, short, longer[1].flip(0)])[1]
    assert torch.allclose(alone, other, atol=1e-5)


def test_padded_steps_are_never_read():
    """Garbage in the padded steps (instead of zeros) changes nothing."""
    model = task("mean")
    x = torch.randn(2, 10, 2)
    valid = torch.zeros(2, 10, dtype=torch.bool)
    valid[0, :4], valid[1] = True, True
    noisy = x.clone()
    noisy[0, 4:] = 1e3
    with torch.no_grad():
        assert torch.allclose(model(x, valid), model(noisy, valid), atol=1e-5)


def test_patches_refuse_padded_batches_with_a_setting_message():
    model = task()
    model.hparams.patch_len = 4  # a patched model given sequences of unequal length
    with pytest.raises(ValueError, match="patch_len=4: patch tokens need sequences of one length"):
        probabilities(model, [torch.randn(5, 2), torch.randn(9, 2)])


# -- the data contract ----------------------------------------------------------------------------------


def test_sequences_are_one_sample_each_and_no_val_or_test_series_is_dropped():
    table = sequences_table(n_series=30)
    dm = SequenceDataModule(table, test_fraction=0.2, val_fraction=0.25, seed=3)
    dm.setup()
    ids = [set(dm.sample_info(s).series_id) for s in ("train", "val", "test")]
    assert sum(map(len, ids)) == 30 and set.union(*ids) == set(range(30))
    assert dm.classes == ["c0", "c1", "c2"] and dm.d_in == 2
    for split in ("train", "val", "test"):  # stratified: every class in every split
        assert set(dm.labels(split)) == {0, 1, 2}
    n_batched = sum(len(b["label"]) for b in dm.test_dataloader())
    assert n_batched == len(ids[2])
    # scaled with the training series only: their channels have mean 0
    train_rows = np.concatenate(dm.datasets["train"].samples)
    assert np.allclose(train_rows.mean(axis=0), 0, atol=1e-5)


def test_under_ddp_each_val_and_test_sample_is_evaluated_by_one_process():
    """Two processes' val/test loaders together hold every sample once (Lightning's sampler would
    repeat samples to even out the processes)."""
    dm = SequenceDataModule(sequences_table(n_series=30), test_fraction=0.2, val_fraction=0.25, seed=3)
    dm.setup()
    for split, loader in (("val", dm.val_dataloader), ("test", dm.test_dataloader)):
        seen = []
        for rank in (0, 1):
            dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
            seen += [int(i) for i in loader().sampler]
        del dm.trainer
        assert sorted(seen) == list(range(len(dm.datasets[split])))


def test_class_order_orders_the_classes_and_must_hold_every_training_class():
    table = sequences_table()
    dm = SequenceDataModule(table, test_fraction=0.3, class_order=["c2", "c0", "c1", "c5"])
    dm.setup()
    assert dm.classes == ["c2", "c0", "c1"]  # c5: no training sample
    names = np.asarray(dm.classes)[dm.labels("train")]  # each code names the series' own label
    truth = table.groupby("series_id").label.first()[dm.sample_info("train").series_id]
    assert (names == truth.to_numpy()).all()
    with pytest.raises(DataValidationError, match=r"class\(es\) \['c1'\] of the training samples are not in"):
        SequenceDataModule(table, test_fraction=0.3, class_order=["c2", "c0"]).setup()


def test_a_label_that_changes_inside_a_series_is_refused_naming_series_and_rows(tmp_path):
    table = sequences_table()
    rows = table.index[table.series_id == 4]
    table.loc[rows[3], "label"] = "c9"
    path = tmp_path / "train.csv"
    table.to_csv(path, index=False)
    with pytest.raises(DataValidationError) as err:
        SequenceDataModule(str(path), test_fraction=0.3).setup()
    message = str(err.value)
    assert "\n" not in message
    assert "series 4 changes its label from 'c1'" in message
    assert f"row {rows[3]} (line {rows[3] + 2})" in message and f"row {rows[2]}" in message


def test_an_unseen_class_in_the_test_file_is_named():
    train, test = sequences_table(), sequences_table(n_series=4, seed=1)
    test.loc[test.series_id == 2, "label"] = "c7"
    dm = SequenceDataModule(train, test.assign(extra=1.0))  # a column the train table has not: ignored
    with pytest.raises(DataValidationError, match=r"series 2 has label 'c7', a class the training") as err:
        dm.setup()
    assert "\n" not in str(err.value)
    assert dm.datasets == {} and dm.channel_names == ["ch0", "ch1"]  # a failed setup leaves no split


def test_stream_windows_are_labelled_by_their_last_step_and_an_unseen_class_is_named():
    n = 400
    times = pd.date_range("2024-01-01", periods=n, freq="min")
    phase = np.where(np.arange(n) % 100 < 50, "idle", "run")
    table = pd.DataFrame({"time": times, "a": np.sin(np.arange(n)), "b": np.arange(n) % 100, "phase": phase})
    dm = StreamDataModule(table, channel_cols=["a", "b"], label_col="phase", context_len=10)
    dm.setup()
    info = dm.sample_info("test")
    expected = table.set_index("time").loc[info.window_end_time, "phase"].to_numpy()
    assert (np.asarray(dm.classes)[dm.labels("test")] == expected).all()
    assert len(info) == len(dm.windows.datasets["test"])  # every test window
    table.loc[n - 5 :, "phase"] = "fault"  # only in the test period
    with pytest.raises(DataValidationError, match=r"test window ending .* has label 'fault'"):
        StreamDataModule(table, channel_cols=["a", "b"], label_col="phase", context_len=10).setup()


def test_a_streams_logs_name_its_own_columns_only(caplog):
    """The label travels through the windows as a code: no log line names it, or the label column as
    a column without a role (a user's other unused column is still named, once)."""
    n = 200
    times = pd.date_range("2024-01-01", periods=n, freq="min")
    phase = np.where(np.arange(n) % 50 < 25, "idle", "run")
    table = pd.DataFrame({"time": times, "a": np.sin(np.arange(n)), "phase": phase, "note": 1.0})
    with caplog.at_level(logging.INFO):
        StreamDataModule(table, channel_cols=["a"], label_col="phase", context_len=10).setup()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "__" not in text and "'phase'" not in text
    assert text.count("['note'] have no role") == 1


def test_summary_features_use_the_real_steps_only():
    x = np.zeros((1, 5, 1))
    x[0, :3, 0] = [1.0, 3.0, 5.0]  # then two padded steps
    valid = np.array([[True, True, True, False, False]])
    mean, std, low, high, last, slope = summary_features(x, valid)[0]
    assert (mean, low, high, last, slope) == (3.0, 1.0, 5.0, 5.0, 2.0)
    assert np.isclose(std, np.std([1.0, 3.0, 5.0]))


def test_balanced_class_weights_are_inverse_shares():
    model = ClassificationTask(NET, 2, ["a", "b"], class_weights="balanced", class_counts=[30, 10])
    assert torch.allclose(model.weight, torch.tensor([40 / 60, 40 / 20]))


# -- the model folder, predict.py, the dispatch ---------------------------------------------------------


def test_model_folder_and_predict_py_give_the_tasks_probabilities(tmp_path, capsys):
    train, test = sequences_table(), sequences_table(n_series=6, seed=2)
    dm = SequenceDataModule(train, test)
    dm.setup()
    model = ClassificationTask(NET, dm.d_in, dm.classes).eval()
    folder = save_classifier_folder(tmp_path / "model", model, dm, ModelInfo("enc_only_classifier", "x"))
    assert job_of_folder(folder) is JOBS["classification"]
    with torch.no_grad():
        expected = torch.cat([model.predict_proba(b) for b in dm.test_dataloader()]).numpy()
    test_csv = tmp_path / "test.csv"
    test.drop(columns="label").to_csv(test_csv, index=False)  # new data: no labels
    assert predict.main([str(folder), str(test_csv), "--output", str(tmp_path / "classes.csv")]) == 0
    got = pd.read_csv(tmp_path / "classes.csv")
    assert list(got.columns) == ["series_id", "y_true", "y_pred", "p_c0", "p_c1", "p_c2"]
    assert np.abs(got[["p_c0", "p_c1", "p_c2"]].to_numpy() - expected).max() <= 1e-5
    assert (got.y_pred == np.asarray(dm.classes)[expected.argmax(axis=1)]).all()
    assert "6 samples" in capsys.readouterr().out
    loaded = Classifier.load(folder).predict(test.assign(label=test.label.where(test.series_id != 1, "zz")))
    assert loaded.y_true.tolist()[1] == "zz"  # an unknown label is kept in y_true (and named in a warning)


def test_the_classifier_config_builds_for_sequence_data_and_refuses_window_data(tmp_path):
    cfg = compose_config(
        ["experiment=plant_regime", "data.source.n_series=3", "data.source.n_steps=600"], tmp_path
    )
    dm = instantiate(cfg.data)
    dm.setup()
    built = build_task(cfg.model, dm)
    assert isinstance(built, ClassificationTask) and built.hparams.classes == dm.classes
    assert cfg.callbacks.model_checkpoint.monitor == "val/loss"
    assert compose_config([], tmp_path).callbacks.model_checkpoint.monitor == "val/mse"  # the default's
    cfg = compose_config(["model=enc_dec"], tmp_path)  # a forecaster given the plant_regime stream
    with pytest.raises(SettingError, match="EncoderDecoderForecaster does not take the data of data=plant_"):
        build_task(cfg.model, dm)


def test_write_outputs_writes_every_test_sample_and_an_example_the_folder_answers_alike(tmp_path):
    """The classes CSV holds every test sample, in the layout predict.py writes; the example (the pyfunc
    model's signature) is answered by the model folder as the CSV says."""
    train, test = sequences_table(), sequences_table(n_series=5, seed=4)
    dm = SequenceDataModule(train, test)
    dm.setup()
    model = ClassificationTask(NET, dm.d_in, dm.classes).eval()
    with torch.no_grad():
        proba = torch.cat([model.predict_proba(b) for b in dm.test_dataloader()]).double().numpy()
    model.test_outputs = {"proba": proba, "true": dm.labels("test")}
    cfg = OmegaConf.create({"paths": {"output_dir": str(tmp_path)}, "forecasts_file": "classes.csv"})
    outputs = write_outputs(cfg, model, dm, None)
    csv = pd.read_csv(outputs.csv_path)
    assert len(csv) == 5 and csv.y_true.tolist() == test.groupby("series_id").label.first().tolist()
    answered = Predictor.of_folder(outputs.model_folder).predict(outputs.example)
    merged = answered.merge(csv, on="series_id", suffixes=("", "_csv"))
    assert len(merged) == 3
    assert (
        np.abs(
            merged[[f"p_{c}" for c in dm.classes]].to_numpy()
            - merged[[f"p_{c}_csv" for c in dm.classes]].to_numpy()
        ).max()
        <= 1e-5
    )


@pytest.mark.parametrize("overrides", [["model=random_kernel_ridge"], ["model=enc_only_classifier"]])
def test_a_classifier_run_without_an_experiment_writes_classes_csv_as_the_docs_name_it(overrides, tmp_path):
    """`python train.py model=<a classifier> data=...`: forecasts_file's default is the job's own name,
    classes.csv (docs/classification.md, the summary's usage line), not the forecasts' name; a name given
    is kept and null writes none."""
    dm = SequenceDataModule(sequences_table(), sequences_table(n_series=5, seed=4))
    dm.setup()
    model = ClassificationTask(NET, dm.d_in, dm.classes).eval()
    with torch.no_grad():
        proba = torch.cat([model.predict_proba(b) for b in dm.test_dataloader()]).double().numpy()
    model.test_outputs = {"proba": proba, "true": dm.labels("test")}
    cfg = compose_config([*overrides, "data=sequences"], tmp_path / "run")
    assert write_outputs(cfg, model, dm, None).csv_path == tmp_path / "run" / "classes.csv"
    cfg.forecasts_file = "mine.csv"
    assert write_outputs(cfg, model, dm, None).csv_path.name == "mine.csv"
    cfg.forecasts_file = None
    assert write_outputs(cfg, model, dm, None).csv_path is None
    for experiment in ("plant_regime", "osuleaf"):  # the experiments take the job's name too
        assert (
            csv_file(compose_config([f"experiment={experiment}"], tmp_path), "classes.csv") == "classes.csv"
        )
    assert csv_file(compose_config([], tmp_path), FORECASTS_FILE) == "forecasts.csv"  # a forecaster's


# -- the archive sets -----------------------------------------------------------------------------------


@pytest.mark.needs_data(ARCHIVE / "BasicMotions", ARCHIVE / "JapaneseVowels")
@pytest.mark.parametrize(
    "experiment, n_train, n_test, channels, classes, lengths",
    [("basic_motions", 40, 40, 6, 4, (100, 100)), ("japanese_vowels", 270, 370, 12, 9, (7, 29))],
)
def test_archive_sets_are_read_with_their_split(
    experiment, n_train, n_test, channels, classes, lengths, tmp_path
):
    cfg = compose_config([f"experiment={experiment}"], tmp_path)
    dm = instantiate(cfg.data)
    dm.setup()
    assert len(dm.datasets["train"]) + len(dm.datasets["val"]) == n_train
    assert len(dm.datasets["test"]) == n_test
    assert dm.d_in == channels and dm.n_classes == classes
    every = [len(x) for s in ("train", "val", "test") for x in dm.datasets[s].samples]
    assert (min(every), max(every)) == lengths


@pytest.mark.needs_data(ARCHIVE / "JapaneseVowels")
def test_a_japanese_vowels_sample_alone_and_among_the_longest(tmp_path):
    dm = SequenceDataModule(
        str(ARCHIVE / "JapaneseVowels" / "JapaneseVowels_TRAIN_long.csv"), test_fraction=0.2
    )
    dm.setup()
    samples = [torch.as_tensor(x) for x in dm.datasets["test"].samples]
    lengths = [len(x) for x in samples]
    short, longest = int(np.argmin(lengths)), int(np.argmax(lengths))
    model = ClassificationTask(NET, dm.d_in, dm.classes, pooling="mean").eval()
    alone = probabilities(model, [samples[short]])[0]
    among = probabilities(model, [samples[longest], samples[short], *samples[:20]])[1]
    assert torch.allclose(alone, among, atol=1e-5)
