"""The fast dropout path (`nn/dropout.py`, `model.net.fast_dropout`) against the dropout formula and
torch's path: the same formula on its mask, the drop rate of every one of a word's four fields, the
gradient, nothing in evaluation, and the option reaching every dropout of the three families."""

import pytest
import torch
from torch import nn

from tsformer.models import (
    DecoderOnly,
    DecoderOnlyConfig,
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderOnly,
    EncoderOnlyConfig,
)
from tsformer.nn.dropout import Dropout, fast_keep_mask, keep_probability


def reference_formula(x: torch.Tensor, kept: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout spelled out: x / keep where kept, else 0."""
    return torch.where(kept, x / keep_probability(p), torch.zeros_like(x))


@pytest.mark.parametrize("p", [0.3, 0.51])
def test_fast_path_is_the_formula_on_its_own_mask(p):
    x = torch.randn(6, 40, 16)
    drop = Dropout(p, fast=True).train()
    torch.manual_seed(3)
    out = drop(x)
    torch.manual_seed(3)
    kept = fast_keep_mask(x.shape, p)
    torch.testing.assert_close(out, reference_formula(x, kept, p))
    assert 0 < kept.sum() < kept.numel()


@pytest.mark.parametrize("p", [0.1, 0.3, 0.51])
def test_every_field_of_a_word_drops_at_rate_p(p):
    """Each 64-bit word gives four 16-bit fields: each position's rate is p (a field whose sign bit never
    varied, as `random_()` without bounds draws, would drop at 0 or 2p)."""
    n = 400_000
    dropped = ~fast_keep_mask(torch.Size([n * 4]), p)
    rate = dropped.view(n, 4).double().mean(0)  # one rate per field position
    sd = (p * (1 - p) / n) ** 0.5
    assert torch.all((rate - p).abs() < 6 * sd), rate
    assert abs(keep_probability(p) - (1 - p)) < 2**-16


def test_fast_path_keeps_the_expectation_like_torchs():
    x = torch.full((200_000,), 2.0)
    fast, ref = Dropout(0.3, fast=True).train(), Dropout(0.3).train()
    assert fast(x).mean().item() == pytest.approx(2.0, abs=0.02)
    assert ref(x).mean().item() == pytest.approx(2.0, abs=0.02)


def test_fast_path_gradient_is_the_mask_times_the_scale():
    x = torch.randn(5, 33, requires_grad=True)
    torch.manual_seed(0)
    out = Dropout(0.3, fast=True).train()(x)
    out.backward(torch.ones_like(out))
    torch.manual_seed(0)
    kept = fast_keep_mask(x.shape, 0.3)
    torch.testing.assert_close(x.grad, kept.to(x.dtype) / keep_probability(0.3))


def test_evaluation_and_p_zero_leave_x_as_it_is():
    x = torch.randn(4, 10)
    assert torch.equal(Dropout(0.3, fast=True).eval()(x), x)
    assert torch.equal(Dropout(0.0, fast=True).train()(x), x)


def test_reference_path_is_torchs_dropout():
    x = torch.randn(4, 50)
    torch.manual_seed(1)
    ours = Dropout(0.3).train()(x)
    torch.manual_seed(1)
    torch.testing.assert_close(ours, nn.functional.dropout(x, 0.3, training=True))


@pytest.mark.parametrize(
    "model",
    [
        lambda kw: EncoderOnly(EncoderOnlyConfig(head="forecast", context_len=8, horizon=2, **kw)),
        lambda kw: EncoderDecoder(EncoderDecoderConfig(d_enc_in=1, d_target=1, **kw)),
        lambda kw: DecoderOnly(DecoderOnlyConfig(d_target=1, **kw)),
    ],
)
def test_fast_dropout_reaches_every_dropout_of_a_family(model):
    kw = {"d_model": 16, "n_heads": 2, "n_layers": 1, "dropout": 0.3}
    fast = [m for m in model({**kw, "fast_dropout": True}).modules() if isinstance(m, nn.Dropout)]
    plain = [m for m in model(kw).modules() if isinstance(m, nn.Dropout)]
    assert fast and len(fast) == len(plain)
    assert all(isinstance(m, Dropout) and m.fast for m in fast)
    assert not any(getattr(m, "fast", False) for m in plain)
