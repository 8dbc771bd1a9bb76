"""The relative position bias (`model.net.positional=relative_bias`, eRPE-like): a learned number per
offset and head on the attention scores; the fused path equals the reference, padding stays out."""

import pandas as pd
import pytest
import torch

from test_train_on_every_series import EVERY_SERIES, table_config
from tsformer.jobs.classification.classifier import Classifier
from tsformer.models import (
    DecoderOnly,
    DecoderOnlyConfig,
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderOnly,
    EncoderOnlyConfig,
)
from tsformer.nn.attention import residual_attention, scaled_dot_product_attention
from tsformer.nn.masks import causal_mask, lengths_to_valid, padding_mask
from tsformer.nn.positional import RelativePositionBias
from tsformer.train import run

B, H, T, DH = 3, 2, 7, 4
TINY = {"d_model": 16, "n_heads": H, "n_layers": 2}


def random_bias(module: torch.nn.Module, seed: int = 1) -> None:
    """Every relative-bias table of `module` filled with noise (they start at zero, as `none`)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, RelativePositionBias):
                m.table.copy_(torch.randn(m.table.shape, generator=g))


def test_the_bias_depends_only_on_the_offset_and_clamps_past_max_len():
    rel = RelativePositionBias(n_heads=H, max_len=4)
    random_bias(rel)
    pos = torch.arange(T) * 2  # strided tokens: steps 0, 2, 4, ...
    bias = rel(pos, pos)  # (H, T, T)
    assert bias.shape == (H, T, T)
    table = rel.table  # (H, 7): offsets -3 .. 3
    for m in range(T):
        for n in range(T):
            offset = max(-3, min(3, int(pos[m] - pos[n])))
            assert torch.equal(bias[:, m, n], table[:, offset + 3])
    assert not torch.equal(bias[0], bias[1])  # one number per head


def qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, DH, generator=g) for _ in range(3)]


def masks():
    valid = lengths_to_valid(torch.tensor([T, T - 3, 1]), T)
    no_key = padding_mask(valid).expand(B, 1, T, T).clone()
    no_key[0, :, 2] = False  # query 2 of sample 0 may attend nowhere: its output is 0
    return {"none": None, "padding": padding_mask(valid), "causal": causal_mask(T), "no key": no_key}


@pytest.mark.parametrize("kind", ["none", "padding", "causal", "no key"])
def test_fused_path_equals_the_reference_and_the_formula(kind):
    q, k, v = qkv()
    rel = RelativePositionBias(H, max_len=T)
    random_bias(rel)
    bias = rel(torch.arange(T), torch.arange(T))  # (H, T, T)
    mask = masks()[kind]
    fused, _ = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, fused=True)
    reference, weights = scaled_dot_product_attention(
        q, k, v, mask=mask, bias=bias, fused=False, return_weights=True
    )
    assert (fused - reference).abs().max() <= 1e-5
    scores = q @ k.transpose(-2, -1) / DH**0.5 + bias  # (B, H, T, T)
    allowed = torch.ones(B, 1, T, T, dtype=torch.bool) if mask is None else mask.expand(B, 1, T, T)
    expected = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    assert (weights - expected).abs().max() <= 1e-5  # the bias is in the scores, masked keys get 0
    no_bias, _ = scaled_dot_product_attention(q, k, v, mask=mask, fused=True)
    assert (fused - no_bias).abs().max() > 1e-2  # and it changes the output
    if kind == "no key":
        assert fused[0, :, 2].abs().max() == 0


def test_residual_attention_adds_the_bias_as_the_reference():
    q, k, v = qkv()
    bias = torch.randn(H, T, T)
    mask = masks()["padding"]
    out, _, scores = residual_attention(q, k, v, mask=mask, bias=bias)
    reference, _ = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, fused=False)
    assert (out - reference).abs().max() <= 1e-6
    plain = (q @ k.transpose(-2, -1) / DH**0.5).masked_fill(~mask, float("-inf"))
    assert torch.allclose(scores, plain + bias)  # the next layer's scores carry the bias


def classifier(fused: bool, residual: bool = False, embedding: str = "conv", positional="relative_bias"):
    cfg = EncoderOnlyConfig(
        d_in=2, head="classification", n_classes=3, pooling="mean", positional=positional,
        embedding=embedding, conv_stride=2, fused_attention=fused, residual_attention=residual, **TINY,
    )  # fmt: skip
    return EncoderOnly(cfg).eval()


def padded_batch(lengths, pad_to, seed=0):
    """Samples of `lengths` alone, and the same padded to `pad_to` steps with junk, with their mask."""
    g = torch.Generator().manual_seed(seed)
    alone = [torch.randn(1, n, 2, generator=g) for n in lengths]
    batch = 100 * torch.randn(len(lengths), pad_to, 2, generator=g)  # junk on the padded steps
    for b, x in enumerate(alone):
        batch[b, : x.shape[1]] = x[0]
    return alone, batch, lengths_to_valid(torch.tensor(lengths), pad_to)


@pytest.mark.parametrize("embedding", ["conv", "linear"])
def test_encoder_fused_equals_reference_and_padding_stays_out(embedding):
    torch.manual_seed(0)
    fused = classifier(fused=True, embedding=embedding)
    random_bias(fused)
    reference = classifier(fused=False, embedding=embedding)
    reference.load_state_dict(fused.state_dict())
    residual = classifier(fused=False, residual=True, embedding=embedding)
    residual.load_state_dict(fused.state_dict())
    lengths = [6, 13, 3]
    alone, batch, valid = padded_batch(lengths, 15)
    with torch.no_grad():
        together = fused(batch, valid)  # (3, n_classes)
        assert (together - reference(batch, valid)).abs().max() <= 1e-5
        for model in (fused, reference, residual):
            rows = model(batch, valid)
            for b, x in enumerate(alone):  # a sample alone equals it among longer, padded ones
                assert (model(x)[0] - rows[b]).abs().max() <= 1e-5


def test_the_bias_is_learned_and_moves_the_output():
    torch.manual_seed(0)
    model = classifier(fused=True)
    none = classifier(fused=True, positional="none")
    none.load_state_dict({k: v for k, v in model.state_dict().items() if "relative_bias" not in k})
    x = torch.randn(2, 12, 2)
    assert [n for n, _ in model.named_parameters() if "relative_bias" in n] == ["encoder.relative_bias.table"]
    with torch.no_grad():
        assert (model(x) - none(x)).abs().max() <= 1e-6  # the table starts at zero: as without positions
        random_bias(model)
        assert (model(x) - none(x)).abs().max() > 1e-3
    model.train()
    model(x).sum().backward()
    assert model.encoder.relative_bias.table.grad.abs().sum() > 0


def test_decoders_refuse_it():
    with pytest.raises(ValueError, match="relative_bias is for encoder-only models"):
        DecoderOnly(DecoderOnlyConfig(d_target=1, d_known=1, positional="relative_bias", **TINY))
    with pytest.raises(ValueError, match="relative_bias is for encoder-only models"):
        EncoderDecoder(
            EncoderDecoderConfig(d_enc_in=2, d_target=1, d_known=1, positional="relative_bias", **TINY)
        )


@pytest.mark.slow
def test_a_classifier_with_the_bias_trains_and_its_model_folder_predicts_as_the_run(tmp_path):
    cfg = table_config(
        tmp_path, *EVERY_SERIES, "model.net.positional=relative_bias", "model.net.embedding=conv",
        "trainer.max_epochs=2",
    )  # fmt: skip
    result = run(cfg)
    model = Classifier.load(result.model_folder)
    assert model.task.net.encoder.relative_bias.table.abs().max() > 0  # learned, saved and loaded
    frame = model.predict(pd.read_csv(tmp_path / "test.csv"))
    accuracy = (frame.y_pred.astype(str) == frame.y_true.astype(str)).mean()
    assert accuracy == pytest.approx(result.metrics["test/accuracy"])
