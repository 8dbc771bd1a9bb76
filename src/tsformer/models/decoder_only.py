"""Decoder-only Transformer: autoregressive forecasting with known future covariates.

Each time step is one token. The token of step t embeds what is known when step t is predicted:

    token_t = Embed(target_{t-1}, known_t)   ->   predicts target_t

(known_t: covariates known in advance, such as a weather forecast of wind speed and direction.
Past-only covariates, measured but not known ahead, are modelled as extra target channels: the model
predicts them too and feeds its own prediction back, exactly like the target.)

Training is teacher-forced: a window of L steps gives L - 1 tokens whose inputs are the TRUE
previous targets, all trained in one pass under the causal mask (`teacher_forcing`).
Inference (`generate`) feeds the model's own predictions back step by step. With the KV cache each
new step projects only the new token; without it the whole sequence is re-run every step. Both give
the same result (tested); the cache makes a step cost O(t) instead of O(t^2).

Patch tokens (`patch_len` P, TimesFM's design: Das et al., ICML 2024): a token is P steps side by
side instead of one, and generation goes a patch at a time:

    token_j = Embed(targets of patch j-1, known of patch j)   ->   predicts the P targets of patch j

P = 1 is the step-level model above. A window of T steps is T / P tokens, so attention costs
(T / P)^2 and a horizon of M steps takes M / P decoder passes; the price is that the P steps of a
patch are predicted together from what was known before it (with a distribution head, their draws
are independent given the earlier patches: a sampled path is joint from patch to patch only). The
history and the horizon must be whole patches. Token j sits at position j (patch index).

With a distribution head (`tsformer.nn.heads`) the network outputs `n_params` numbers per channel
and `generate` is given `draw`, which turns a step's output into the value fed back: the point value
for a deterministic rollout, a random draw for sampled trajectories. `num_samples` paths per window
run as one batch of B * S sequences; the history is run once per window and its K/V cache is
shared by the window's S paths, never copied (`KVCache.share`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tsformer.nn.blocks import TransformerStack
from tsformer.nn.config import TransformerConfig
from tsformer.nn.dropout import Dropout
from tsformer.nn.embedding import InputProjection
from tsformer.nn.kv_cache import KVCache
from tsformer.nn.masks import padding_mask
from tsformer.nn.positional import build_positional


@dataclass
class DecoderOnlyConfig(TransformerConfig):
    d_target: int = 1  # autoregressive channels: targets (and past-only covariates, if any)
    d_known: int = 0  # covariates known for the future
    n_params: int = 1  # outputs per channel: 1 for a point forecast, the distribution's parameters otherwise
    patch_len: int | None = None  # steps per token, side by side (None: 1, one token per step)
    patch_stride: int | None = None  # only None or = patch_len: generated patches cannot overlap

    def __post_init__(self):
        super().__post_init__()
        if self.patch_len is not None and self.patch_len < 1:
            raise ValueError(f"patch_len must be >= 1, got {self.patch_len}")
        if self.patch_stride is not None and self.patch_stride != self.patch_len:
            raise ValueError(
                f"the decoder-only family generates patches side by side: patch_stride must be null or equal "
                f"patch_len ({self.patch_len}), got {self.patch_stride}"
            )


class DecoderOnly(nn.Module):
    def __init__(self, cfg: DecoderOnlyConfig):
        super().__init__()
        self.cfg = cfg
        self.patch = cfg.patch_len or 1  # P steps per token
        if cfg.embedding != "linear":
            raise ValueError(
                f"model.net.embedding={cfg.embedding}: a convolution reads steps on both sides, which a causal "
                "decoder must not see; the decoder-only family takes embedding=linear"
            )
        self.input_proj = InputProjection(self.patch * (cfg.d_target + cfg.d_known), cfg.d_model)
        self.positional, rope = build_positional(
            cfg.positional, cfg.d_model, cfg.head_dim, cfg.max_len, cfg.rope_base
        )
        self.dropout = Dropout(cfg.dropout, cfg.fast_dropout)
        self.decoder = TransformerStack(cfg, cfg.n_layers, causal=True, rope=rope)
        self.head = nn.Linear(cfg.d_model, self.patch * cfg.d_target * cfg.n_params)

    def teacher_forcing(self, target: torch.Tensor, known: torch.Tensor):
        """A window `target (B, L, Dy)`, `known (B, L, Dk)` -> model inputs and labels of L - P steps.

        Returns `(target_prev (B, L-P, Dy), known (B, L-P, Dk), labels (B, L-P, Dy))`: the input of
        step t is the true target of step t - P and the known covariates of step t, and step t is
        trained on target t (P = 1: token t holds target t - 1 and predicts target t).
        """
        P = self.patch
        return target[:, :-P], known[:, P:], target[:, P:]

    def check_whole_patches(self, n_steps: int, what: str) -> None:
        if n_steps % self.patch:
            raise ValueError(
                f"{what} of {n_steps} steps is not a whole number of patches of patch_len={self.patch}"
            )

    def forward(
        self,
        target_prev: torch.Tensor,
        known: torch.Tensor | None = None,
        valid: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """target_prev: `(B, T, Dy)`, known: `(B, T, Dk)` -> predictions `(B, T, Dy * n_params)`.

        Step t of the output predicts the target of step t from target_prev up to the end of the
        patch before it (P = 1: up to step t) and the known covariates up to the end of its own
        patch. T must be whole patches. valid: `(B, T)` bool, True on real steps (padding; one token
        per step only). cache: continue after the tokens already in the cache (they come first).
        """
        B, T, _ = target_prev.shape
        P = self.patch
        self.check_whole_patches(T, "an input")
        if valid is not None and P > 1:
            raise ValueError("patch tokens take whole windows: no padding mask (valid) with patch_len")
        if known is None:
            known = target_prev.new_zeros(B, T, 0)
        K = T // P  # tokens
        start = cache.length if cache is not None else 0
        self.positional.check_length(start + K)
        positions = torch.arange(start, start + K, device=target_prev.device)
        tokens = torch.cat([target_prev, known], dim=-1)  # (B, T, Dy + Dk)
        tokens = tokens.reshape(B, K, P * tokens.shape[-1])  # (B, K, P * (Dy + Dk)), step-major in a patch
        h = self.dropout(self.positional(self.input_proj(tokens), positions))  # (B, K, d_model)
        mask = padding_mask(valid) if valid is not None else None
        h = self.decoder(h, mask=mask, positions=positions, cache=cache)
        return self.head(h).reshape(B, T, -1)  # (B, K, P * Dy * n_params) -> (B, T, Dy * n_params)

    @torch.no_grad()
    def generate(
        self,
        hist_target: torch.Tensor,
        hist_known: torch.Tensor | None = None,
        fut_known: torch.Tensor | None = None,
        horizon: int | None = None,
        use_cache: bool = True,
        draw: Callable[[torch.Tensor], torch.Tensor] | None = None,
        num_samples: int = 1,
        offset: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Roll out a forecast of M steps after a context of N observed steps.

        hist_target: `(B, N, Dy)` observed targets; hist_known: `(B, N, Dk)`; fut_known: `(B, M, Dk)`
        the known covariates of the M future steps (M is taken from it, or from `horizon` when there
        are no covariates). draw: a step's output `(B', 1, Dy * n_params)` -> the value fed back
        `(B', 1, Dy)` (default: the output itself, a point forecast). num_samples: paths per window.
        offset: `(B, M, Dy * n_params)` added to the outputs of the future steps before `draw` (what
        `forward`'s caller adds to its outputs of those steps: e.g. a linear forecast the network corrects).
        Returns the values fed back, `(B * num_samples, M, Dy)`, the paths of window b in rows
        b * num_samples .. (b + 1) * num_samples - 1.
        """
        draw = draw or (lambda out: out)
        B, N, _ = hist_target.shape
        if fut_known is None:
            if horizon is None:
                raise ValueError("give fut_known (B, M, Dk) or horizon")
            fut_known = hist_target.new_zeros(B, horizon, 0)
        M = fut_known.shape[1]
        P = self.patch
        self.check_whole_patches(N, "a history")
        self.check_whole_patches(M, "a horizon")
        if hist_known is None:
            hist_known = hist_target.new_zeros(B, N, fut_known.shape[2])
        known = torch.cat([hist_known, fut_known], dim=1)  # (B, N + M, Dk)
        n_tokens = (N + M) // P - 1  # the last patch predicted is never fed back
        self.positional.check_length(n_tokens)  # refuse before any work is done

        cache = KVCache(len(self.decoder.blocks), max_len=n_tokens) if use_cache else None
        # Prefill: the tokens of patches 1..N/P carry the observed targets of patches 0..N/P-1; the
        # last one predicts the first future patch, steps N..N+P-1. It is the same for every path of
        # a window: run once, its K/V then shared by the S paths.
        out = self(hist_target, known[:, P : N + P], cache=cache)[:, -P:]  # (B, P, Dy * n_params)
        target_prev = hist_target  # (B, N, Dy), grown patch by patch without the cache
        if offset is None:
            offset = out.new_zeros(B, M, out.shape[-1])
        out = out + offset[:, :P]
        if num_samples > 1:
            S = num_samples
            out, known, target_prev, offset = (
                x.repeat_interleave(S, dim=0) for x in (out, known, target_prev, offset)
            )  # (B * S, ...)
            if cache is not None:
                cache.share(S)
        next_value = draw(out)  # (B * S, P, Dy)
        values = [next_value]
        for step in range(N + P, N + M, P):  # the first step of the patch predicted now
            if use_cache:  # its token carries the values of the patch before
                out = self(next_value, known[:, step : step + P], cache=cache)[:, -P:]
            else:
                target_prev = torch.cat([target_prev, next_value], dim=1)  # (B * S, step, Dy)
                out = self(target_prev, known[:, P : step + P])[:, -P:]
            next_value = draw(out + offset[:, step - N : step - N + P])
            values.append(next_value)
        return torch.cat(values, dim=1)  # (B * S, M, Dy)
