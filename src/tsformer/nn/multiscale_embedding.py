"""Multi-scale convolutional token embedding (`model.net.embedding=multiscale`): InceptionTime's module
under the Transformer.

The convolutional stem (`conv_embedding.ConvEmbedding`) reads one kernel length per layer (8, 5, 3): a
token sees about 30 steps. Shapes on the archive's sets span a few steps (a tip of a leaf) to a hundred (a
gesture); InceptionTime (Ismail Fawaz et al. 2020) reads them with kernels of several lengths side by side.
One module here is

    steps masked (padding set to 0)
      -> [bottleneck: Conv1d(kernel 1) to `bottleneck` channels, when the input is wider]
      -> Conv1d(kernel k_1) | Conv1d(kernel k_2) | ... | max-pool(3) -> Conv1d(kernel 1)   (in parallel)
      -> concatenated to d_model channels -> LayerNorm over the channels of each token -> GELU

The first module reads the steps with all its branches at `conv_stride` S: token i sits at step i * S (the
grid of `StridedTokens`) and its kernels `multiscale_kernels` (9, 19, 39 steps: InceptionTime's 10, 20,
40 made odd) reach back and forth around it. The next `multiscale_modules - 1` modules read the tokens,
with the same spans of time (kernels ceil(k / S) tokens) and a residual connection each; attention
follows. Every branch is d_model / (branches) channels wide (the first takes what does not divide).

Padding never leaks in, as in the conv stem: before every convolution and pooling the padded steps (or
tokens) of a batch are set to 0, which is what the 'same' zero padding of a sample alone reads past its
end (the max-pool pads with zeros too, not with -inf); the norm is per token. So a sample's tokens are the
same alone or among longer, padded ones (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tsformer.nn.conv_embedding import StridedTokens, check_sizes, same_padding

POOL = 3  # the max-pool branch's window (InceptionTime's)


class InceptionModule(nn.Module):
    """`(B, C_in, T)` masked -> `(B, d_model, ceil(T / stride))`: parallel kernels, concatenated."""

    def __init__(self, c_in: int, d_model: int, kernels: list[int], bottleneck: int, stride: int):
        super().__init__()
        n_branches = len(kernels) + 1  # one per kernel, and the max-pool branch
        widths = [d_model // n_branches] * n_branches
        widths[0] += d_model - sum(widths)
        if min(widths) < 1:
            raise ValueError(
                f"model.net.d_model={d_model} is too narrow for {n_branches} branches "
                f"(model.net.multiscale_kernels={kernels} and the max-pool)"
            )
        self.stride = stride
        # InceptionTime leaves out the bottleneck of a narrow input (one channel); biases off, as there
        self.bottleneck = nn.Conv1d(c_in, bottleneck, 1, bias=False) if c_in > bottleneck else None
        width = bottleneck if self.bottleneck is not None else c_in
        self.branches = nn.ModuleList(
            nn.Conv1d(width, w, k, stride=stride, bias=False) for w, k in zip(widths, kernels, strict=False)
        )
        self.pool_conv = nn.Conv1d(c_in, widths[-1], 1, bias=False)
        self.norm = nn.LayerNorm(d_model)
        self.act = nn.GELU()

    def forward(self, h: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """h `(B, C_in, T)`, keep `(B, 1, T)` (1 on real steps) or None."""
        if keep is not None:
            h = h * keep  # padded steps read as the zeros past a lone sample's end
        narrow = h if self.bottleneck is None else self.bottleneck(h)  # (B, bottleneck, T)
        parts = [branch(same_padding(narrow, branch.kernel_size[0])) for branch in self.branches]
        pooled = F.max_pool1d(same_padding(h, POOL), POOL, stride=self.stride)  # zeros past the ends
        parts.append(self.pool_conv(pooled))
        out = torch.cat(parts, dim=1)  # (B, d_model, ceil(T / stride))
        return self.act(self.norm(out.transpose(1, 2)).transpose(1, 2))  # LayerNorm per token


class MultiScaleEmbedding(StridedTokens):
    """Steps `(B, T, d_in)` -> tokens `(B, ceil(T / S), d_model)` (see the module docstring)."""

    def __init__(
        self,
        d_in: int,
        d_model: int,
        kernels=(9, 19, 39),
        stride: int = 1,
        modules: int = 3,
        bottleneck: int = 32,
    ):
        super().__init__()
        kernels = [int(k) for k in kernels]
        if not kernels or min(kernels) < 1:
            raise ValueError(f"model.net.multiscale_kernels={kernels}: give kernel sizes >= 1 (in steps)")
        if modules < 1:
            raise ValueError(f"model.net.multiscale_modules={modules}: must be >= 1")
        if bottleneck < 1:
            raise ValueError(f"model.net.multiscale_bottleneck={bottleneck}: must be >= 1")
        self.d_in, self.stride = check_sizes(d_in, stride)
        self.kernels = kernels
        token_kernels = [-(-k // self.stride) for k in kernels]  # the same spans of time, in tokens
        self.blocks = nn.ModuleList(
            [InceptionModule(self.d_in, d_model, kernels, bottleneck, self.stride)]
            + [InceptionModule(d_model, d_model, token_kernels, bottleneck, 1) for _ in range(modules - 1)]
        )

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        self.check_input(x)
        h = x.transpose(1, 2)  # (B, d_in, T): Conv1d's layout
        keep = None if valid is None else valid.unsqueeze(1).to(h.dtype)  # (B, 1, T)
        h = self.blocks[0](h, keep)  # (B, d_model, L), L = ceil(T / S)
        if keep is not None:
            keep = keep[:, :, :: self.stride]  # (B, 1, L): a token is real when its step is
        for block in self.blocks[1:]:
            h = h + block(h, keep)  # (B, d_model, L)
        if keep is not None:
            h = h * keep  # padded tokens carry nothing
        return h.transpose(1, 2)  # (B, L, d_model)

    def extra_repr(self) -> str:
        return f"kernels={self.kernels}, stride={self.stride}, modules={len(self.blocks)}"
