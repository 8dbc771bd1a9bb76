"""KV cache for autoregressive decoding.

Without a cache, generating step t re-runs the decoder over all t tokens: O(t^2) attention work per
step and O(T^3) for a horizon of T. With a cache, each step projects only the NEW token to Q/K/V,
appends its K/V to buffers kept per layer, and attends over the buffers: O(t) per step.

- `SelfAttentionCache`: growing K/V of one self-attention layer, preallocated to `max_len` so that
  appending is a copy of one step, not a re-allocation of the whole history.
- `CrossAttentionCache`: K/V of the encoder memory for one `CrossAttention` layer, computed once at
  the first decoding step and reused at every later step.
- `KVCache`: the caches of a whole decoder stack, plus the number of positions already decoded
  (the position offset of the next token, used by the positional encodings and RoPE).
- `SharedPrefixCache` (`KVCache.share`): sampled trajectories, S paths per sequence continuing
  from one shared prefix, whose K/V are kept once (not S times).
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

    def cached(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V cached so far, `(B, H, T, Dh)` each."""
        return self._k[:, :, : self.length], self._v[:, :, : self.length]


class SharedPrefixCache:
    """Self-attention K/V of S sampled paths per sequence that share a prefix (the history).

    The prefix's K/V stay once per sequence, `(B, H, T0, Dh)`; each path's own continuation grows in
    a `SelfAttentionCache` of `(B * S, H, T, Dh)` (path s of sequence b in row b * S + s). Attention
    over both (`attention.shared_prefix_attention`) never copies the prefix S times: it reads it
    once per sequence for all S queries, as one matrix product.
    """

    def __init__(self, prefix: SelfAttentionCache, n_paths: int):
        self.k_prefix, self.v_prefix = prefix.cached()  # (B, H, T0, Dh)
        self.n_paths = n_paths
        self.suffix = SelfAttentionCache(prefix.max_len - prefix.length)

    @property
    def length(self) -> int:
        return self.k_prefix.shape[2] + self.suffix.length

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the paths' new `(B * S, H, T_new, Dh)` K/V; return the paths' own so far."""
        return self.suffix.append(k, v)


class CrossAttentionCache:
    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def filled(self) -> bool:
        return self.k is not None

    def store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v

    n_paths = 1  # > 1: the queries are S paths per sequence of the K/V (`KVCache.share`)


class KVCache:
    """Caches of every layer of a decoder stack."""

    def __init__(self, n_layers: int, max_len: int, cross_attention: bool = False):
        self.self_attn = [SelfAttentionCache(max_len) for _ in range(n_layers)]
        self.cross_attn = [CrossAttentionCache() for _ in range(n_layers)] if cross_attention else None

    @property
    def length(self) -> int:
        """Number of positions already in the cache = position of the next token."""
        return self.self_attn[0].length

    def share(self, n_paths: int) -> None:
        """From now on every sequence's cache is shared by `n_paths` sampled paths, which continue
        as rows b * n_paths + s of the batch (the order of `Tensor.repeat_interleave`): the K/V
        computed so far (the history, the memory) are kept once per sequence, not copied."""
        self.self_attn = [SharedPrefixCache(c, n_paths) for c in self.self_attn]
        for c in self.cross_attn or []:
            c.n_paths = n_paths

    def layer(self, i: int) -> tuple[SelfAttentionCache | SharedPrefixCache, CrossAttentionCache | None]:
        return self.self_attn[i], (self.cross_attn[i] if self.cross_attn is not None else None)
