"""Transformer building blocks, one file per concept (attention, masks, positional, blocks, kv_cache)."""
