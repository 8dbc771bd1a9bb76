"""Encoder-decoder Transformer: N -> M sequence-to-sequence forecasting.

The encoder reads N history steps (targets and covariates) with bidirectional attention and
compresses them into a memory `(B, N, d_model)`. The decoder produces the M future steps one at a
time: its token for future step m embeds the target of step m - 1 and the known covariates of step
m; causal self-attention looks at the decoder's earlier steps and cross-attention (Q from the
decoder, K/V from the memory) looks back at the history at every step. The first decoder token
carries the last observed target (`start_token="last"`) or a learned `[GO]` vector (`"go"`).

Encoder and decoder share one time axis: history steps sit at positions 0..N-1 and future steps at
N..N+M-1, for every positional encoding. With RoPE this holds in cross-attention too, so a decoder
query knows how far back each memory step lies.

Training is teacher-forced (`forward`): the decoder input is the true future shifted right by one
step. `generate` feeds predictions back, caching the decoder's self-attention K/V and computing the
cross-attention K/V of the memory once.

`feed_back=False`: every decoder token carries the last observed target instead of the step before
it (and the known covariates of its own step), so no future value is ever an input: training and
`generate` run the same single pass over the M steps (no teacher forcing, nothing fed back; with a
distribution head the steps of a sampled path are drawn independently). Why: on
ETTh1 the teacher-forced decoder learns to copy the true previous value it is handed, and generating
from its own values it then follows persistence (benchmarks/RESULTS_forecast_families.md).
With `feed_back=False`, `decoder_patch_len` P gives the decoder one token per P future steps instead of
one per step: token j carries the last observed target and the known covariates of steps jP .. jP + P - 1,
sits at the position of step jP, and predicts those P steps. Its self-attention then costs (M / P)^2, not
M^2 (the largest cost of a long horizon's step: benchmarks/RESULTS_forecast_families.md). A last partial
patch has its missing covariates as zeros and its extra outputs dropped.

With `patch_len`, the ENCODER reads patches of steps (`tsformer.nn.patching`; PatchTST): its memory
has L = floor((N - P) / S) + 2 tokens, each at the position of its first step on the shared axis.
The decoder keeps one token per future step (it generates step by step) unless `decoder_patch_len` says otherwise.

With a distribution head (`tsformer.nn.heads`) the network outputs `n_params` numbers per target
channel and `generate` takes `draw` (a step's output -> the value fed back) and `num_samples`: the
memory and the first decoder step are computed once per window, then the decoder's cache (its
self-attention K/V and the memory's cross-attention K/V) is shared by the window's S paths
(`KVCache.share`: kept once, not copied), which run on as one batch of B * S sequences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tsformer.nn.blocks import TransformerStack
from tsformer.nn.config import TransformerConfig
from tsformer.nn.conv_embedding import StridedTokens
from tsformer.nn.dropout import Dropout
from tsformer.nn.embedding import InputProjection, build_embedding, token_grid
from tsformer.nn.kv_cache import KVCache
from tsformer.nn.masks import padding_mask
from tsformer.nn.patching import Patching, n_step_positions, step_positions, token_features
from tsformer.nn.positional import build_positional

START_TOKENS = ("last", "go")


@dataclass
class EncoderDecoderConfig(TransformerConfig):
    d_enc_in: int = 1  # features per history step (targets and covariates)
    d_target: int = 1
    d_known: int = 0  # covariates known for the future steps
    n_decoder_layers: int | None = None  # None: as many as the encoder (n_layers)
    start_token: str = "last"  # "last": last observed target; "go": a learned [GO] token
    feed_back: bool = True  # False: every decoder token carries the last observed target (one pass)
    decoder_patch_len: int | None = None  # with feed_back=False: one decoder token per P future steps
    patch_len: int | None = None  # encoder tokens: None = one per history step; P = one per patch of P steps
    patch_stride: int | None = None  # S, steps between patch starts (None: = patch_len)
    n_params: int = (
        1  # outputs per target channel: 1 for a point forecast, the distribution's parameters otherwise
    )


class EncoderDecoder(nn.Module):
    def __init__(self, cfg: EncoderDecoderConfig):
        super().__init__()
        if cfg.start_token not in START_TOKENS:
            raise ValueError(f"unknown start_token {cfg.start_token!r}; choose one of {START_TOKENS}")
        P = cfg.decoder_patch_len
        if P is not None and (cfg.feed_back or P < 1):
            raise ValueError(
                f"model.net.decoder_patch_len={P} needs model.net.feed_back=false and a length >= 1 "
                "(a decoder that feeds its values back generates one step per token)"
            )
        self.dec_patch = P or 1  # future steps per decoder token
        self.cfg = cfg
        self.patching = Patching(cfg.patch_len, cfg.patch_stride) if cfg.patch_len else None
        self.enc_proj = build_embedding(cfg, token_features(self.patching, cfg.d_enc_in), self.patching)
        self.grid = token_grid(self.patching, self.enc_proj)  # patches, strided convolution, or None
        self.dec_proj = InputProjection(cfg.d_target + self.dec_patch * cfg.d_known, cfg.d_model)
        self.positional, rope = build_positional(
            cfg.positional, cfg.d_model, cfg.head_dim, cfg.max_len, cfg.rope_base
        )
        self.dropout = Dropout(cfg.dropout, cfg.fast_dropout)
        self.encoder = TransformerStack(cfg, cfg.n_layers, rope=rope)
        n_dec = cfg.n_decoder_layers or cfg.n_layers
        self.decoder = TransformerStack(cfg, n_dec, causal=True, cross_attention=True, rope=rope)
        self.go_token = nn.Parameter(torch.randn(cfg.d_model) * 0.02) if cfg.start_token == "go" else None
        self.head = nn.Linear(cfg.d_model, self.dec_patch * cfg.d_target * cfg.n_params)

    def memory_positions(self, n_hist: int, device=None) -> torch.Tensor:
        """`(L,)` positions of the memory tokens of a history of `n_hist` steps: its steps 0..N-1,
        or with patches the first step of each patch."""
        return step_positions(self.grid, n_hist, device=device)

    def encode(self, hist: torch.Tensor, hist_valid: torch.Tensor | None = None) -> torch.Tensor:
        """hist: `(B, N, d_enc_in)`, hist_valid: `(B, N)` bool -> memory `(B, L, d_model)`
        (L = N, or the number of patches)."""
        N = hist.shape[1]
        self.positional.check_length(n_step_positions(self.grid, N))
        positions = self.memory_positions(N, device=hist.device)  # (L,)
        if self.patching is not None:
            if hist_valid is not None:
                raise ValueError(
                    "patch tokens take whole histories: no padding mask (hist_valid) with patch_len"
                )
            hist = self.patching(hist)  # (B, N, d_enc_in) -> (B, L, P * d_enc_in)
        if isinstance(self.enc_proj, StridedTokens):
            h = self.enc_proj(hist, hist_valid)  # (B, L, d_model), padding kept out of the convolutions
            hist_valid = self.enc_proj.token_valid(hist_valid)
        else:
            h = self.enc_proj(hist)  # (B, L, d_model)
        h = self.dropout(self.positional(h, positions))
        mask = padding_mask(hist_valid) if hist_valid is not None else None
        return self.encoder(h, mask=mask, positions=positions)

    def decode(
        self,
        target_prev: torch.Tensor,
        known: torch.Tensor,
        memory: torch.Tensor,
        memory_valid: torch.Tensor | None = None,
        cache: KVCache | None = None,
        n_hist: int | None = None,
    ) -> torch.Tensor:
        """target_prev: `(B, T, Dy)`, known: `(B, T, Dk)` decoder inputs -> `(B, T, Dy * n_params)`.

        n_hist: the history's length N (the first future step sits at position N); needed with
        patches, where the memory has fewer tokens than the history has steps.
        With a cache, the T tokens continue after those already decoded. With `decoder_patch_len` P
        (`decode_direct`'s tokens), token j sits at step N + jP and its output holds P steps' values.
        """
        T = target_prev.shape[1]
        if n_hist is None:
            if self.patching is not None:
                raise ValueError("decode needs n_hist (the history's length) when the encoder reads patches")
            n_hist = memory.shape[1]
        N = n_hist
        start = cache.length if cache is not None else 0
        # after the history, a token every dec_patch steps; the last token's position must be known
        self.positional.check_length(N + (start + T - 1) * self.dec_patch + 1)
        positions = N + torch.arange(start, start + T, device=memory.device) * self.dec_patch
        if self.go_token is not None and start == 0:
            # the first token carries the [GO] vector instead of an observed target
            target_prev = torch.cat([torch.zeros_like(target_prev[:, :1]), target_prev[:, 1:]], dim=1)
        h = self.dec_proj(torch.cat([target_prev, known], dim=-1))  # (B, T, d_model)
        if self.go_token is not None and start == 0:
            h = torch.cat([h[:, :1] + self.go_token, h[:, 1:]], dim=1)
        h = self.dropout(self.positional(h, positions))
        if isinstance(self.enc_proj, StridedTokens):
            memory_valid = self.enc_proj.token_valid(memory_valid)  # steps -> the memory's tokens
        memory_mask = padding_mask(memory_valid) if memory_valid is not None else None
        h = self.decoder(
            h,
            positions=positions,
            memory=memory,
            memory_mask=memory_mask,
            memory_positions=self.memory_positions(N, device=memory.device),
            cache=cache,
        )
        return self.head(h)  # (B, T, dec_patch * Dy * n_params)

    def decode_direct(
        self,
        last_target: torch.Tensor,
        fut_known: torch.Tensor,
        memory: torch.Tensor,
        memory_valid: torch.Tensor | None,
        n_hist: int,
    ) -> torch.Tensor:
        """`feed_back=False`'s one pass: every decoder token carries the last observed target `(B, Dy)`
        and the known covariates `fut_known (B, M, Dk)` of its step (its P steps with `decoder_patch_len`)
        -> `(B, M, Dy * n_params)`."""
        B, M, Dk = fut_known.shape
        P = self.dec_patch
        T = -(-M // P)  # tokens: ceil(M / P)
        if T * P > M:  # a last partial patch: its missing steps' covariates are zeros
            fut_known = torch.cat([fut_known, fut_known.new_zeros(B, T * P - M, Dk)], dim=1)
        known = fut_known.reshape(B, T, P * Dk)  # (B, T, P * Dk): a token's steps side by side
        target_prev = last_target.unsqueeze(1).expand(B, T, -1)  # (B, T, Dy)
        out = self.decode(target_prev, known, memory, memory_valid, n_hist=n_hist)  # (B, T, P * Dy * n_p)
        return out.reshape(B, T * P, -1)[:, :M]  # (B, M, Dy * n_params)

    def forward(
        self,
        hist: torch.Tensor,
        last_target: torch.Tensor,
        fut_target: torch.Tensor,
        fut_known: torch.Tensor | None = None,
        hist_valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher forcing: predict `(B, M, Dy * n_params)` with the true future shifted right as decoder input.

        hist: `(B, N, d_enc_in)`; last_target: `(B, Dy)` the last observed target;
        fut_target: `(B, M, Dy)` the true future; fut_known: `(B, M, Dk)`.
        """
        B, M, _ = fut_target.shape
        if fut_known is None:
            fut_known = fut_target.new_zeros(B, M, 0)
        memory = self.encode(hist, hist_valid)
        if not self.cfg.feed_back:  # the future is never an input
            return self.decode_direct(last_target, fut_known, memory, hist_valid, n_hist=hist.shape[1])
        target_prev = torch.cat([last_target.unsqueeze(1), fut_target[:, :-1]], dim=1)  # (B, M, Dy)
        return self.decode(target_prev, fut_known, memory, hist_valid, n_hist=hist.shape[1])

    @torch.no_grad()
    def generate(
        self,
        hist: torch.Tensor,
        last_target: torch.Tensor,
        fut_known: torch.Tensor | None = None,
        horizon: int | None = None,
        hist_valid: torch.Tensor | None = None,
        use_cache: bool = True,
        draw: Callable[[torch.Tensor], torch.Tensor] | None = None,
        num_samples: int = 1,
        offset: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Roll out M future steps; M from `fut_known (B, M, Dk)` or `horizon`.

        draw: a step's output `(B', 1, Dy * n_params)` -> the value fed back `(B', 1, Dy)` (default:
        the output itself, a point forecast). num_samples: paths per window. offset: `(B, M, Dy * n_params)`
        added to step m's output before `draw` (what `forward`'s caller adds to its outputs: e.g. a linear
        forecast the network corrects). Returns the values fed back, `(B * num_samples, M, Dy)`, window b's
        paths in rows b * num_samples .. (b + 1) * num_samples - 1.
        """
        draw = draw or (lambda out: out)
        B = hist.shape[0]
        if fut_known is None:
            if horizon is None:
                raise ValueError("give fut_known (B, M, Dk) or horizon")
            fut_known = hist.new_zeros(B, horizon, 0)
        M, N = fut_known.shape[1], hist.shape[1]
        self.positional.check_length(N + M)  # refuse before any work is done
        memory = self.encode(hist, hist_valid)  # computed once for all steps
        if not self.cfg.feed_back:  # forward's one pass: nothing generated is an input
            out = self.decode_direct(last_target, fut_known, memory, hist_valid, n_hist=N)  # (B, M, Dy * n_p)
            out = out if offset is None else out + offset
            return draw(out.repeat_interleave(num_samples, dim=0))  # (B * S, M, Dy), steps drawn apart
        cache = KVCache(len(self.decoder.blocks), max_len=M, cross_attention=True) if use_cache else None
        target_prev = last_target.unsqueeze(1)  # (B, 1, Dy)
        out = self.decode(target_prev, fut_known[:, :1], memory, hist_valid, cache=cache, n_hist=N)[
            :, -1:
        ]  # (B, 1, Dy * P)
        if offset is None:
            offset = out.new_zeros(B, M, out.shape[-1])
        out = out + offset[:, :1]
        if num_samples > 1:  # the first step is the same for every path of a window: computed once
            S = num_samples
            out, fut_known, target_prev, offset = (
                x.repeat_interleave(S, dim=0) for x in (out, fut_known, target_prev, offset)
            )
            if cache is not None:
                cache.share(
                    S
                )  # memory and hist_valid stay (B, ...): the shared cross-attention K/V are the memory's
            else:  # the reference path re-reads the memory at every step: one copy per path
                memory = memory.repeat_interleave(S, dim=0)
                hist_valid = hist_valid.repeat_interleave(S, dim=0) if hist_valid is not None else None
        next_value = draw(out)  # (B * S, 1, Dy)
        values = [next_value]
        for m in range(1, M):
            if use_cache:
                out = self.decode(
                    next_value, fut_known[:, m : m + 1], memory, hist_valid, cache=cache, n_hist=N
                )
            else:
                target_prev = torch.cat([target_prev, next_value], dim=1)  # (B * S, m + 1, Dy)
                out = self.decode(target_prev, fut_known[:, : m + 1], memory, hist_valid, n_hist=N)[:, -1:]
            next_value = draw(out + offset[:, m : m + 1])
            values.append(next_value)
        return torch.cat(values, dim=1)  # (B * S, M, Dy)
