"""The three families: causality, padding, cached == uncached generation, and that they learn."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from tsformer.models import (
    DecoderOnly,
    DecoderOnlyConfig,
    EncoderDecoder,
    EncoderDecoderConfig,
    EncoderOnly,
    EncoderOnlyConfig,
)
from tsformer.nn.masks import lengths_to_valid

TINY = {"d_model": 32, "n_heads": 4, "n_layers": 2}
POSITIONALS = ["sinusoidal", "learned", "rope", "none"]
NORMS = ["pre", "post"]


def dec_only(positional="sinusoidal", norm="pre", **kw):
    torch.manual_seed(0)
    cfg = DecoderOnlyConfig(d_target=2, d_known=3, positional=positional, norm=norm, max_len=64, **TINY, **kw)
    return DecoderOnly(cfg).eval()


def enc_dec(positional="sinusoidal", norm="pre", **kw):
    torch.manual_seed(0)
    cfg = EncoderDecoderConfig(
        d_enc_in=5, d_target=2, d_known=3, positional=positional, norm=norm, max_len=64, **TINY, **kw
    )
    return EncoderDecoder(cfg).eval()


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("norm", NORMS)
def test_decoder_only_is_causal(positional, norm):
    model = dec_only(positional, norm)
    y, k = torch.randn(2, 16, 2), torch.randn(2, 16, 3)
    t = 9
    y2, k2 = y.clone(), k.clone()
    y2[:, t + 1 :] += 5.0
    k2[:, t + 1 :] -= 3.0
    with torch.no_grad():
        a, b = model(y, k), model(y2, k2)
    assert (a[:, : t + 1] - b[:, : t + 1]).abs().max() <= 1e-6
    assert (a[:, t + 1 :] - b[:, t + 1 :]).abs().max() > 1e-3  # the change is seen where allowed


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("norm", NORMS)
def test_encoder_decoder_decoder_is_causal(positional, norm):
    model = enc_dec(positional, norm)
    hist, last = torch.randn(2, 12, 5), torch.randn(2, 2)
    fut_y, fut_k = torch.randn(2, 10, 2), torch.randn(2, 10, 3)
    t = 4
    fut_y2, fut_k2 = fut_y.clone(), fut_k.clone()
    fut_y2[:, t:] += 5.0  # decoder input of step t+1 onwards is fut_y[t]
    fut_k2[:, t + 1 :] -= 3.0
    with torch.no_grad():
        a = model(hist, last, fut_y, fut_k)
        b = model(hist, last, fut_y2, fut_k2)
    assert (a[:, : t + 1] - b[:, : t + 1]).abs().max() <= 1e-6
    assert (a[:, t + 1 :] - b[:, t + 1 :]).abs().max() > 1e-3


@pytest.mark.parametrize("positional", POSITIONALS)
def test_padding_leaves_real_steps_unchanged(positional):
    torch.manual_seed(0)
    n, pad = 10, 6
    x = torch.randn(2, n, 3)
    padded = torch.cat([x, 100 * torch.randn(2, pad, 3)], dim=1)  # junk on the padded steps
    valid = lengths_to_valid(torch.tensor([n, n]), n + pad)
    enc = EncoderOnly(EncoderOnlyConfig(d_in=3, d_out=2, positional=positional, **TINY)).eval()
    with torch.no_grad():
        assert (enc(x) - enc(padded, valid)[:, :n]).abs().max() <= 1e-5
        assert (enc(x) - enc(padded)[:, :n]).abs().max() > 1e-3  # without the mask it does change
    pooled = EncoderOnly(
        EncoderOnlyConfig(d_in=3, head="classification", pooling="mean", positional=positional, **TINY)
    ).eval()
    with torch.no_grad():
        assert (pooled(x) - pooled(padded, valid)).abs().max() <= 1e-5


@pytest.mark.parametrize("positional", ["rope", "none"])
def test_encoder_decoder_left_padded_history(positional):
    """Histories of different lengths are padded on the LEFT, so that the future stays right after
    the last real step on the shared time axis. With relative (RoPE) or no positions, the padding
    under its mask leaves the forecast unchanged. (Absolute encodings number the steps from the
    start of the padded window, so there the padding moves the real steps to other positions.)"""
    model = enc_dec(positional)
    torch.manual_seed(1)
    n, pad = 10, 4
    hist = torch.randn(2, n, 5)
    hist_padded = torch.cat([100 * torch.randn(2, pad, 5), hist], dim=1)
    valid = torch.cat([torch.zeros(2, pad, dtype=torch.bool), torch.ones(2, n, dtype=torch.bool)], dim=1)
    last, fut_y, fut_k = torch.randn(2, 2), torch.randn(2, 4, 2), torch.randn(2, 4, 3)
    with torch.no_grad():
        assert (
            model.generate(hist, last, fut_k) - model.generate(hist_padded, last, fut_k, hist_valid=valid)
        ).abs().max() <= 1e-5
        assert (
            model(hist, last, fut_y, fut_k) - model(hist_padded, last, fut_y, fut_k, valid)
        ).abs().max() <= 1e-5
        assert (model(hist, last, fut_y, fut_k) - model(hist_padded, last, fut_y, fut_k)).abs().max() > 1e-3


CASES = list(itertools.product(POSITIONALS, NORMS, [True, False]))


@pytest.mark.parametrize("positional,norm,fused", CASES)
@pytest.mark.parametrize("patch_len", [None, 4])
def test_decoder_only_cached_equals_uncached(positional, norm, fused, patch_len):
    """Generated step by step (patch_len=4: a patch at a time), with and without the cache; both equal
    a teacher-forced pass fed with the generated values."""
    model = dec_only(positional, norm, fused_attention=fused, patch_len=patch_len)
    torch.manual_seed(1)
    hist_y, hist_k, fut_k = torch.randn(3, 20, 2), torch.randn(3, 20, 3), torch.randn(3, 16, 3)
    cached = model.generate(hist_y, hist_k, fut_k, use_cache=True)
    uncached = model.generate(hist_y, hist_k, fut_k, use_cache=False)
    assert cached.shape == (3, 16, 2)
    assert (cached - uncached).abs().max() <= 1e-5
    prev, known, labels = model.teacher_forcing(
        torch.cat([hist_y, cached], dim=1), torch.cat([hist_k, fut_k], dim=1)
    )
    P = patch_len or 1
    assert prev.shape == (3, 36 - P, 2) and torch.equal(labels[:, -16:], cached)  # labels start one patch in
    with torch.no_grad():
        tf = model(prev, known)[:, -16:]
    assert (tf - cached).abs().max() <= 1e-5


@pytest.mark.parametrize("positional", POSITIONALS)
def test_decoder_only_patch_reads_nothing_of_its_own_patch(positional):
    """Output step i predicts target i + P from the inputs of its patch and before: a change of input
    step t moves the outputs of t's patch and later ones, never those of earlier patches."""
    model = dec_only(positional, patch_len=4)
    y, k = torch.randn(2, 16, 2), torch.randn(2, 16, 3)
    t = 9  # in patch 2 (steps 8..11)
    y2, k2 = y.clone(), k.clone()
    y2[:, t] += 5.0
    k2[:, t] -= 3.0
    with torch.no_grad():
        a, b = model(y, k), model(y2, k2)
    assert (a[:, :8] - b[:, :8]).abs().max() <= 1e-6
    assert (a[:, 8:12] - b[:, 8:12]).abs().min() > 0  # the whole patch moves together
    with pytest.raises(ValueError, match="not a whole number of patches of patch_len=4"):
        model.generate(y[:, :10], k[:, :10], k[:, :8])
    with pytest.raises(ValueError, match="patch_stride must be null or equal patch_len"):
        DecoderOnlyConfig(patch_len=4, patch_stride=2)


