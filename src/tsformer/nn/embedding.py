"""Input embedding: lift the D raw features of one time step to a d_model-dimensional token.

Text models look tokens up in a table; a time step is already a vector of real numbers, so a linear
layer `x_t W + b` does the lifting. Positional information is added afterwards (`positional.py`).
"""

from __future__ import annotations

import torch
from torch import nn

from tsformer.nn.conv_embedding import ConvEmbedding, StridedTokens
from tsformer.nn.multiscale_embedding import MultiScaleEmbedding

EMBEDDINGS = ("linear", "conv", "multiscale")


class InputProjection(nn.Module):
    def __init__(self, d_in: int, d_model: int):
        super().__init__()
        if d_in < 1:
            raise ValueError(f"a token needs at least one input feature, got d_in={d_in}")
        self.d_in = d_in
        self.proj = nn.Linear(d_in, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.d_in:
            raise ValueError(
                f"expected {self.d_in} features per step, got {x.shape[-1]} (input shape {tuple(x.shape)})"
            )
        return self.proj(x)  # (B, T, d_in) -> (B, T, d_model)


def token_grid(patching, embedding):
    """What places the tokens on the time axis: the patches, a strided convolutional embedding, or None
    (one token per step); `tsformer.nn.patching`'s helpers take either."""
    if patching is not None:
        return patching
    return embedding if isinstance(embedding, StridedTokens) else None


def build_embedding(cfg, d_token: int, patching=None) -> nn.Module:
    """The input embedding of an encoder: `InputProjection` (`model.net.embedding=linear`) of each step or
    patch, `ConvEmbedding` (`conv`) or `MultiScaleEmbedding` (`multiscale`) of the steps; a convolution
    reads steps, so it takes no patches."""
    if cfg.embedding not in EMBEDDINGS:
        raise ValueError(f"unknown model.net.embedding {cfg.embedding!r}; choose one of {EMBEDDINGS}")
    if cfg.embedding == "linear":
        return InputProjection(d_token, cfg.d_model)
    if patching is not None:
        raise ValueError(
            f"model.net.embedding={cfg.embedding} reads steps, not patches: set model.patch_len=null "
            "(model.net.conv_stride gives one token per stride of steps)"
        )
    if cfg.embedding == "multiscale":
        return MultiScaleEmbedding(
            d_token, cfg.d_model, cfg.multiscale_kernels, cfg.conv_stride, cfg.multiscale_modules,
            cfg.multiscale_bottleneck,
        )  # fmt: skip
    return ConvEmbedding(d_token, cfg.d_model, cfg.conv_kernels, cfg.conv_stride)
