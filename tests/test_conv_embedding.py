"""The convolutional token embeddings (`model.net.embedding=conv` and `multiscale`): padding never leaks in,
token grid, refusals."""

import pytest
import torch

from tsformer.models import (
    DecoderOnly,
    DecoderOnlyConfig,
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderOnly,
    EncoderOnlyConfig,
)
from tsformer.nn.conv_embedding import ConvEmbedding
from tsformer.nn.masks import lengths_to_valid
from tsformer.nn.multiscale_embedding import MultiScaleEmbedding

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "embedding": "conv"}
STEMS = {
    "conv": lambda stride: ConvEmbedding(3, 16, kernels=(8, 5, 3), stride=stride),
    # a bottleneck narrower than the input, so every branch of the first module is exercised
    "multiscale": lambda stride: MultiScaleEmbedding(3, 16, kernels=(3, 6, 9), stride=stride, bottleneck=2),
}


def padded_batch(lengths, pad_to, d=3, seed=0):
    """Samples of `lengths` alone, and the same padded to `pad_to` steps with junk, with their mask."""
    g = torch.Generator().manual_seed(seed)
    alone = [torch.randn(1, n, d, generator=g) for n in lengths]
    batch = 100 * torch.randn(len(lengths), pad_to, d, generator=g)  # junk on the padded steps
    for b, x in enumerate(alone):
        batch[b, : x.shape[1]] = x[0]
    return alone, batch, lengths_to_valid(torch.tensor(lengths), pad_to)