@pytest.mark.parametrize("positional,norm,fused", CASES)
@pytest.mark.parametrize("start_token", ["last", "go"])
def test_encoder_decoder_cached_equals_uncached(positional, norm, fused, start_token):
    model = enc_dec(positional, norm, fused_attention=fused, start_token=start_token)
    torch.manual_seed(1)
    hist, last, fut_k = torch.randn(3, 20, 5), torch.randn(3, 2), torch.randn(3, 15, 3)
    cached = model.generate(hist, last, fut_k, use_cache=True)
    uncached = model.generate(hist, last, fut_k, use_cache=False)
    assert cached.shape == (3, 15, 2)
    assert (cached - uncached).abs().max() <= 1e-5
    with torch.no_grad():
        tf = model(hist, last, cached, fut_k)  # teacher forcing on its own predictions
    assert (tf - cached).abs().max() <= 1e-5


@pytest.mark.parametrize("positional", POSITIONALS)
def test_decoder_patches_of_one_step_are_the_step_tokens(positional):
    """`decoder_patch_len=1` is the one-token-per-step decoder of `feed_back=False`, to the bit."""
    torch.manual_seed(1)
    hist, last, fut_k = torch.randn(3, 20, 5), torch.randn(3, 2), torch.randn(3, 15, 3)
    steps = enc_dec(positional, feed_back=False).generate(hist, last, fut_k)
    patches = enc_dec(positional, feed_back=False, decoder_patch_len=1).generate(hist, last, fut_k)
    assert torch.equal(steps, patches)


