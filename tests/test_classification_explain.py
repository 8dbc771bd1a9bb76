"""What the classifier looked at (`tsformer.jobs.classification.explain`): occlusion windows cover every
step, the top ranges do not overlap, and on a set whose classes differ in one known range of steps only,
`predict.py --explain` points there."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tsformer.jobs.classification.explain import occlusion, top_ranges, windows
from tsformer.predict import main as predict_main
from tsformer.train import compose_config, run

WHERE = (40, 47)  # the steps where the classes differ


@pytest.mark.parametrize("n_steps", [1, 5, 16, 64, 427])
def test_windows_cover_every_step(n_steps):
    starts, width = windows(n_steps)
    covered = np.zeros(n_steps, dtype=bool)
    for s in starts:
        covered[s : s + width] = True
    assert covered.all() and starts.max() + width <= n_steps


def test_occlusion_finds_the_steps_a_model_reads_and_top_ranges_do_not_overlap():
    def proba(samples):  # a "model" that reads steps 40..47 only
        level = np.array([x[WHERE[0] : WHERE[1] + 1].mean() for x in samples])
        p = 1 / (1 + np.exp(-3 * level))
        return np.stack([1 - p, p], axis=1)

    rng = np.random.default_rng(0)
    samples = [rng.normal(0, 0.1, (64, 2)) + np.where((np.arange(64) >= 40) & (np.arange(64) <= 47), 1.0, 0)[:, None]
               for _ in range(3)]  # fmt: skip
    for occ in occlusion(proba, samples):
        assert occ.target == 1
        lo, hi, drop = top_ranges(occ)[0]
        assert lo <= WHERE[1] and hi >= WHERE[0] and drop > 0.5  # the first range overlaps 40..47
        assert occ.steps[WHERE[0] : WHERE[1] + 1].min() > occ.steps[:30].max()  # and scores above the rest
        ranges = top_ranges(occ, k=3)
        for i, (a, b, _) in enumerate(ranges):
            assert all(b < c or a > d for c, d, _ in ranges[i + 1 :])


def one_range_table(n_series: int, seed: int) -> pd.DataFrame:
    """64 noisy steps; class `up` has a bump up on steps 40..47, class `down` a bump down: nothing else
    tells them apart."""
    rng = np.random.default_rng(seed)
    rows = []
    for sid in range(n_series):
        label = ("up", "down")[sid % 2]
        values = rng.normal(0, 0.5, 64)
        values[WHERE[0] : WHERE[1] + 1] += 2.0 if label == "up" else -2.0
        rows += [{"series_id": sid, "step": t, "value": v, "label": label} for t, v in enumerate(values)]
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_predict_explain_points_at_the_range_where_the_classes_live(tmp_path):
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    one_range_table(40, seed=0).to_csv(train, index=False)
    one_range_table(20, seed=1).to_csv(test, index=False)
    cfg = compose_config(
        [
            "model=enc_only_classifier", "data=sequences", f"data.train={train}", f"data.test={test}",
            "data.val_fraction=0", "callbacks=last_weights", "logger=none", "model.calibration=none",
            "model.net.d_model=16", "model.net.n_heads=2", "model.warmup_steps=5", "trainer.max_steps=150",
            "trainer.max_epochs=-1", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
        ],
        tmp_path / "out",
    )  # fmt: skip
    result = run(cfg)
    assert result.metrics["test/accuracy"] >= 0.9
    out = tmp_path / "explained.csv"
    assert predict_main([str(result.model_folder), str(test), "--output", str(out), "--explain"]) == 0
    explained = pd.read_csv(out)
    assert {"range_1_start", "range_1_end", "range_1_score", "range_3_score"} <= set(explained.columns)
    right = explained[explained.y_true == explained.y_pred]
    overlaps = (right.range_1_start <= WHERE[1]) & (right.range_1_end >= WHERE[0])
    assert overlaps.all(), right[["series_id", "range_1_start", "range_1_end", "range_1_score"]]
    assert (right.range_1_score > 0).all()


def test_occlusion_in_chunks_equals_all_at_once(monkeypatch):
    """A table is occluded CHUNK samples at a time (memory); the scores are those of one pass."""
    from tsformer.jobs.classification import explain

    rng = np.random.default_rng(0)
    samples = [rng.normal(size=(int(n), 2)) for n in rng.integers(8, 20, size=7)]
    weights = rng.normal(size=(2, 3))

    def proba(xs):  # (S, C): a fixed linear model over each sample's mean
        logits = np.stack([x.mean(axis=0) @ weights for x in xs])
        return np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)

    whole = explain.occlusion(proba, samples)
    monkeypatch.setattr(explain, "CHUNK", 3)
    chunked = explain.occlusion(proba, samples)
    for a, b in zip(whole, chunked, strict=True):
        np.testing.assert_allclose(a.drops, b.drops)
        assert a.target == b.target
