"""Channel independence (PatchTST's "CI"): every target channel is a series of its own.

A window with Dy target channels becomes Dy windows of one target channel each, all run through the
SAME network (shared weights), and the Dy forecasts are put back side by side:

    (B, T, Dy)  --split_channels-->  (B * Dy, T, 1)  --network-->  (B * Dy, M, 1)  --merge_channels-->  (B, M, Dy)

Row `b * Dy + c` of the split batch is channel c of window b. Whatever else a window carries (known
and past-only covariates, static features, validity masks) is the same for its Dy channel series and
is repeated with `repeat_per_channel`. A channel's forecast then depends on its own history and on
the covariates only, never on the other target channels. The channels share what they learn; no
channel-id embedding is added (as in PatchTST), so the network tells channels apart only by their values.
"""

from __future__ import annotations

import torch


def split_channels(x: torch.Tensor) -> torch.Tensor:
    """`(B, T, C)` -> `(B * C, T, 1)`: row b * C + c is channel c of window b."""
    B, T, C = x.shape
    return x.permute(0, 2, 1).reshape(B * C, T, 1)  # (B, C, T) -> (B * C, T, 1)


def merge_channels(x: torch.Tensor, n_channels: int, channel_dim: int = -1) -> torch.Tensor:
    """`(B * C, T, 1)` -> `(B, T, C)`, the inverse of `split_channels`. More generally the channel
    series' singleton channel axis may sit anywhere after the batch (`channel_dim`) among other axes,
    e.g. a head's parameters `(B * C, T, 1, P)` -> `(B, T, C, P)` with channel_dim=-2, or sampled
    paths `(B * C, S, T, 1)` -> `(B, S, T, C)`."""
    dim = channel_dim % x.dim()
    if dim == 0 or x.shape[dim] != 1 or x.shape[0] % n_channels != 0:
        raise ValueError(
            f"expected {n_channels} * B channel series with a channel axis of 1 at {channel_dim}, got {tuple(x.shape)}"
        )
    y = x.reshape(x.shape[0] // n_channels, n_channels, *x.shape[1:])  # (B, C, ..., 1, ...)
    return y.squeeze(dim + 1).movedim(1, dim)  # the C series' axis where the singleton was


def repeat_per_channel(x: torch.Tensor, n_channels: int) -> torch.Tensor:
    """`(B, ...)` -> `(B * C, ...)`: what window b carries, once for each of its C channel series."""
    return x.repeat_interleave(n_channels, dim=0)