@pytest.mark.parametrize("stem", STEMS)
@pytest.mark.parametrize("stride", [1, 3])
def test_a_sample_alone_equals_it_among_longer_padded_ones(stem, stride):
    torch.manual_seed(0)
    emb = STEMS[stem](stride)
    lengths = [5, 11, 17]
    alone, batch, valid = padded_batch(lengths, 20)
    with torch.no_grad():
        tokens = emb(batch, valid)  # (3, ceil(20 / S), 16)
        token_valid = emb.token_valid(valid)
        for b, x in enumerate(alone):
            own = emb(x)  # (1, ceil(n / S), 16)
            assert own.shape[1] == emb.count(lengths[b]) == int(token_valid[b].sum())
            assert (own[0] - tokens[b, : own.shape[1]]).abs().max() <= 1e-5
            assert tokens[b, own.shape[1] :].abs().max() == 0  # padded tokens carry nothing
        # without the mask the junk reaches the last real steps through the kernels
        leaked = emb(batch)
        n = lengths[0]
        assert (emb(alone[0])[0] - leaked[0, : emb.count(n)]).abs().max() > 1e-3


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("positional", ["sinusoidal", "rope", "none"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("embedding", ["conv", "multiscale"])
def test_classifier_probabilities_do_not_depend_on_padding(fused, positional, pooling, stride, embedding):
    torch.manual_seed(0)
    cfg = EncoderOnlyConfig(
        d_in=3, head="classification", n_classes=4, pooling=pooling, positional=positional,
        fused_attention=fused, conv_stride=stride, **{**TINY, "embedding": embedding},
    )  # fmt: skip
    model = EncoderOnly(cfg).eval()
    lengths = [7, 12, 4]
    alone, batch, valid = padded_batch(lengths, 15)
    with torch.no_grad():
        together = model(batch, valid)  # (3, 4)
        for b, x in enumerate(alone):
            assert (model(x)[0] - together[b]).abs().max() <= 1e-5


def test_fused_and_reference_attention_agree_over_conv_tokens():
    torch.manual_seed(0)
    kw = {"d_in": 3, "head": "classification", "n_classes": 3, "pooling": "mean", "conv_stride": 2, **TINY}
    fused = EncoderOnly(EncoderOnlyConfig(fused_attention=True, **kw)).eval()
    reference = EncoderOnly(EncoderOnlyConfig(fused_attention=False, **kw)).eval()
    reference.load_state_dict(fused.state_dict())
    _, batch, valid = padded_batch([9, 14], 14)
    with torch.no_grad():
        assert (fused(batch, valid) - reference(batch, valid)).abs().max() <= 1e-5


@pytest.mark.parametrize("stem", STEMS)
def test_strided_tokens_sit_at_every_stride_th_step(stem):
    emb = STEMS[stem](4)
    assert emb.count(10) == 3 and emb.positions(10).tolist() == [0, 4, 8] and emb.n_positions(10) == 9
    assert emb(torch.randn(2, 10, 3)).shape == (2, 3, 16)
    model = EncoderOnly(
        EncoderOnlyConfig(d_in=2, head="forecast", context_len=10, horizon=5, d_out=1, conv_stride=4, **TINY)
    )
    assert model(torch.randn(2, 10, 2)).shape == (2, 5, 1)  # the head flattens the 3 tokens


def test_encoder_decoder_reads_a_left_padded_history_through_the_convolutions():
    torch.manual_seed(0)
    cfg = EncoderDecoderConfig(d_enc_in=5, d_target=2, d_known=3, positional="rope", **TINY)
    model = EncoderDecoder(cfg).eval()
    n, pad = 10, 4
    hist = torch.randn(2, n, 5)
    hist_padded = torch.cat([100 * torch.randn(2, pad, 5), hist], dim=1)
    valid = torch.cat([torch.zeros(2, pad, dtype=torch.bool), torch.ones(2, n, dtype=torch.bool)], dim=1)
    last, fut_k = torch.randn(2, 2), torch.randn(2, 4, 3)
    with torch.no_grad():
        alone = model.generate(hist, last, fut_k)
        assert (alone - model.generate(hist_padded, last, fut_k, hist_valid=valid)).abs().max() <= 1e-5


def test_refusals():
    with pytest.raises(ValueError, match="causal decoder"):
        DecoderOnly(DecoderOnlyConfig(d_target=1, d_known=1, **TINY))
    with pytest.raises(ValueError, match="not patches"):
        EncoderOnly(EncoderOnlyConfig(d_in=1, head="classification", patch_len=4, **TINY))
    with pytest.raises(ValueError, match="per_step head gives one output per step"):
        EncoderOnly(EncoderOnlyConfig(d_in=1, head="per_step", conv_stride=2, **TINY))
    with pytest.raises(ValueError, match="unknown model.net.embedding"):
        EncoderOnly(EncoderOnlyConfig(d_in=1, **{**TINY, "embedding": "cnn"}))
    with pytest.raises(ValueError, match="multiscale reads steps, not patches"):
        EncoderOnly(
            EncoderOnlyConfig(
                d_in=1, head="classification", patch_len=4, **{**TINY, "embedding": "multiscale"}
            )
        )
    with pytest.raises(ValueError, match="too narrow for 4 branches"):
        MultiScaleEmbedding(1, 3, kernels=(3, 5, 7))
    with pytest.raises(ValueError, match="multiscale_kernels"):
        MultiScaleEmbedding(1, 16, kernels=())


def test_multiscale_kernels_span_the_same_time_on_tokens():
    """The first module reads the steps with the kernels as given; the others read tokens of S steps with
    kernels of ceil(k / S) tokens, and add their output to their input."""
    emb = MultiScaleEmbedding(1, 16, kernels=(9, 19, 39), stride=4, modules=3, bottleneck=8)
    first, *others = emb.blocks
    assert [b.kernel_size[0] for b in first.branches] == [9, 19, 39] and first.bottleneck is None
    assert all([b.kernel_size[0] for b in m.branches] == [3, 5, 10] for m in others)
    assert all(m.bottleneck.out_channels == 8 for m in others)  # the tokens' 16 channels narrowed to 8


def test_masked_pretraining_restores_the_strided_steps_of_each_token_and_ignores_padding():
    from test_pretraining import padded_batch
    from tsformer.tasks.pretraining import MaskedPretraining

    torch.manual_seed(0)
    net = {**TINY, "conv_stride": 3}
    task = MaskedPretraining(net, d_in=2, mask_ratio=0.5).eval()
    batch = padded_batch(lengths=(10, 7))
    hidden = task.hidden_of(batch, None)
    with torch.no_grad():
        out, true, scored = task.restore(batch, hidden)
        other, _, _ = task.restore(padded_batch(lengths=(10, 7), fill=1e3), hidden)
    assert out.shape == true.shape == scored.shape == (2, 4, 3 * 2)  # ceil(10 / 3) tokens of 3 steps x 2
    assert torch.equal(true[0, 1], batch["x"][0, 3:6].reshape(-1))  # token 1: steps 3, 4, 5
    assert int(scored.sum()) == int(hidden.sum())  # every hidden value scored once, padding never
    torch.testing.assert_close(out[scored], other[scored])  # padding is never read
