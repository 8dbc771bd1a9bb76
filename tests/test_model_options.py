"""Model options of the forecasting families: RevIN, channel independence, patch tokens, the PatchTST
preset, and their round trip through the model folder."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import TINY, random_windows, small_plant_datamodule
from tsformer.data import simulate_plant
from tsformer.jobs.forecasting.forecaster import Forecaster, ModelInfo, save_model_folder
from tsformer.models import EncoderDecoder, EncoderDecoderConfig, EncoderOnly, EncoderOnlyConfig
from tsformer.nn.patching import Patching, n_patches
from tsformer.nn.revin import RevIN
from tsformer.tasks import (
    DecoderOnlyForecaster,
    EncoderDecoderForecaster,
    EncoderForecaster,
    ReconstructionTask,
)
from tsformer.train import compose_config, run

NET = {"d_model": 16, "n_heads": 2, "n_layers": 1}
N, M, DY, DK, DO = 12, 6, 3, 2, 1
FAMILIES = [EncoderDecoderForecaster, DecoderOnlyForecaster, EncoderForecaster]
REVIN = {"off": {}, "on": {"revin": True}, "affine": {"revin": True, "revin_affine": True}}
PATCHES = {"steps": {}, "patches": {"patch_len": 4, "patch_stride": 2}}
DEC_ONLY_PATCHES = {"patch_len": 3}  # side by side, N and M whole patches


def patch_options(cls, p: str) -> dict:
    return DEC_ONLY_PATCHES if p == "patches" and cls is DecoderOnlyForecaster else PATCHES[p]


def combos(families=FAMILIES, revin=tuple(REVIN)) -> list:
    """(family, options) for every combination of the options each family supports."""
    out = []
    for cls, r, ci, p in itertools.product(families, revin, [False, True], PATCHES):
        if p == "patches" and "patch_len" not in cls.supported_options:
            continue
        opts = {**REVIN[r], **patch_options(cls, p), **({"channel_independent": True} if ci else {})}
        out.append(pytest.param(cls, opts, id=f"{cls.family}-revin_{r}-{'ci' if ci else 'joint'}-{p}"))
    return out


def make_task(cls, opts: dict, d_target: int = DY, **kw):
    """A tiny task in eval mode; RevIN's affine map is set away from the identity, so it counts."""
    torch.manual_seed(0)
    args = {"net": NET, "d_target": d_target, "d_known": DK, "d_observed": DO, "context_len": N, "horizon": M}
    args |= kw
    task = cls(**args, **opts).eval()
    if opts.get("revin_affine"):
        with torch.no_grad():
            task.options.revin.weight.uniform_(0.5, 2.0)
            task.options.revin.bias.uniform_(-1.0, 1.0)
    return task


def batch(seed=0, d_target=DY) -> dict:
    b = random_windows(N, M, d_target, DK, DO, seed)
    level = torch.tensor([5.0, -20.0, 100.0])[:d_target]  # channels on different levels and scales
    spread = torch.tensor([1.0, 3.0, 0.1])[:d_target]
    return dict(b, hist_target=b["hist_target"] * spread + level, fut_target=b["fut_target"] * spread + level)