@pytest.mark.parametrize("positional", POSITIONALS)
def test_decoder_patch_tokens_predict_their_steps(positional):
    """`decoder_patch_len=P`: ceil(M / P) decoder tokens; token j reads the known covariates of its own
    P steps (and, causally, of the patches before) and predicts those steps; a last partial patch gives
    exactly the M steps asked for; the training pass is the forecast."""
    P, M = 4, 14  # 4 tokens, the last one half a patch
    model = enc_dec(positional, feed_back=False, decoder_patch_len=P)
    tokens = []
    model.dec_proj.register_forward_hook(lambda mod, inp, out: tokens.append(out.shape[1]))
    torch.manual_seed(1)
    hist, last, fut_k = torch.randn(3, 20, 5), torch.randn(3, 2), torch.randn(3, M, 3)
    out = model.generate(hist, last, fut_k)
    assert out.shape == (3, M, 2) and tokens == [4]
    with torch.no_grad():
        assert torch.equal(model(hist, last, torch.randn(3, M, 2), fut_k), out)  # no future value read
    changed = fut_k.clone()
    changed[:, 9] += 1.0  # a covariate of step 9: patch 2 (steps 8 .. 11)
    diff = (model.generate(hist, last, changed) - out).abs().amax(dim=(0, 2))  # (M,)
    assert diff[:8].max() == 0  # the patches before it never see it
    assert (diff[8:12] > 0).all()  # every step of its own patch reads it


def test_decoder_patches_need_a_decoder_that_feeds_nothing_back():
    with pytest.raises(ValueError, match="model.net.decoder_patch_len=4 needs model.net.feed_back=false"):
        enc_dec(decoder_patch_len=4)


def test_generate_without_covariates_takes_a_horizon():
    torch.manual_seed(0)
    dec = DecoderOnly(DecoderOnlyConfig(d_target=1, **TINY)).eval()
    assert dec.generate(torch.randn(2, 8, 1), horizon=5).shape == (2, 5, 1)
    ed = EncoderDecoder(EncoderDecoderConfig(d_enc_in=1, d_target=1, **TINY)).eval()
    assert ed.generate(torch.randn(2, 8, 1), torch.randn(2, 1), horizon=5).shape == (2, 5, 1)
    with pytest.raises(ValueError, match="horizon"):
        dec.generate(torch.randn(2, 8, 1))


# --- they learn: a few hundred steps on small synthetic problems --------------------------------


Y_MEAN, Y_STD = 0.70, 0.71


