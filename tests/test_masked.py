"""Masked fill-in: the masks (runs and independent values), hiding, the interpolation baseline, and
the task's loss on the hidden values only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tsformer.nn.masking import MaskConfig, draw_mask, eval_masks, hide, interpolate
from tsformer.tasks.masked import LinearInterpolation, MaskedFillIn

NET = {"d_model": 16, "n_heads": 2, "n_layers": 1}


def run_lengths(mask: np.ndarray, value: bool) -> np.ndarray:
    """Lengths of the runs of `value` along the steps of every (window, channel), edges left out."""
    lengths = []
    for series in mask.transpose(0, 2, 1).reshape(-1, mask.shape[1]):
        change = np.flatnonzero(np.diff(series.astype(int))) + 1
        runs = np.split(series, change)[1:-1]  # the first and last runs are cut by the window
        lengths += [len(r) for r in runs if r[0] == value]
    return np.asarray(lengths)


def test_geometric_masks_cover_the_ratio_in_runs_of_the_mean_length():
    cfg = MaskConfig("geometric", ratio=0.15, mean_length=3.0)
    # long windows: runs cut by a window edge are left out, and a long run is more often cut
    mask = draw_mask((40, 2000, 3), cfg, torch.Generator().manual_seed(0)).numpy()
    assert mask.mean() == pytest.approx(0.15, abs=0.01)
    assert run_lengths(mask, True).mean() == pytest.approx(3.0, rel=0.05)
    assert run_lengths(mask, False).mean() == pytest.approx(3.0 * 0.85 / 0.15, rel=0.05)
    # channels are drawn on their own: the runs do not line up
    assert (mask[..., 0] != mask[..., 1]).mean() > 0.2


def test_random_masks_hide_each_value_on_its_own():
    mask = draw_mask(
        (400, 96, 7), MaskConfig("random", ratio=0.375), torch.Generator().manual_seed(0)
    ).numpy()
    assert mask.mean() == pytest.approx(0.375, abs=0.005)
    assert run_lengths(mask, True).mean() == pytest.approx(1 / (1 - 0.375), rel=0.05)  # geometric, p = 1 - r


def test_eval_masks_are_fixed_by_the_seed_and_do_not_depend_on_the_window_count():
    cfg = MaskConfig("geometric")
    assert torch.equal(eval_masks(10, 20, 2, cfg, 3)[:4], eval_masks(4, 20, 2, cfg, 3))
    assert not torch.equal(eval_masks(10, 20, 2, cfg, 3), eval_masks(10, 20, 2, cfg, 4))


def test_bad_mask_settings_are_refused():
    for kwargs in ({"kind": "blocks"}, {"ratio": 0.0}, {"ratio": 1.0}, {"mean_length": 0.5}):
        with pytest.raises(ValueError):
            MaskConfig(**kwargs)


def test_hide_zeroes_hidden_values_and_flags_them():
    values = torch.tensor([[[1.0, float("nan")], [2.0, 3.0]]])  # (1, 2, 2)
    mask = torch.tensor([[[False, True], [True, False]]])
    out = hide(values, mask)
    assert torch.equal(out, torch.tensor([[[1.0, 0.0, 0.0, 1.0], [0.0, 3.0, 1.0, 0.0]]]))


def test_interpolation_is_numpy_interp_between_kept_values():
    g = torch.Generator().manual_seed(1)
    values = torch.randn(50, 30, 3, generator=g, dtype=torch.float64)
    hidden = torch.rand(50, 30, 3, generator=g) < 0.5
    hidden[0, :, 0] = True  # a channel with nothing kept: 0, the train mean
    out = interpolate(values.masked_fill(hidden, float("nan")), hidden).numpy()
    steps = np.arange(30)
    for b in range(50):
        for d in range(3):
            kept = ~hidden[b, :, d].numpy()
            expected = np.interp(steps, steps[kept], values[b, kept, d].numpy()) if kept.any() else 0.0
            np.testing.assert_allclose(out[b, :, d], expected, atol=1e-12)
    baseline = LinearInterpolation().predict({"hist_target": values, "hidden": hidden})
    torch.testing.assert_close(baseline, torch.as_tensor(out))


def batch(n_windows: int = 4, n_steps: int = 12, d: int = 2, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "hist_target": torch.randn(n_windows, n_steps, d, generator=g),
        "hist_known": torch.zeros(n_windows, n_steps, 0),
        "hist_observed": torch.zeros(n_windows, n_steps, 0),
        "window": torch.arange(n_windows),
    }


@pytest.mark.parametrize("interpolate_hidden", [False, True])
def test_loss_is_taken_on_the_hidden_values_only(interpolate_hidden):
    torch.manual_seed(0)
    task = MaskedFillIn(NET, 2, 0, 0, 12, 0, interpolate_hidden=interpolate_hidden)
    b = batch()
    hidden = torch.zeros(4, 12, 2, dtype=torch.bool)
    hidden[:, 3:6, 0] = True
    scored = hidden.clone()
    loss = task.masked_loss_of(b, hidden, scored)
    pred = task.restore(b, hidden)
    expected = ((pred - b["hist_target"])[scored] ** 2).mean()
    torch.testing.assert_close(loss, expected)
    # the true value of a hidden cell reaches the loss only as its label, never as an input
    changed = {**b, "hist_target": b["hist_target"].clone()}
    changed["hist_target"][:, 4, 0] += 10.0
    torch.testing.assert_close(task.restore(changed, hidden), pred)


def test_a_prediction_fills_nan_and_keeps_every_other_value():
    task = MaskedFillIn(NET, 2, 0, 0, 12, 0)
    b = batch()
    b["hist_target"][1, 5, 1] = float("nan")
    out = task.predict_target(b)
    assert torch.isfinite(out).all()
    keep = ~torch.isnan(b["hist_target"])
    assert torch.equal(out[keep], b["hist_target"][keep])


def test_masked_fill_in_refuses_a_horizon_and_a_distribution_head():
    with pytest.raises(ValueError, match="horizon"):
        MaskedFillIn(NET, 2, 0, 0, 12, 4)
    with pytest.raises(ValueError, match="point head"):
        MaskedFillIn(NET, 2, 0, 0, 12, 0, head={"kind": "gaussian"})
