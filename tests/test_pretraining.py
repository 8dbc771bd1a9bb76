"""Masked pre-training of a classifier's encoder (`pretrain=masked`, `tasks/pretraining.py`) and
`data.label_fraction`: masks never score padding, the labelled share per class, a tiny pre-training run
whose model `init_from` loads into a classifier (slow)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from test_classification import NET, sequences_table
from tsformer import init_from
from tsformer.data.sequences import SequenceDataModule, StreamDataModule, pad_batch
from tsformer.data.simulators import simulate_plant_regimes
from tsformer.jobs.classification.classifier import Classifier
from tsformer.jobs.forecasting.forecaster import WEIGHTS_FILE
from tsformer.jobs.pretraining.job import fine_tune_command
from tsformer.settings import SettingError, check
from tsformer.tasks.classification import ClassificationTask
from tsformer.tasks.pretraining import MaskedPretraining
from tsformer.train import build_task, compose_config, run

TINY_SEQ = [
    "model=enc_only_classifier",
    "data=sequences",
    "model.net.d_model=16",
    "model.net.n_heads=2",
    "model.net.n_layers=1",
    "model.warmup_steps=2",
    "trainer.max_epochs=2",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "data.batch_size=8",
]


def padded_batch(lengths=(4, 9, 6), channels=2, fill=0.0, seed=0) -> dict:
    """Samples of unequal `lengths`, padded; the padded steps hold `fill`."""
    g = torch.Generator().manual_seed(seed)
    items = [
        {"x": torch.randn(T, channels, generator=g), "label": torch.tensor(0), "sample": torch.tensor(i)}
        for i, T in enumerate(lengths)
    ]
    batch = pad_batch(items)
    batch["x"] = torch.where(batch["valid"].unsqueeze(-1), batch["x"], fill)
    return batch


def pretraining(**options) -> MaskedPretraining:
    torch.manual_seed(0)
    return MaskedPretraining(NET, d_in=2, mask_ratio=0.5, **options)


# -- masks on padded sequences ------------------------------------------------------------------------


@pytest.mark.parametrize("interpolate_hidden", [False, True])
def test_masks_never_hide_or_score_padding_and_padded_values_change_nothing(interpolate_hidden):
    task = pretraining(interpolate_hidden=interpolate_hidden).train()
    batch = padded_batch()
    torch.manual_seed(1)
    hidden = task.hidden_of(batch, None)  # (B, T, D)
    assert hidden.any() and not (hidden & ~batch["valid"].unsqueeze(-1)).any()
    _, _, scored = task.restore(batch, hidden)
    assert torch.equal(scored, hidden)
    task.eval()  # no dropout: the same fill twice
    with torch.no_grad():
        out, _, scored = task.restore(batch, hidden)
        other_out, _, _ = task.restore(padded_batch(fill=1e3), hidden)
    torch.testing.assert_close(out[scored], other_out[scored])  # padding is never read
    entered = task.entered(batch["x"], batch["valid"], hidden)
    assert not entered[hidden].any() or interpolate_hidden
    assert not entered[~batch["valid"]].any()


def test_patch_tokens_restore_their_patches_values_and_refuse_padding():
    task = pretraining(patch_len=4, patch_stride=2).eval()
    batch = padded_batch(lengths=(12, 12))
    hidden = task.hidden_of(batch, None)
    out, true, scored = task.restore(batch, hidden)
    assert out.shape == true.shape == scored.shape == (2, 6, 4 * 2)  # (12 - 4) // 2 + 2 patches of 4 x 2
    with pytest.raises(ValueError, match="patch tokens need sequences of one length"):
        task.restore(padded_batch(lengths=(12, 8)), task.hidden_of(padded_batch(lengths=(12, 8)), None))


@pytest.mark.parametrize("patch_len", [None, 4])
def test_a_classifier_takes_the_blocks_positions_and_input_projection_not_the_head(patch_len):
    net = {**NET, "positional": "learned", "max_len": 64}
    patches = {"patch_len": patch_len, "patch_stride": patch_len}
    torch.manual_seed(0)
    source_task = MaskedPretraining(net, d_in=2, **patches)
    classifier = ClassificationTask(net, d_in=2, classes=["a", "b"], **patches)
    fresh = {k: v.clone() for k, v in classifier.state_dict().items()}
    # moved off any initialisation (norms start at 1 in both tasks)
    state = {k: v + torch.rand_like(v) for k, v in source_task.state_dict().items()}
    source = init_from.Source("folder", "folder", None, source_task, state, None)
    parts = init_from.load_into(classifier, source)
    loaded = classifier.state_dict()
    shared = [k for k in loaded if k.startswith(("net.encoder.", "net.positional.", "net.input_proj."))]
    assert sorted(parts["taken"]) == sorted(shared)
    assert any(k.startswith("net.input_proj.") for k in shared)
    for key in shared:
        assert torch.equal(loaded[key], state[key]) and not torch.equal(fresh[key], state[key]), key
    for key in parts["fresh"]:  # the class head, class weights: the classifier's own
        assert not key.startswith(("net.encoder.", "net.input_proj.")) and torch.equal(
            loaded[key], fresh[key]
        )


# -- data.label_fraction ----------------------------------------------------------------------------------


def sequences(**options) -> SequenceDataModule:
    dm = SequenceDataModule(sequences_table(n_series=60, n_classes=3), seed=3, **options)
    dm.setup()
    return dm


def test_label_fraction_keeps_the_share_of_each_class_and_leaves_val_and_test_alone():
    every, part, pre = (
        sequences(),
        sequences(label_fraction=0.25),
        sequences(label_fraction=0.25, pretraining=True),
    )
    all_labels = every.labels("train")
    for c in range(every.n_classes):
        assert (part.labels("train") == c).sum() == max(1, round((all_labels == c).sum() * 0.25))
    assert len(part.sample_info("train")) == len(part.labels("train"))
    assert set(part.sample_info("train").series_id) < set(every.sample_info("train").series_id)
    for split in ("val", "test"):
        assert part.sample_info(split).equals(every.sample_info(split))
        assert np.array_equal(part.labels(split), every.labels(split))
        for a, b in zip(part.datasets[split].samples, every.datasets[split].samples, strict=True):
            assert np.array_equal(a, b)
    # pre-training reads every training sample's values, scaled as the classifier's
    assert pre.job == "pretraining" and every.job == "classification"
    assert pre.sample_info("train").equals(every.sample_info("train"))
    assert np.array_equal(part.channel_scaler.scale, every.channel_scaler.scale)


def test_label_fraction_on_a_stream_keeps_a_stratified_share_of_the_training_windows():
    options = {
        "channel_cols": ["ambient_temperature", "dynamic_temperature"], "label_col": "regime",
        "context_len": 20, "series_col": "series_id", "train_stride": 5, "seed": 0,
    }  # fmt: skip
    table = simulate_plant_regimes(n_series=4, n_steps=600, seed=0)
    every = StreamDataModule(table, **options)
    part = StreamDataModule(table, label_fraction=0.1, **options)
    every.setup(), part.setup()
    for c in range(every.n_classes):
        n = (every.labels("train") == c).sum()
        assert (part.labels("train") == c).sum() == max(1, round(n * 0.1))
    assert np.array_equal(part.labels("test"), every.labels("test"))
    assert part.sample_info("val").equals(every.sample_info("val"))


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_a_label_fraction_outside_0_1_is_a_setting_error(fraction):
    with pytest.raises(SettingError, match="data.label_fraction"):
        SequenceDataModule(sequences_table(), label_fraction=fraction)
    cfg = compose_config(["experiment=plant_regime", f"data.label_fraction={fraction}"], "out")
    with pytest.raises(SettingError, match=r"^data.label_fraction=.*\(0, 1\]"):
        check(cfg)


def test_pretrain_masked_on_a_windowed_table_is_a_setting_error():
    with pytest.raises(SettingError, match="pretrain=masked pre-trains a classifier's encoder"):
        check(compose_config(["data=plant", "pretrain=masked"], "out"))


def test_pretrain_masked_keeps_the_experiments_network_settings():
    classify = compose_config(["experiment=osuleaf"], "out")
    pre = compose_config(["experiment=osuleaf", "pretrain=masked"], "out")
    assert pre.model.net == classify.model.net
    assert (pre.model.patch_len, pre.model.patch_stride) == (
        classify.model.patch_len,
        classify.model.patch_stride,
    )
    assert pre.model._target_.endswith("MaskedPretraining") and pre.data.pretraining


# -- a tiny pre-training run, then a fine-tuning run from it (slow) --------------------------------------


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """(RunResult of a tiny pre-training run, overrides of its data, folder)."""
    folder = tmp_path_factory.mktemp("pretrain")
    path = folder / "train.csv"
    sequences_table(n_series=30, n_classes=3, lengths=(5, 12)).to_csv(path, index=False)
    data = [*TINY_SEQ, f"data.train={path}", f"logger.mlflow.tracking_uri=sqlite:///{folder}/mlflow.db"]
    return run(compose_config([*data, "pretrain=masked"], folder / "pre")), data, folder


@pytest.mark.slow
def test_a_pretraining_run_saves_a_model_that_init_from_loads_into_a_classifier(pretrained, tmp_path):
    result, data, folder = pretrained
    for key in ("test/mse", "test/baseline_mse"):
        assert np.isfinite(result.metrics[key]), key
    assert result.best_val is not None and result.csv_path is None
    weights = torch.load(result.model_folder / WEIGHTS_FILE, weights_only=True)
    cfg = compose_config(data, tmp_path / "cls")
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    classifier = build_task(cfg.model, datamodule)
    init_from.load_into(classifier, init_from.resolve(result.run_id, f"sqlite:///{folder}/mlflow.db"))
    state = classifier.state_dict()
    blocks = [k for k in state if k.startswith(("net.encoder.", "net.input_proj."))]
    assert blocks and all(torch.equal(state[k], weights[k]) for k in blocks)
    with pytest.raises(ValueError, match="pre-trained by masked fill-in: it classifies nothing"):
        Classifier.load(result.model_folder).predict(sequences_table(n_series=2))


@pytest.mark.slow
def test_a_classifier_fine_tunes_from_the_pretraining_run_folder(pretrained, tmp_path):
    result, data, _ = pretrained
    tuned = run(compose_config([*data, f"init_from={result.model_folder.parent}"], tmp_path / "tuned"))
    assert 0.0 <= tuned.metrics["test/accuracy"] <= 1.0 and len(tuned.forecasts) > 0


def test_the_summary_names_the_fine_tuning_command_without_the_pretraining_settings():
    compose_config(["experiment=osuleaf", "pretrain=masked", "seed=3", "model.mask_ratio=0.2"], "out")
    command = fine_tune_command("R")
    assert command.endswith("train.py experiment=osuleaf seed=3 init_from=R")