def synthetic_series(n_series, length, seed=0):
    """A driven, lagged system: known input u (steps and a sine), target y follows u with inertia.

    y is standardised with fixed constants (measured on a large sample), so that train and test
    series share one scale and predicting 0 is predicting the mean.
    """
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(length).float()
    freq = 0.05 + 0.1 * torch.rand(n_series, 1, generator=g)
    phase = 6.28 * torch.rand(n_series, 1, generator=g)
    steps = torch.sign(torch.sin(0.031 * t + phase * 3))
    u = torch.sin(freq * t + phase) + 0.5 * steps  # (S, L)
    y = torch.zeros_like(u)
    for i in range(1, length):
        y[:, i] = 0.8 * y[:, i - 1] + 0.2 * (u[:, i] ** 2 - 0.3 * u[:, i])
    y = (y - Y_MEAN) / Y_STD
    return u.unsqueeze(-1), y.unsqueeze(-1)  # (S, L, 1) each


def train(model, loss_fn, n_samples, steps=300, lr=3e-3, batch_size=32):
    """Minibatch AdamW; `loss_fn(idx)` computes the loss of the samples `idx`."""
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = loss_fn(torch.randint(0, n_samples, (batch_size,), generator=g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return loss.item()


@pytest.mark.slow
def test_encoder_only_reconstructs_states():
    torch.manual_seed(0)
    u, y = synthetic_series(64, 32)
    model = EncoderOnly(EncoderOnlyConfig(d_in=1, d_out=1, **TINY))
    train(model, lambda i: F.mse_loss(model(u[i]), y[i]), len(u))
    with torch.no_grad():
        u_test, y_test = synthetic_series(32, 32, seed=1)
        mse = F.mse_loss(model(u_test), y_test).item()
    mean_mse = F.mse_loss(torch.zeros_like(y_test), y_test).item()
    assert mse < 0.2 * mean_mse, (mse, mean_mse)


@pytest.mark.slow
def test_encoder_only_classifies_sequences():
    torch.manual_seed(0)
    n = 256
    labels = torch.randint(0, 2, (n,))
    x = torch.randn(n, 16, 2)
    x[labels == 1, 8:, 0] += 1.5  # class 1: a level shift in the second half
    for pooling in ("cls", "mean"):
        model = EncoderOnly(
            EncoderOnlyConfig(d_in=2, head="classification", pooling=pooling, n_classes=2, **TINY)
        )
        # train calls the loss within this iteration, while `model` is this one
        train(model, lambda i: F.cross_entropy(model(x[i]), labels[i]), n, steps=150)  # noqa: B023
        with torch.no_grad():
            loss = F.cross_entropy(model(x), labels).item()
        assert loss < 0.3 * torch.log(torch.tensor(2.0)).item(), (pooling, loss)


@pytest.mark.slow
def test_decoder_only_learns_to_forecast():
    torch.manual_seed(0)
    u, y = synthetic_series(64, 48)
    model = DecoderOnly(DecoderOnlyConfig(d_target=1, d_known=1, **TINY))

    def loss_fn(i):
        y_prev, known, labels = model.teacher_forcing(y[i], u[i])
        return F.mse_loss(model(y_prev, known), labels)

    train(model, loss_fn, len(y), steps=150)  # well inside the bound (benchmarks/RESULTS_test_suite.md)
    u_t, y_t = synthetic_series(32, 48, seed=1)
    pred = model.generate(y_t[:, :32], u_t[:, :32], u_t[:, 32:])
    mse = F.mse_loss(pred, y_t[:, 32:]).item()
    mean_mse = F.mse_loss(torch.zeros_like(pred), y_t[:, 32:]).item()
    assert mse < 0.2 * mean_mse, (mse, mean_mse)


@pytest.mark.slow
def test_encoder_decoder_and_forecast_head_learn_to_forecast():
    torch.manual_seed(0)
    n, m = 24, 24
    u, y = synthetic_series(64, n + m)
    hist = torch.cat([y[:, :n], u[:, :n]], dim=-1)  # (S, N, 2)
    ed = EncoderDecoder(EncoderDecoderConfig(d_enc_in=2, d_target=1, d_known=1, **TINY))
    # 150 steps each: inside both bounds with 300's margins (benchmarks/RESULTS_test_suite.md)
    train(ed, lambda i: F.mse_loss(ed(hist[i], y[i, n - 1], y[i, n:], u[i, n:]), y[i, n:]), len(y), steps=150)
    # the flatten + linear head has N * d_model * M weights: it needs more series not to overfit
    u_many, y_many = synthetic_series(512, n + m, seed=2)
    hist_many = torch.cat([y_many[:, :n], u_many[:, :n]], dim=-1)
    head = EncoderOnly(EncoderOnlyConfig(d_in=2, d_out=1, head="forecast", context_len=n, horizon=m, **TINY))
    train(head, lambda i: F.mse_loss(head(hist_many[i]), y_many[i, n:]), len(y_many), steps=150)

    u_t, y_t = synthetic_series(32, n + m, seed=1)
    hist_t = torch.cat([y_t[:, :n], u_t[:, :n]], dim=-1)
    mean_mse = F.mse_loss(torch.zeros_like(y_t[:, n:]), y_t[:, n:]).item()
    ed_mse = F.mse_loss(ed.generate(hist_t, y_t[:, n - 1], u_t[:, n:]), y_t[:, n:]).item()
    with torch.no_grad():
        head_mse = F.mse_loss(head(hist_t), y_t[:, n:]).item()
    assert ed_mse < 0.2 * mean_mse, (ed_mse, mean_mse)
    assert head_mse < 0.5 * mean_mse, (head_mse, mean_mse)


def test_linear_skip_adds_a_per_step_linear_map_of_the_inputs():
    torch.manual_seed(0)
    model = EncoderOnly(EncoderOnlyConfig(d_in=3, d_out=2, linear_skip=True, **TINY)).eval()
    x = torch.randn(2, 7, 3)
    with torch.no_grad():
        transformer_only = model.head(model.encode(x))
        assert torch.allclose(model(x), transformer_only + model.linear_skip(x), atol=1e-6)
    with pytest.raises(ValueError, match="linear_skip belongs to the per_step head"):
        EncoderOnly(EncoderOnlyConfig(d_in=3, head="classification", linear_skip=True, **TINY))


@pytest.mark.parametrize("norm", NORMS)
def test_batch_norm_layer_normalises_each_feature_over_the_batch_tokens(norm):
    """norm_layer=batch (PatchTST's encoder): in training each feature is standardised over all B * T
    tokens; in eval the running statistics are used, so a window's output no longer depends on the
    other windows of its batch."""
    from tsformer.nn.blocks import BatchNormOverTokens, TransformerStack
    from tsformer.nn.config import TransformerConfig

    torch.manual_seed(0)
    norm_module = BatchNormOverTokens(8).train()
    x = torch.randn(4, 10, 8) * torch.arange(1, 9) + 3.0  # (B, T, D): features of different scales
    out = norm_module(x)
    flat = out.reshape(-1, 8)
    assert torch.allclose(flat.mean(0), torch.zeros(8), atol=1e-5)
    assert torch.allclose(flat.var(0, unbiased=False), torch.ones(8), atol=1e-3)

    cfg = TransformerConfig(norm=norm, norm_layer="batch", **TINY)
    stack = TransformerStack(cfg, cfg.n_layers)
    assert any(isinstance(m, torch.nn.BatchNorm1d) for m in stack.modules())
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in stack.modules())
    h = torch.randn(6, 12, 32)
    for _ in range(3):
        stack.train()(h)  # running statistics move from their start values
    stack.eval()
    alone = stack(h[:1])
    in_batch = stack(h)[:1]
    assert torch.allclose(alone, in_batch, atol=1e-5)


def test_batch_norm_layer_is_refused_where_it_would_mix_steps():
    from tsformer.nn.blocks import TransformerStack
    from tsformer.nn.config import TransformerConfig

    cfg = TransformerConfig(norm_layer="batch", **TINY)
    with pytest.raises(ValueError, match="norm_layer=batch is for encoders only"):
        TransformerStack(cfg, 2, causal=True)
    with pytest.raises(ValueError, match="norm_layer=batch is for encoders only"):
        dec_only(norm_layer="batch")
    stack = TransformerStack(cfg, 2)
    valid = lengths_to_valid(torch.tensor([12, 9]), 12)
    with pytest.raises(ValueError, match="padded steps"):
        stack(torch.randn(2, 12, 32), mask=valid)
    with pytest.raises(ValueError, match="unknown model.net.norm_layer 'group'"):
        TransformerStack(TransformerConfig(norm_layer="group", **TINY), 2)


@pytest.mark.parametrize("norm", NORMS)
def test_residual_attention_carries_each_blocks_scores_to_the_next(norm):
    """model.net.residual_attention (PatchTST's encoder): block 0 gets no previous scores, each later
    block gets exactly the scores the block before it returned; with one block it is plain attention."""
    from tsformer.nn.blocks import TransformerStack
    from tsformer.nn.config import TransformerConfig

    torch.manual_seed(0)
    stack = TransformerStack(TransformerConfig(norm=norm, residual_attention=True, **TINY), 3).eval()
    plain = TransformerStack(TransformerConfig(norm=norm, **TINY), 3).eval()
    plain.load_state_dict(stack.state_dict())
    calls = []
    hooks = [
        block.self_attn.register_forward_hook(
            lambda m, args, kw, out: calls.append((kw["prev_scores"], out[1])), with_kwargs=True
        )
        for block in stack.blocks
    ]
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        out = stack(x)
        assert calls[0][0] is None
        for (_, given), (received, _) in itertools.pairwise(calls):
            assert received is given
        assert not torch.allclose(out, plain(x), atol=1e-3)  # the carried scores change the output
    for hook in hooks:
        hook.remove()

    one = TransformerStack(TransformerConfig(norm=norm, residual_attention=True, **TINY), 1).eval()
    one_plain = TransformerStack(TransformerConfig(norm=norm, **TINY), 1).eval()
    one_plain.load_state_dict(one.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(one(x), one_plain(x), atol=1e-5, rtol=1e-5)


def test_residual_attention_is_refused_in_decoder_stacks():
    from tsformer.nn.blocks import TransformerStack
    from tsformer.nn.config import TransformerConfig

    with pytest.raises(ValueError, match="residual_attention=true is for encoders only"):
        TransformerStack(TransformerConfig(residual_attention=True, **TINY), 2, causal=True)
    with pytest.raises(ValueError, match="residual_attention=true is for encoders only"):
        dec_only(residual_attention=True)
    with pytest.raises(ValueError, match="residual_attention=true is for encoders only"):
        enc_dec(residual_attention=True)


def test_learned_positions_with_patches_are_checked_from_the_shapes():
    """Patches 8/8 over 32 steps start at 0, 8, .., 32 (the end padding's patch): a learned table
    needs 33 positions. With 32 it is refused by name before any lookup, in both families that take
    patch tokens in an encoder."""
    x = torch.randn(2, 32, 3)
    common = dict(positional="learned", patch_len=8, patch_stride=8, **TINY)
    for max_len, ok in ((33, True), (32, False)):
        encoder_only = EncoderOnly(
            EncoderOnlyConfig(d_in=3, head="forecast", context_len=32, horizon=4, max_len=max_len, **common)
        )
        encoder_decoder = EncoderDecoder(EncoderDecoderConfig(d_enc_in=3, max_len=max_len, **common))
        for run in (lambda: encoder_only(x), lambda: encoder_decoder.encode(x)):  # noqa: B023 (called now)
            if ok:
                run()
            else:
                with pytest.raises(ValueError, match="needs 33 positions .* max_len=32"):
                    run()
