"""The path across channels (`model.channel_mixing`, `nn/channel_mixing.py`): its shapes, that it mixes
channels, and that off (the default) the forecaster is what it was."""

from __future__ import annotations

import torch
from hydra.utils import instantiate

from conftest import TINY
from tsformer.nn.channel_mixing import ChannelMixing
from tsformer.train import build_task, compose_config


def test_every_channel_s_future_reads_every_channel_s_window():
    torch.manual_seed(0)
    mixing = ChannelMixing(context_len=16, horizon=8)
    hist = torch.randn(4, 16, 3)
    assert torch.equal(mixing(hist), torch.zeros(4, 8, 3))  # starts as no path at all
    torch.nn.init.normal_(mixing.out.weight)
    out = mixing(hist)
    assert out.shape == (4, 8, 3)
    moved = hist.clone()
    moved[:, :, 1] = torch.randn(4, 16)  # another history for channel 1 only
    assert not torch.allclose(mixing(moved)[..., 0], out[..., 0])  # channel 0's forecast follows it


def test_off_the_forecaster_is_unchanged_and_on_it_starts_there_and_trains(tmp_path):
    base = [
        "model=enc_only_forecast",
        *TINY,
        "model.revin=true",
        "model.channel_independent=true",
        "model.linear_path=true",
    ]
    cfg = compose_config(base, tmp_path)
    dm = instantiate(cfg.data)
    dm.setup()
    off = build_task(cfg.model, dm)
    assert cfg.model.channel_mixing is False and off.channel_mixing is None
    assert not any(k.startswith("channel_mixing") for k in off.state_dict())  # old model folders still fit
    on = build_task(compose_config([*base, "model.channel_mixing=true"], tmp_path).model, dm)
    missing, unexpected = on.load_state_dict(off.state_dict(), strict=False)
    assert missing and all(k.startswith("channel_mixing.") for k in missing) and not unexpected
    off.fit_linear_path(dm)
    on.linear_path.load_state_dict(off.linear_path.state_dict())
    batch = next(iter(dm.val_dataloader()))
    with torch.no_grad():
        torch.testing.assert_close(on.eval().forecast(batch), off.eval().forecast(batch))
    on.train().loss(batch).backward()
    assert on.channel_mixing.out.weight.grad.abs().sum() > 0  # trained with the rest
