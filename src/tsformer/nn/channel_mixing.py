"""A path across channels beside channel independence (`model.channel_mixing`, issue 56 point 4).

Channel independence (`channels.py`) lets no target channel's forecast see another channel's history.
This path is iTransformer's idea ("iTransformer: Inverted Transformers Are Effective for Time Series
Forecasting", 2024) in its smallest form: each channel's whole window, normalised by its own mean and
std, is one token; one pre-norm Transformer layer attends across the channel tokens; a linear map gives
each channel M future values, scaled back by the channel's std:

    (B, N, C) -> tokens (B, C, d) -> attention across the C tokens + FFN -> (B, C, M) -> (B, M, C)

It is a correction added to the linear forecast that the channel-independent Transformer starts from
(`EncoderForecaster`: the sum enters the network's view as `fut_linear`), and its output layer starts
at zero, so a model with the path starts as the model without it. The attention is torch's own
(`nn.MultiheadAttention`): C tokens, no mask, no cache.
"""

from __future__ import annotations

import torch
from torch import nn

EPS = 1e-5


class ChannelMixing(nn.Module):
    """`hist_target (B, N, C) -> correction (B, M, C)`, every channel's future from every channel's window."""

    def __init__(
        self, context_len: int, horizon: int, d_model: int = 16, n_heads: int = 1, dropout: float = 0.0
    ):
        super().__init__()
        self.embed = nn.Linear(context_len, d_model)  # a channel's window -> its token
        self.attention_norm = nn.LayerNorm(d_model)
        self.attention = nn.MultiheadAttention(d_model, n_heads, dropout=dropout, batch_first=True)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.out = nn.Linear(d_model, horizon)
        nn.init.zeros_(self.out.weight)  # adds nothing until trained
        nn.init.zeros_(self.out.bias)

    def forward(self, hist_target: torch.Tensor) -> torch.Tensor:
        loc = hist_target.mean(dim=1, keepdim=True)  # (B, 1, C)
        scale = hist_target.std(dim=1, keepdim=True, unbiased=False).clamp(min=EPS)  # (B, 1, C)
        tokens = self.embed(((hist_target - loc) / scale).transpose(1, 2))  # (B, C, d)
        h = self.attention_norm(tokens)
        tokens = tokens + self.attention(h, h, h, need_weights=False)[0]  # across the C channel tokens
        tokens = tokens + self.ffn(self.ffn_norm(tokens))
        return self.out(tokens).transpose(1, 2) * scale  # (B, M, C)
