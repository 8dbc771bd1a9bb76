"""The three model families, plain `nn.Module`s each configured by a dataclass."""

from tsformer.models.decoder_only import DecoderOnly, DecoderOnlyConfig
from tsformer.models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from tsformer.models.encoder_only import EncoderOnly, EncoderOnlyConfig

__all__ = [
    "DecoderOnly",
    "DecoderOnlyConfig",
    "EncoderDecoder",
    "EncoderDecoderConfig",
    "EncoderOnly",
    "EncoderOnlyConfig",
]
