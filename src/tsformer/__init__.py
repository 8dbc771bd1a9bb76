"""tsformer: Transformers for time series (encoder-only, decoder-only, encoder-decoder)."""

__version__ = "0.1.0"