# -- RevIN ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("affine", [False, True])
def test_revin_round_trip_and_history_statistics(affine):
    torch.manual_seed(0)
    revin = RevIN(3, affine=affine)
    if affine:
        with torch.no_grad():
            revin.weight.copy_(torch.tensor([0.5, 2.0, -1.5]))
            revin.bias.copy_(torch.tensor([0.3, -1.0, 2.0]))
    hist = torch.randn(4, 20, 3) * torch.tensor([1.0, 10.0, 0.1]) + torch.tensor([0.0, 50.0, -3.0])
    fut = torch.randn(4, 7, 3) * 5
    scale = revin(hist)
    assert scale.loc.shape == scale.scale.shape == (4, 1, 3)
    for x in (hist, fut):  # any values, normalised with the history's statistics, come back
        torch.testing.assert_close(scale.denormalise(scale.normalise(x)), x, rtol=1e-5, atol=1e-4)
    # the statistics are the history's: normalised history = mean b, std |w| per window and channel
    norm = scale.normalise(hist)
    w = revin.weight.detach() if affine else torch.ones(3)
    b = revin.bias.detach() if affine else torch.zeros(3)
    torch.testing.assert_close(norm.mean(dim=1), b.expand(4, 3), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(norm.std(dim=1, unbiased=False), w.abs().expand(4, 3), rtol=1e-3, atol=1e-3)


def test_revin_constant_channel_gives_no_nan():
    hist = torch.randn(2, 10, 2)
    hist[:, :, 1] = 7.0  # a stuck sensor
    scale = RevIN(2)(hist)
    norm = scale.normalise(hist)
    assert torch.isfinite(norm).all() and (norm[..., 1] == 0).all()
    torch.testing.assert_close(scale.denormalise(norm), hist)


@pytest.mark.parametrize("cls,opts", combos(revin=("on", "affine")))
def test_constant_channel_forecasts_and_trains_without_nan(cls, opts):
    task = make_task(cls, opts)
    b = batch()
    b["hist_target"][:, :, 1] = 3.0  # constant over the whole history
    b["fut_target"][:, :, 1] = 3.0
    with torch.no_grad():
        assert torch.isfinite(task.forecast(b)).all()
    task.train()
    loss = task.loss(b)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in task.parameters() if p.grad is not None)


