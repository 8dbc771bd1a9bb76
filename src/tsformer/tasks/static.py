"""Static covariates (per-series properties) as inputs of every step.

A static category (turbine model, site, or the series id itself) gets a learned embedding of
`embedding_dim` numbers; static numbers (rated power, size; scaled on the train rows) are used as
they are. Their concatenation, `(B, width)`, is appended to the known covariates of every history
and future step: every family already reads known covariates at each step (the encoder, the
decoder's tokens, the encoder-only tokens), so the series' identity conditions each attention layer
without a family-specific path. A category not seen in training has code 0, its own embedding.
"""

from __future__ import annotations

import torch
from torch import nn


class StaticCovariates(nn.Module):
    def __init__(self, n_numeric: int = 0, vocab_sizes: list[int] = (), embedding_dim: int = 4):
        super().__init__()
        self.n_numeric = int(n_numeric)
        self.embeddings = nn.ModuleList(nn.Embedding(int(size), embedding_dim) for size in vocab_sizes)
        self.width = self.n_numeric + embedding_dim * len(self.embeddings)

    def forward(self, static_num: torch.Tensor, static_cat: torch.Tensor) -> torch.Tensor:
        """static_num (B, S_num), static_cat (B, S_cat) codes -> (B, width)."""
        parts = [static_num] + [emb(static_cat[:, j]) for j, emb in enumerate(self.embeddings)]  # (B, E) each
        return torch.cat(parts, dim=-1)

    def append_to_known(self, batch: dict) -> dict:
        """The batch with the static features appended to hist_known (B, N, Dk + width) and
        fut_known (B, M, Dk + width); unchanged when there are no static covariates."""
        if self.width == 0:
            return batch
        static = self(batch["static_num"], batch["static_cat"])  # (B, width)

        def append(known: torch.Tensor) -> torch.Tensor:
            B, T, _ = known.shape
            return torch.cat([known, static[:, None, :].expand(B, T, -1).to(known.dtype)], dim=-1)

        return {**batch, "hist_known": append(batch["hist_known"]), "fut_known": append(batch["fut_known"])}
