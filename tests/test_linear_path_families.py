"""The linear path (`model.linear_path`, declared once in `tasks/forecasting._TransformerForecaster`) in
every Transformer forecasting family: the forecast is the closed-form linear forecaster's plus what the
network adds, and the autoregressive families feed back that sum. And the encoder-decoder that feeds
nothing back (`model.net.feed_back=false`)."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY, small_plant_datamodule
from test_model_options import DEC_ONLY_PATCHES, NET, M, N, batch, make_task
from tsformer.jobs.forecasting.forecaster import Forecaster, ModelInfo, save_model_folder
from tsformer.tasks import (
    DecoderOnlyForecaster,
    EncoderDecoderForecaster,
    EncoderForecaster,
    LinearForecaster,
)
from tsformer.tasks.baselines import LinearForecast
from tsformer.train import build_task, compose_config

OPTIONS = {"revin": True, "channel_independent": True}
CASES = [
    pytest.param(EncoderDecoderForecaster, {}, id="enc_dec"),
    pytest.param(
        EncoderDecoderForecaster, OPTIONS | {"patch_len": 4, "patch_stride": 2}, id="enc_dec-ri-ci-patches"
    ),
    pytest.param(DecoderOnlyForecaster, {}, id="dec_only"),
    pytest.param(DecoderOnlyForecaster, OPTIONS | DEC_ONLY_PATCHES, id="dec_only-ri-ci-patches"),
    pytest.param(
        EncoderForecaster, OPTIONS | {"patch_len": 4, "patch_stride": 2}, id="enc_only-ri-ci-patches"
    ),
]


def with_linear_weights(task, seed: int = 1):
    """`task`'s linear path given random weights (as if solved), so that it counts in a forecast."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = task.linear_path.weight
        w.copy_(torch.randn(w.shape, generator=g) * 0.1)
        task.linear_path.penalty.fill_(1.0)
    return task


def linear_forecast(task, b: dict) -> torch.Tensor:
    return task.linear_path(b["hist_target"], b["fut_known"])  # (B, M, Dy), the data's units


@pytest.mark.parametrize("cls,opts", CASES)
def test_with_the_network_adding_nothing_the_forecast_is_the_linear_forecast(cls, opts):
    task = with_linear_weights(make_task(cls, opts | {"linear_path": True}))
    b = batch()
    with torch.no_grad():
        assert task.net.head.weight.abs().max() == 0  # the network's share starts at zero
        torch.testing.assert_close(task.forecast(b), linear_forecast(task, b), rtol=1e-4, atol=1e-4)
        torch.nn.init.normal_(task.net.head.weight)  # once the network adds something, it counts
        assert (task.forecast(b) - linear_forecast(task, b)).abs().max() > 1e-3


