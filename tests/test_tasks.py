"""The forecasting tasks never look at the future they predict: only history and known covariates."""

import pytest
import torch

from conftest import random_windows
from tsformer.tasks import DecoderOnlyForecaster, EncoderDecoderForecaster, EncoderForecaster

NET = {"d_model": 16, "n_heads": 2, "n_layers": 1}
N, M, DY, DK, DO = 12, 6, 2, 3, 1


@pytest.mark.parametrize("task_cls", [EncoderDecoderForecaster, DecoderOnlyForecaster, EncoderForecaster])
@pytest.mark.parametrize("revin", [False, True])
def test_predictions_use_history_and_known_future_only(task_cls, revin):
    """With RevIN too: its statistics come from the history (every option combination:
    test_model_options.py)."""
    torch.manual_seed(0)
    task = task_cls(
        net=NET, d_target=DY, d_known=DK, d_observed=DO, context_len=N, horizon=M, revin=revin
    ).eval()
    b = random_windows(N, M, DY, DK, DO)
    with torch.no_grad():
        pred = task.forecast(b)
        assert pred.shape == (4, M, DY)
        leaked = dict(b, fut_target=b["fut_target"] * 3 + 10.0, fut_observed=b["fut_observed"] - 10.0)
        assert torch.allclose(task.forecast(leaked), pred, atol=1e-6)  # the truth is never read
        informed = dict(b, fut_known=b["fut_known"] + 1.0)
        assert (task.forecast(informed) - pred).abs().max() > 1e-4  # the known future is used


@pytest.mark.parametrize("loss", ["mse", "mae"])
@pytest.mark.parametrize("task_cls", [EncoderForecaster, DecoderOnlyForecaster])
def test_validation_logs_the_training_loss_with_one_pass_where_the_loss_is_the_forecast_s(task_cls, loss):
    """`val/loss` is `task.loss` of the batch, whether validation derives it from the forecast (the
    encoder-only family: one pass of the network, counted) or takes the teacher-forced pass."""
    torch.manual_seed(0)
    task = task_cls(
        net=NET,
        d_target=DY,
        d_known=DK,
        d_observed=DO,
        context_len=N,
        horizon=M,
        revin=True,
        channel_independent=True,
        loss=loss,
    ).eval()
    b = random_windows(N, M, DY, DK, DO)
    logged, passes = {}, []
    task.log = lambda name, value, **kw: logged.__setitem__(name, value)
    task.log_dict = lambda *args, **kw: None
    task.net.register_forward_hook(lambda *args: passes.append(1))
    with torch.no_grad():
        task.validation_step(b, 0)
        n_passes = len(passes)
        torch.testing.assert_close(logged["val/loss"], task.loss(b), rtol=1e-5, atol=1e-6)
    assert task.loss_of_forecast == (task_cls is EncoderForecaster)
    if task.loss_of_forecast:
        assert n_passes == 1
