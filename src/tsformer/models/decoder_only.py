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
from tsformer.nn.embedding import InputProjection
from tsformer.nn.kv_cache import KVCache
from tsformer.nn.masks import padding_mask
from tsformer.nn.positional import build_positional


@dataclass
class DecoderOnlyConfig(TransformerConfig):
    d_target: int = 1  # autoregressive channels: targets (and past-only covariates, if any)
    d_known: int = 0  # covariates known for the future
    n_params: int = 1  # outputs per channel: 1 for a point forecast, the distribution's parameters otherwise


class DecoderOnly(nn.Module):
    def __init__(self, cfg: DecoderOnlyConfig):
        super().__init__()
        self.cfg = cfg
        self.input_proj = InputProjection(cfg.d_target + cfg.d_known, cfg.d_model)
        self.positional, rope = build_positional(cfg.positional, cfg.d_model, cfg.head_dim, cfg.max_len, cfg.rope_base)
        self.dropout = nn.Dropout(cfg.dropout)
        self.decoder = TransformerStack(cfg, cfg.n_layers, causal=True, rope=rope)
        self.head = nn.Linear(cfg.d_model, cfg.d_target * cfg.n_params)

    @staticmethod
    def teacher_forcing(target: torch.Tensor, known: torch.Tensor):
        """A window `target (B, L, Dy)`, `known (B, L, Dk)` -> model inputs and labels of L - 1 tokens.

        Returns `(target_prev (B, L-1, Dy), known (B, L-1, Dk), labels (B, L-1, Dy))`: token t holds
        the true target of step t - 1 and the known covariates of step t, and is trained on target t.
        """
        return target[:, :-1], known[:, 1:], target[:, 1:]

    def forward(
        self,
        target_prev: torch.Tensor,
        known: torch.Tensor | None = None,
        valid: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """target_prev: `(B, T, Dy)`, known: `(B, T, Dk)` -> predictions `(B, T, Dy * n_params)`.

        valid: `(B, T)` bool, True on real tokens (padding). cache: continue after the tokens
        already in the cache (their positions come first).
        """
        B, T, _ = target_prev.shape
        if known is None:
            known = target_prev.new_zeros(B, T, 0)
        start = cache.length if cache is not None else 0
        self.positional.check_length(start + T)
        positions = torch.arange(start, start + T, device=target_prev.device)
        tokens = torch.cat([target_prev, known], dim=-1)  # (B, T, Dy + Dk)
        h = self.dropout(self.positional(self.input_proj(tokens), positions))  # (B, T, d_model)
        mask = padding_mask(valid) if valid is not None else None
        h = self.decoder(h, mask=mask, positions=positions, cache=cache)
        return self.head(h)  # (B, T, Dy * n_params)

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
    ) -> torch.Tensor:
        """Roll out a forecast of M steps after a context of N observed steps.

        hist_target: `(B, N, Dy)` observed targets; hist_known: `(B, N, Dk)`; fut_known: `(B, M, Dk)`
        the known covariates of the M future steps (M is taken from it, or from `horizon` when there
        are no covariates). draw: a step's output `(B', 1, Dy * n_params)` -> the value fed back
        `(B', 1, Dy)` (default: the output itself, a point forecast). num_samples: paths per window.
        Returns the values fed back, `(B * num_samples, M, Dy)`, the paths of window b in rows
        b * num_samples .. (b + 1) * num_samples - 1.
        """
        draw = draw or (lambda out: out)
        B, N, Dy = hist_target.shape
        if fut_known is None:
            if horizon is None:
                raise ValueError("give fut_known (B, M, Dk) or horizon")
            fut_known = hist_target.new_zeros(B, horizon, 0)
        M = fut_known.shape[1]
        if hist_known is None:
            hist_known = hist_target.new_zeros(B, N, fut_known.shape[2])
        known = torch.cat([hist_known, fut_known], dim=1)  # (B, N + M, Dk)
        n_tokens = N + M - 1  # the last prediction is never fed back
        self.positional.check_length(n_tokens)  # refuse before any work is done

        cache = KVCache(len(self.decoder.blocks), max_len=n_tokens) if use_cache else None
        # Prefill: tokens for steps 1..N carry the observed targets 0..N-1; the last one predicts step N.
        # It is the same for every path of a window: run once, its K/V then shared by the S paths.
        out = self(hist_target, known[:, 1 : N + 1], cache=cache)[:, -1:]  # (B, 1, Dy * P)
        target_prev = hist_target  # (B, N, Dy), grown step by step without the cache
        if num_samples > 1:
            S = num_samples
            out, known, target_prev = (x.repeat_interleave(S, dim=0) for x in (out, known, target_prev))  # (B * S, ...)
            if cache is not None:
                cache.share(S)
        next_value = draw(out)  # (B * S, 1, Dy)
        values = [next_value]
        for m in range(1, M):
            step = N + m  # the step predicted now; its token carries the value of step - 1
            if use_cache:
                out = self(next_value, known[:, step : step + 1], cache=cache)[:, -1:]
            else:
                target_prev = torch.cat([target_prev, next_value], dim=1)  # (B * S, step, Dy)
                out = self(target_prev, known[:, 1 : step + 1])[:, -1:]
            next_value = draw(out)
            values.append(next_value)
        return torch.cat(values, dim=1)  # (B * S, M, Dy)
