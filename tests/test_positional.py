"""Positional encodings: order information, RoPE's relative property, lengths."""

import pytest
import torch

from tsformer.models import DecoderOnly, DecoderOnlyConfig, EncoderOnly, EncoderOnlyConfig
from tsformer.nn.positional import RotaryEmbedding, SinusoidalPositionalEncoding, build_positional

TINY = {"d_model": 32, "n_heads": 4, "n_layers": 2}


def test_rope_score_depends_only_on_the_offset():
    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim=16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        return (rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum().item()

    for m, n in [(5, 2), (40, 3), (0, 17)]:
        for shift in (1, 7, 100):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-4)
    assert abs(score(5, 2) - score(5, 3)) > 1e-3  # and it does depend on the offset


def test_rope_preserves_norms_and_base_is_configurable():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 10, 16)
    pos = torch.arange(10)
    rotated = RotaryEmbedding(16)(x, pos)
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert torch.allclose(rotated[:, :, 0], x[:, :, 0])  # position 0: no rotation
    assert not torch.allclose(RotaryEmbedding(16, base=100.0)(x, pos), rotated)


def test_sinusoidal_values():
    pe = SinusoidalPositionalEncoding(8).encoding(torch.arange(3))
    assert pe.shape == (3, 8)
    assert torch.allclose(pe[0], torch.tensor([0.0, 1.0] * 4))
    assert pe[1, 0] == pytest.approx(torch.sin(torch.tensor(1.0)).item())
    assert pe[2, 2] == pytest.approx(torch.sin(torch.tensor(2 / 10000 ** (2 / 8))).item(), abs=1e-6)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "none"])
def test_encoder_is_permutation_equivariant_only_without_positions(positional):
    torch.manual_seed(0)
    model = EncoderOnly(EncoderOnlyConfig(d_in=3, d_out=2, positional=positional, **TINY)).eval()
    x = torch.randn(2, 12, 3)
    perm = torch.randperm(12)
    with torch.no_grad():
        diff = (model(x)[:, perm] - model(x[:, perm])).abs().max().item()
    if positional == "none":
        assert diff < 1e-5
    else:
        assert diff > 1e-3


def test_sinusoidal_runs_at_four_times_the_training_length():
    torch.manual_seed(0)
    train_len = 24
    enc = EncoderOnly(EncoderOnlyConfig(d_in=3, positional="sinusoidal", **TINY)).eval()
    out = enc(torch.randn(2, 4 * train_len, 3))
    assert out.shape == (2, 96, 1) and torch.isfinite(out).all()
    dec = DecoderOnly(DecoderOnlyConfig(d_target=1, d_known=2, positional="sinusoidal", **TINY)).eval()
    y = dec.generate(
        torch.randn(2, train_len, 1), torch.randn(2, train_len, 2), torch.randn(2, 3 * train_len, 2)
    )
    assert y.shape == (2, 72, 1) and torch.isfinite(y).all()


def test_learned_refuses_inputs_longer_than_max_len_at_the_entry(monkeypatch):
    enc = EncoderOnly(EncoderOnlyConfig(d_in=3, positional="learned", max_len=16, **TINY))
    enc(torch.randn(1, 16, 3))  # exactly max_len is fine
    with pytest.raises(ValueError, match=r"needs 17 positions.*max_len=16"):
        enc(torch.randn(1, 17, 3))

    dec = DecoderOnly(DecoderOnlyConfig(d_target=1, positional="learned", max_len=16, **TINY))
    calls = []
    monkeypatch.setattr(dec.decoder, "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(ValueError, match="max_len=16"):
        dec.generate(torch.randn(1, 10, 1), horizon=8)  # 10 + 8 - 1 = 17 tokens
    assert calls == []  # refused before the decoder ran once


def test_unknown_positional_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown positional encoding 'alibi'"):
        build_positional("alibi", 32, 8, 16, 10000.0)
