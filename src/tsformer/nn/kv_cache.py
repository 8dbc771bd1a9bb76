"""KV cache for autoregressive decoding.

Without a cache, generating step t re-runs the decoder over all t tokens: O(t^2) attention work per
step and O(T^3) for a horizon of T. With a cache, each step projects only the NEW token to Q/K/V,
appends its K/V to buffers kept per layer, and attends over the buffers: O(t) per step.

- `SelfAttentionCache`: growing K/V of one self-attention layer, preallocated to `max_len` so that
  appending is a copy of one step, not a re-allocation of the whole history.
- `CrossAttentionCache`: K/V of the encoder memory for one cross-attention layer, computed once at
  the first decoding step and reused at every later step.
- `KVCache`: the caches of a whole decoder stack, plus the number of positions already decoded
  (the position offset of the next token, used by the positional encodings and RoPE).
"""

from __future__ import annotations

import torch


class SelfAttentionCache:
    def __init__(self, max_len: int):
        self.max_len = max_len
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `(B, H, T_new, Dh)` keys/values; return all cached so far `(B, H, T, Dh)`."""
        B, H, T_new, Dh = k.shape
        if self._k is None:  # allocate lazily: batch, dtype and device come from the first keys
            self._k = k.new_empty(B, H, self.max_len, Dh)
            self._v = v.new_empty(B, H, self.max_len, Dh)
        end = self.length + T_new
        if end > self.max_len:
            raise RuntimeError(f"KV cache full: {end} positions requested, room for {self.max_len}")
        self._k[:, :, self.length : end] = k
        self._v[:, :, self.length : end] = v
        self.length = end
        return self._k[:, :, :end], self._v[:, :, :end]

    def repeat_interleave(self, n: int) -> None:
        """Each sequence's cache becomes n copies, rows b * n .. b * n + n - 1 (sampled paths sharing a prefix)."""
        if self._k is not None:
            self._k = self._k.repeat_interleave(n, dim=0)  # (B * n, H, max_len, Dh)
            self._v = self._v.repeat_interleave(n, dim=0)


class CrossAttentionCache:
    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def filled(self) -> bool:
        return self.k is not None

    def store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v

    def repeat_interleave(self, n: int) -> None:
        if self.k is not None:
            self.k = self.k.repeat_interleave(n, dim=0)  # (B * n, H, L, Dh)
            self.v = self.v.repeat_interleave(n, dim=0)


class KVCache:
    """Caches of every layer of a decoder stack."""

    def __init__(self, n_layers: int, max_len: int, cross_attention: bool = False):
        self.self_attn = [SelfAttentionCache(max_len) for _ in range(n_layers)]
        self.cross_attn = [CrossAttentionCache() for _ in range(n_layers)] if cross_attention else None

    @property
    def length(self) -> int:
        """Number of positions already in the cache = position of the next token."""
        return self.self_attn[0].length

    def repeat_interleave(self, n: int) -> None:
        """n copies of every sequence's cache, in the order of `Tensor.repeat_interleave(n, dim=0)`:
        the paths sampled from one window continue from the K/V of its history, computed once."""
        for cache in [*self.self_attn, *(self.cross_attn or [])]:
            cache.repeat_interleave(n)

    def layer(self, i: int) -> tuple[SelfAttentionCache, CrossAttentionCache | None]:
        return self.self_attn[i], (self.cross_attn[i] if self.cross_attn is not None else None)