@pytest.mark.parametrize("cls,opts", combos(revin=("on",)))
def test_revin_forecast_moves_with_the_history_level_and_scale(cls, opts):
    """RevIN's statistics are the history's: shifting and scaling the history's targets by (a, c)
    maps the forecast by the same (a, c), whatever the future truth holds."""
    task = make_task(cls, opts)
    b = batch()
    a = torch.tensor([2.0, 0.5, 10.0])
    c = torch.tensor([-4.0, 30.0, 1.0])
    moved = dict(b, hist_target=b["hist_target"] * a + c, fut_target=torch.randn(4, M, DY))
    with torch.no_grad():
        torch.testing.assert_close(task.forecast(moved), task.forecast(b) * a + c, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("cls,opts", combos())
def test_forecasts_never_read_the_future_truth(cls, opts):
    """Every family and option combination: fut_target and fut_observed change nothing (RevIN takes
    the history's statistics only), fut_known does (so the check can fail)."""
    task = make_task(cls, opts)
    b = batch()
    with torch.no_grad():
        pred = task.forecast(b)
        assert pred.shape == (4, M, DY)
        leaked = dict(b, fut_target=b["fut_target"] * 50 + 1e3, fut_observed=b["fut_observed"] - 10.0)
        torch.testing.assert_close(task.forecast(leaked), pred, rtol=0, atol=1e-6)
        informed = dict(b, fut_known=b["fut_known"] + 1.0)
        assert (task.forecast(informed) - pred).abs().max() > 1e-4


@pytest.mark.parametrize(
    "cls,opts", combos(families=[EncoderDecoderForecaster, DecoderOnlyForecaster], revin=("on", "affine"))
)
def test_teacher_forcing_normalises_the_future_with_the_history_statistics(cls, opts):
    """Teacher forcing feeds the decoder the true future normalised with the HISTORY's statistics, the
    units in which generation feeds its own predictions back: forced with its own forecast as the
    truth, the decoder gives that forecast back. (No past-only covariates here: dec_only would feed
    back its own predictions of them, teacher forcing the true ones.)"""
    task = make_task(cls, opts, d_observed=0)
    b = batch()
    b["hist_observed"], b["fut_observed"] = b["hist_observed"][..., :0], b["fut_observed"][..., :0]
    with torch.no_grad():
        pred = task.forecast(b)  # generated
        net_batch, view = task.options.enter(dict(b, fut_target=pred))
        forced, _, _ = task.teacher_forced(net_batch)  # (B', M or N + M - 1, Dy')
        forced = view.to_batch_layout(forced[:, -M:, : task.d_target_net])
    torch.testing.assert_close(forced, pred, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("cls,opts", combos(families=[EncoderForecaster]))
def test_loss_is_in_the_datas_units_whatever_the_options(cls, opts):
    """The encoder-only forecaster forces nothing: its training loss is the MSE of its forecast
    against the data's future, with RevIN and channel independence undone first."""
    task = make_task(cls, opts)
    b = batch()
    with torch.no_grad():
        expected = torch.nn.functional.mse_loss(task.forecast(b), b["fut_target"])
        torch.testing.assert_close(task.loss(b), expected, rtol=1e-5, atol=1e-4)


# -- channel independence -------------------------------------------------------------------------


@pytest.mark.parametrize("cls,opts", combos(revin=("off", "on", "affine")))
def test_channel_independence_keeps_channels_apart(cls, opts):
    """With CI, a channel's forecast depends on its own values only: changing the other channels
    (history and future) leaves it unchanged; without CI it changes (the check can fail)."""
    task = make_task(cls, opts)
    b = batch()
    other = dict(b)
    other["hist_target"] = b["hist_target"].clone()
    other["hist_target"][..., 1:] = torch.randn(4, N, DY - 1) * 40 - 7  # channels 1 and 2
    with torch.no_grad():
        pred, pred_other = task.forecast(b), task.forecast(other)
    same = torch.allclose(pred_other[..., 0], pred[..., 0], atol=1e-5)
    assert same == bool(opts.get("channel_independent")), (pred_other[..., 0] - pred[..., 0]).abs().max()


@pytest.mark.parametrize("cls,opts", [c for c in combos(revin=("off", "on")) if "-ci-" in c.id])
def test_channel_independence_is_equivariant_to_channel_order(cls, opts):
    """Shared weights, no channel identity: permuting the target channels permutes the forecast."""
    task = make_task(cls, opts)
    b = batch()
    order = [2, 0, 1]
    permuted = dict(b, hist_target=b["hist_target"][..., order], fut_target=b["fut_target"][..., order])
    with torch.no_grad():
        torch.testing.assert_close(
            task.forecast(permuted), task.forecast(b)[..., order], rtol=1e-5, atol=1e-5
        )


def test_channel_independence_builds_a_one_channel_network():
    task = make_task(EncoderDecoderForecaster, {"channel_independent": True})
    assert task.d_target_net == 1 and task.net.head.out_features == 1
    assert task.net.cfg.d_enc_in == 1 + DK + DO  # one target channel + the covariates, repeated per channel


# -- patch tokens ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n,p,s", [(12, 4, 2), (12, 4, 4), (13, 4, 3), (10, 16, 8), (512, 16, 8), (336, 16, 8)]
)
def test_patch_count_and_the_steps_each_patch_covers(n, p, s):
    C = 3
    steps = torch.arange(n).float()
    x = (100 * steps[None, :, None] + torch.arange(C).float()[None, None, :]).expand(2, n, C)  # 100 t + c
    patching = Patching(p, s)
    out = patching(x)
    L = (n - p) // s + 2
    assert n_patches(n, p, s) == patching.count(n) == L
    assert out.shape == (2, L, p * C)
    assert patching.positions(n).tolist() == [i * s for i in range(L)]
    for i in range(L):
        expected_steps = torch.clamp(torch.arange(i * s, i * s + p), max=n - 1)  # end padded with step n - 1
        expected = 100 * expected_steps[:, None].float() + torch.arange(C).float()[None, :]  # (P, C)
        torch.testing.assert_close(out[0, i].view(p, C), expected)
    assert i * s + p - 1 >= n - 1  # the last patch reaches the last step (or, when S = P, only repeats it)


def test_patchtst_64_words_and_too_short_windows():
    assert n_patches(512, 16, 8) == 64  # "A Time Series is Worth 64 Words"
    assert n_patches(336, 16, 8) == 42  # PatchTST/42
    with pytest.raises(ValueError, match="too short for patch_len=16"):
        Patching(16, 4)(torch.zeros(1, 10, 1))
    assert Patching(4).stride == 4  # no stride: patches side by side


def test_models_read_patch_tokens():
    torch.manual_seed(0)
    enc = EncoderOnly(
        EncoderOnlyConfig(
            **NET, d_in=2, d_out=1, head="forecast", context_len=20, horizon=5, patch_len=4, patch_stride=2
        )
    ).eval()
    L = n_patches(20, 4, 2)
    x = torch.randn(3, 20, 2)
    assert enc.encode(x).shape == (3, L, 16)
    assert enc.head.in_features == L * 16 and enc(x).shape == (3, 5, 1)
    x2 = x.clone()
    x2[:, 7] += 1.0  # one step changes the forecast (through the patches holding it)
    with torch.no_grad():
        assert (enc(x2) - enc(x)).abs().max() > 1e-5
    with pytest.raises(ValueError, match="no padding mask"):
        enc(x, torch.ones(3, 20, dtype=torch.bool))
    with pytest.raises(ValueError, match="per_step head"):
        EncoderOnly(EncoderOnlyConfig(**NET, d_in=2, patch_len=4))
    # a patch token sits at the time step it starts at: the last one at 2 * (L - 1), so a learned
    # table of positions must reach that far
    cfg = {**NET, "d_in": 2, "head": "forecast", "context_len": 20, "patch_len": 4, "patch_stride": 2}
    EncoderOnly(EncoderOnlyConfig(**cfg, positional="learned", max_len=2 * (L - 1) + 1))(x)
    with pytest.raises(ValueError, match=f"needs {2 * (L - 1) + 1} positions"):
        EncoderOnly(EncoderOnlyConfig(**cfg, positional="learned", max_len=2 * (L - 1)))(x)

    ed = EncoderDecoder(
        EncoderDecoderConfig(
            **NET, d_enc_in=3, d_target=1, d_known=2, patch_len=4, patch_stride=2, positional="rope"
        )
    ).eval()
    hist, last, fut_k = torch.randn(3, 20, 3), torch.randn(3, 1), torch.randn(3, 6, 2)
    assert ed.encode(hist).shape == (3, L, 16)
    assert ed.memory_positions(20).tolist() == [2 * i for i in range(L)]  # on the shared time axis
    cached, uncached = ed.generate(hist, last, fut_k), ed.generate(hist, last, fut_k, use_cache=False)
    torch.testing.assert_close(cached, uncached, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # teacher forcing on its own predictions gives them back
        torch.testing.assert_close(ed(hist, last, cached, fut_k), cached, rtol=1e-5, atol=1e-5)


# -- which family takes which option --------------------------------------------------------------


def test_options_a_family_does_not_support_are_refused():
    for option in ({"revin": True}, {"channel_independent": True}, {"patch_len": 4}):
        with pytest.raises(ValueError, match="not an option of the enc_only family"):
            ReconstructionTask(
                net=NET, d_target=2, d_known=2, d_observed=0, context_len=N, horizon=0, **option
            )
    with pytest.raises(ValueError, match="needs model.patch_len"):
        make_task(EncoderForecaster, {"patch_stride": 2})
    with pytest.raises(ValueError, match="needs model.revin=true"):
        make_task(EncoderForecaster, {"revin_affine": True})


def test_decoder_only_patches_are_side_by_side_and_whole():
    """The decoder-only family generates a patch per token: no overlap, and the history (N = 12)
    and the horizon (M = 6) cut into whole patches; anything else is refused with the setting named."""
    make_task(DecoderOnlyForecaster, {"patch_len": 3, "patch_stride": 3})
    with pytest.raises(
        ValueError, match=r"model.patch_stride=2: .* must be null or equal model.patch_len \(4\)"
    ):
        make_task(DecoderOnlyForecaster, {"patch_len": 4, "patch_stride": 2})
    with pytest.raises(
        ValueError, match=r"model.horizon=6 is not a whole number of patches of model.patch_len=4"
    ):
        make_task(DecoderOnlyForecaster, {"patch_len": 4})
    with pytest.raises(
        ValueError, match=r"model.context_len=12 is not a whole number of patches of model.patch_len=5"
    ):
        make_task(DecoderOnlyForecaster, {"patch_len": 5}, horizon=10)


# -- the PatchTST preset and the model folder -----------------------------------------------------


def test_patchtst_preset_is_the_papers_setup(in_tmp):
    m = compose_config(["model=patchtst"], in_tmp / "out").model
    assert m._target_ == "tsformer.tasks.EncoderForecaster"
    assert (m.revin, m.channel_independent, m.patch_len, m.patch_stride) == (True, True, 16, 8)
    assert (m.net.d_model, m.net.n_layers, m.net.n_heads, m.net.dropout) == (128, 3, 16, 0.2)
    assert n_patches(m.context_len, m.patch_len, m.patch_stride) == 64
    # the blocks and training of PatchTST's code
    assert (m.net.norm_layer, m.net.norm, m.net.residual_attention) == ("batch", "post", True)
    assert (m.net.attention_dropout, m.net.attention_output_dropout) == (0, pytest.approx(1 - 0.8**2))
    assert (m.lr, m.weight_decay, m.lr_schedule) == (1.0e-4, 0, "epoch_decay")


LAYERNORM_BLOCKS = ["model.net.norm_layer=layer", "model.net.norm=pre", "model.net.residual_attention=false"]


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [[], LAYERNORM_BLOCKS], ids=["preset", "layernorm_blocks"])
def test_patchtst_preset_trains_predicts_and_round_trips(in_tmp, blocks):
    """Tiny sizes: a few steps of training, forecasts of the right shape, and the saved model folder
    forecasts what training exported; also with LayerNorm before each sublayer instead of the preset's
    BatchNorm after it."""
    overrides = ["model=patchtst", *TINY, "model.context_len=48", "model.horizon=24", "logger=none", *blocks]
    result = run(compose_config(overrides, in_tmp / "out"))
    targets = ["dynamic_temperature", "dynamic_pressure"]
    per_window = result.forecasts.groupby(["series_id", "origin_time"]).size()
    assert (per_window == 24 * len(targets)).all() and result.forecasts.y_pred.notna().all()
    forecaster = Forecaster.load(result.model_folder)
    hp = forecaster.task.hparams
    assert (hp.revin, hp.channel_independent, hp.patch_len, hp.patch_stride) == (True, True, 16, 8)
    assert hp.net["residual_attention"] == (not blocks)
    origin = pd.Timestamp(result.forecasts.origin_time.max())
    table = simulate_plant(n_series=2, n_steps=800, freq="1min", seed=0)
    table = table[table.time <= origin + 24 * pd.Timedelta("1min")].copy()
    table.loc[table.time > origin, targets] = np.nan
    out = forecaster.predict(table)
    keys = ["series_id", "origin_time", "target_time", "step", "variable"]
    both = result.forecasts.merge(out, on=keys, suffixes=("_train", "_new"))
    assert len(both) == len(out) == 2 * 24 * len(targets)
    np.testing.assert_allclose(both.y_pred_new, both.y_pred_train, rtol=1e-4, atol=1e-4)


ALL_OPTIONS = {"revin": True, "revin_affine": True, "channel_independent": True}


@pytest.mark.parametrize(
    "cls,opts",
    [
        (EncoderForecaster, ALL_OPTIONS | {"patch_len": 4, "patch_stride": 2}),
        (EncoderDecoderForecaster, ALL_OPTIONS | {"patch_len": 4, "patch_stride": 3}),
        (DecoderOnlyForecaster, ALL_OPTIONS),
        (DecoderOnlyForecaster, ALL_OPTIONS | DEC_ONLY_PATCHES),
    ],
    ids=lambda v: v.family if isinstance(v, type) else "",
)
def test_options_round_trip_through_the_model_folder(cls, opts, tmp_path):
    dm = small_plant_datamodule(N, M)
    task = make_task(cls, opts, d_target=dm.d_target, d_known=dm.d_known, d_observed=dm.d_observed)
    save_model_folder(tmp_path / "model", task, dm, ModelInfo(family=task.family, dataset="plant"))
    loaded = Forecaster.load(tmp_path / "model").task
    assert {k: loaded.hparams[k] for k in opts} == opts
    b = next(iter(dm.test_dataloader()))
    with torch.no_grad():
        assert torch.equal(loaded.forecast(b), task.forecast(b))