@pytest.mark.parametrize("cls,opts", [c for c in CASES if c.values[0].autoregressive])
def test_generation_feeds_back_the_linear_forecast_plus_the_networks(cls, opts):
    """Teacher forcing adds the linear forecast at the steps where generation does: forced with its own
    forecast as the truth, the decoder gives that forecast back (network and linear path both nonzero;
    no past-only covariates, which dec_only feeds back from its own prediction)."""
    task = with_linear_weights(make_task(cls, opts | {"linear_path": True}, d_observed=0))
    with torch.no_grad():
        torch.nn.init.normal_(task.net.head.weight, std=0.3)
    b = batch()
    b["hist_observed"], b["fut_observed"] = b["hist_observed"][..., :0], b["fut_observed"][..., :0]
    with torch.no_grad():
        pred = task.forecast(b)  # generated
        net_batch, view = task.options.enter(task.with_linear_path(dict(b, fut_target=pred)))
        forced, _, _ = task.teacher_forced(net_batch)
        forced = view.to_batch_layout(forced[:, -M:, : task.d_target_net])
    torch.testing.assert_close(forced, pred, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("cls,opts", CASES)
def test_the_linear_path_never_reads_the_future_truth_and_trains(cls, opts):
    task = with_linear_weights(make_task(cls, opts | {"linear_path": True}))
    b = batch()
    with torch.no_grad():
        pred = task.forecast(b)
        leaked = dict(b, fut_target=b["fut_target"] * 50 + 1e3, fut_observed=b["fut_observed"] - 10.0)
        torch.testing.assert_close(task.forecast(leaked), pred, rtol=0, atol=1e-5)
    task.train()
    task.loss(b).backward()
    assert task.net.head.weight.grad.abs().max() > 0  # the network learns what the linear path misses
    assert task.linear_path.weight.grad.abs().max() > 0  # and the linear weights train with it
    frozen = make_task(cls, opts | {"linear_path": True, "linear_path_frozen": True})
    assert not frozen.linear_path.weight.requires_grad


@pytest.mark.parametrize("cls", [EncoderDecoderForecaster, DecoderOnlyForecaster])
def test_the_linear_path_takes_the_point_head(cls):
    with pytest.raises(ValueError, match="model.linear_path takes the point head"):
        make_task(cls, {"linear_path": True}, head={"kind": "gaussian"})


@pytest.mark.parametrize(
    "cls, opts, setting",
    [
        (EncoderForecaster, {"linear_path": True}, "model.linear_path"),
        (EncoderForecaster, {"channel_mixing": True}, "model.channel_mixing"),
        (EncoderForecaster, {"linear_gate": "step"}, "model.linear_gate"),
        (LinearForecaster, {}, "model=linear"),
    ],
)
def test_each_setting_that_needs_the_point_head_refuses_another_in_one_line_naming_it(cls, opts, setting):
    net = {} if cls is LinearForecaster else NET
    with pytest.raises(ValueError) as refused:
        make_task(cls, opts, net=net, head={"kind": "student_t"})
    assert str(refused.value) == f"{setting} takes the point head (head=point), not head=student_t"
    make_task(cls, opts, net=net)  # the point head: taken


@pytest.mark.parametrize(
    "model,options",
    [
        ("enc_dec", ["model.revin=true", "model.channel_independent=true", "model.patch_len=4"]),
        ("dec_only", ["model.revin=true", "model.channel_independent=true", "model.patch_len=4"]),
    ],
)
def test_solved_at_the_start_the_forecast_is_the_runs_linear_forecasters(model, options, tmp_path):
    """As solved on the data module (the run's `linear` baseline is the same closed-form fit), before any
    training, every family's forecast is the closed-form linear forecaster's."""
    from hydra.utils import instantiate

    overrides = [f"model={model}", *TINY, *options, "model.linear_path=true"]
    overrides += ["model.context_len=16", "model.horizon=8"]  # whole patches for dec_only
    cfg = compose_config(overrides, tmp_path)
    dm = instantiate(cfg.data)
    dm.setup()
    task = build_task(cfg.model, dm)
    assert task.solve_linear_path(dm) and not task.solve_linear_path(dm)  # solved once, then kept
    baseline = LinearForecast()
    baseline.fit(dm.datasets["train"], dm.features, dm.frame, val=dm.datasets["val"])
    b = next(iter(dm.test_dataloader()))
    with torch.no_grad():
        torch.testing.assert_close(task.eval().forecast(b), baseline.predict(b), rtol=1e-4, atol=1e-4)
    assert task.hparams.linear_path  # saved with the hyperparameters (a model folder keeps it)


@pytest.mark.parametrize("opts", [{}, OPTIONS | {"patch_len": 4, "patch_stride": 2, "linear_path": True}])
def test_an_encoder_decoder_that_feeds_nothing_back_trains_on_its_forecast(opts):
    """`model.net.feed_back=false`: the decoder never reads a future value, so the training pass is the
    forecast itself; the default decoder's teacher-forced pass reads the true future (so this can fail)."""
    b = batch()
    for feed_back in (False, True):
        task = make_task(EncoderDecoderForecaster, opts, net=NET | {"feed_back": feed_back})
        if opts:
            with_linear_weights(task)
        with torch.no_grad():
            torch.nn.init.normal_(task.net.head.weight, std=0.3)
            net_batch, view = task.options.enter(task.with_linear_path(task.static.append_to_known(b)))
            forced = view.to_batch_layout(task.teacher_forced(net_batch)[0])
            forecast = task.forecast(b)
        if feed_back:
            assert (forced - forecast).abs().max() > 1e-3  # forced with the truth, not with its forecast
        else:
            torch.testing.assert_close(forced, forecast, rtol=1e-5, atol=1e-5)


def test_an_encoder_decoder_that_feeds_nothing_back_samples_paths():
    task = make_task(EncoderDecoderForecaster, {}, net=NET | {"feed_back": False}, head={"kind": "gaussian"})
    b = batch()
    with torch.no_grad():
        paths = task.sample_paths(task.options.enter(b)[0], num_samples=5)  # (B, S, M, Dy)
        point = task.forecast(b)  # the distribution's mean at every step, one pass
    assert paths.shape == (4, 5, M, 3) and torch.isfinite(paths).all()
    assert (paths[:, 0] - paths[:, 1]).abs().max() > 0  # drawn, not repeated
    assert point.shape == (4, M, 3)


# and the encoder-decoder whose decoder feeds nothing back and reads patches of 4 future steps a token
DECODER_PATCHES = NET | {"feed_back": False, "decoder_patch_len": 4}


@pytest.mark.parametrize(
    "cls,opts,net",
    [pytest.param(*c.values, NET, id=c.id) for c in CASES if c.values[0].autoregressive]
    + [pytest.param(EncoderDecoderForecaster, OPTIONS, DECODER_PATCHES, id="enc_dec-decoder-patches")],
)
def test_the_linear_path_round_trips_through_the_model_folder(cls, opts, net, tmp_path):
    dm = small_plant_datamodule(N, M)
    sizes = {"d_target": dm.d_target, "d_known": dm.d_known, "d_observed": dm.d_observed}
    task = make_task(cls, opts | {"linear_path": True}, net=net, **sizes)
    task.fit_linear_path(dm)
    with torch.no_grad():
        torch.nn.init.normal_(task.net.head.weight, std=0.1)
    save_model_folder(tmp_path / "model", task, dm, ModelInfo(family=task.family, dataset="plant"))
    loaded = Forecaster.load(tmp_path / "model").task
    assert loaded.hparams.linear_path and not loaded.linear_path.penalty.isnan()  # solved: kept, not refitted
    b = next(iter(dm.test_dataloader()))
    with torch.no_grad():
        assert torch.equal(loaded.forecast(b), task.forecast(b))
