"""Patch tokens (PatchTST, Nie et al., ICLR 2023): a token is P consecutive steps, not one.

One step of a smooth series says little, and attention over N single steps costs O(N^2). PatchTST
cuts the window into patches of `patch_len` P steps taken every `stride` S steps (S < P: they
overlap) and projects each patch (its P steps x C channels, flattened) to one d_model token:

    (B, T, C)  --pad the end with S copies of the last step-->  (B, T + S, C)
               --unfold(P, S)-->  (B, L, C, P)  --flatten-->  (B, L, P * C)  --InputProjection-->  (B, L, d_model)

    L = floor((T - P) / S) + 2     (the +1 of the end padding, as PatchTST's padding_patch="end")

Patch i covers steps i*S .. i*S + P - 1; steps past the end (T - 1) are copies of step T - 1 (with
S = P and T - P a multiple of S, the last patch is step T - 1 repeated, as in PatchTST). Its
features are step-major: `[step i*S: channels 0..C-1, step i*S + 1: channels 0..C-1, ...]`.

Position of a patch token: the time step it starts at, `i * S` (`positions`). Every token of every
family then sits on the time axis of the window, so the encoder-decoder's decoder (one token per
future step, at N..N+M-1) still knows how far back each memory token lies.

A padding mask is per step; a patch mixes steps, so patch tokens take whole windows only (the
models refuse a `valid` mask with patches: the tasks never pad).
"""

from __future__ import annotations

import torch
from torch import nn


def n_patches(n_steps: int, patch_len: int, stride: int) -> int:
    """Number of patches of a window of `n_steps` steps: floor((T - P) / S) + 2."""
    if n_steps + stride < patch_len:
        raise ValueError(
            f"a window of {n_steps} steps is too short for patch_len={patch_len} (stride {stride}): "
            f"it needs at least patch_len - stride = {patch_len - stride} steps"
        )
    return (n_steps - patch_len) // stride + 2


class Patching(nn.Module):
    """Steps `(B, T, C)` -> patches `(B, L, P * C)`; no parameters (the projection follows it)."""

    def __init__(self, patch_len: int, stride: int | None = None):
        super().__init__()
        stride = patch_len if stride is None else stride  # none given: patches side by side
        if patch_len < 1 or stride < 1:
            raise ValueError(f"patch_len and patch_stride must be >= 1, got {patch_len} and {stride}")
        self.patch_len, self.stride = int(patch_len), int(stride)

    def count(self, n_steps: int) -> int:
        return n_patches(n_steps, self.patch_len, self.stride)

    def n_positions(self, n_steps: int) -> int:
        """Positions a positional encoding must know for these patches: 0 .. the last patch's start."""
        return (self.count(n_steps) - 1) * self.stride + 1

    def positions(self, n_steps: int, device=None) -> torch.Tensor:
        """`(L,)`: the first time step of each patch."""
        return torch.arange(self.count(n_steps), device=device) * self.stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        L = self.count(T)  # checks that the window is long enough
        pad = x[:, -1:].expand(B, self.stride, C)  # (B, S, C): the last step repeated
        x = torch.cat([x, pad], dim=1)  # (B, T + S, C)
        patches = x.unfold(1, self.patch_len, self.stride)  # (B, L, C, P)
        return patches.transpose(2, 3).reshape(B, L, self.patch_len * C)  # (B, L, P, C) -> (B, L, P * C)

    def extra_repr(self) -> str:
        return f"patch_len={self.patch_len}, stride={self.stride}"


def n_step_tokens(patching: Patching | None, n_steps: int) -> int:
    """Tokens of a window of `n_steps` steps: one per step (`patching` None), or one per patch."""
    return patching.count(n_steps) if patching is not None else n_steps


def token_features(patching: Patching | None, n_features: int) -> int:
    """Numbers a token carries, from `n_features` per step: P * n_features for a patch of P steps."""
    return n_features * patching.patch_len if patching is not None else n_features


def step_positions(patching: Patching | None, n_steps: int, device=None) -> torch.Tensor:
    """`(L,)` positions of the tokens of a window of `n_steps` steps: each step's (one token per
    step, `patching` None), or each patch's first step."""
    return (
        patching.positions(n_steps, device=device)
        if patching is not None
        else torch.arange(n_steps, device=device)
    )


def n_step_positions(patching: Patching | None, n_steps: int) -> int:
    """Positions a positional encoding must know for those tokens (from the shapes alone: reading
    them off the tensor would wait for the device)."""
    return patching.n_positions(n_steps) if patching is not None else n_steps
