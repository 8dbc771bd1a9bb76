"""Attention masks.

Convention everywhere in tsformer (the same as `F.scaled_dot_product_attention`): a boolean mask is
True where a query MAY attend to a key. `torch.nn.MultiheadAttention` and `masked_fill` use the
opposite convention; convert at that boundary, never inside the model.

Shapes broadcast to the scores `(B, H, Tq, Tk)`:
- causal mask: `(Tq, Tk)`
- key padding mask: `(B, 1, 1, Tk)`
- combined: `(B, 1, Tq, Tk)`
"""

from __future__ import annotations

import torch


def causal_mask(n_queries: int, n_keys: int | None = None, device=None) -> torch.Tensor:
    """`(Tq, Tk)` lower-triangular mask: query i may see keys up to its own position.

    When there are more keys than queries (decoding against a KV cache), the queries are the LAST
    `Tq` positions of the sequence, so query i sits at absolute position `Tk - Tq + i`.
    """
    n_keys = n_queries if n_keys is None else n_keys
    if n_keys < n_queries:
        raise ValueError(f"causal mask needs at least as many keys ({n_keys}) as queries ({n_queries})")
    offset = n_keys - n_queries
    q_pos = torch.arange(n_queries, device=device).unsqueeze(1) + offset  # (Tq, 1)
    k_pos = torch.arange(n_keys, device=device).unsqueeze(0)  # (1, Tk)
    return k_pos <= q_pos  # (Tq, Tk)


def padding_mask(valid: torch.Tensor) -> torch.Tensor:
    """Key padding mask from a `(B, Tk)` boolean tensor that is True on real (not padded) steps."""
    if valid.dtype != torch.bool:
        raise TypeError(f"padding mask expects a bool tensor (True = real step), got {valid.dtype}")
    return valid[:, None, None, :]  # (B, 1, 1, Tk)


def lengths_to_valid(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """`(B,)` sequence lengths -> `(B, max_len)` bool, True on the first `length` steps."""
    steps = torch.arange(max_len, device=lengths.device)
    return steps.unsqueeze(0) < lengths.unsqueeze(1)  # (B, max_len)


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of the given masks (None entries are ignored; all None gives None)."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else out & m
    return out
