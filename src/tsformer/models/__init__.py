"""The three model families and the closed-form linear forecaster, plain `nn.Module`s each configured by a
dataclass."""

from tsformer.models.decoder_only import DecoderOnly, DecoderOnlyConfig
from tsformer.models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from tsformer.models.encoder_only import EncoderOnly, EncoderOnlyConfig
from tsformer.models.linear import ChannelSharedLinear, LinearConfig

__all__ = [
    "ChannelSharedLinear",
    "DecoderOnly",
    "DecoderOnlyConfig",
    "EncoderDecoder",
    "EncoderDecoderConfig",
    "EncoderOnly",
    "EncoderOnlyConfig",
    "LinearConfig",
]
