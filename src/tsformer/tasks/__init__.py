"""LightningModules: one per job (state reconstruction, masked fill-in, forecasting by family)."""

from tsformer.tasks.base import WindowTask
from tsformer.tasks.forecasting import DecoderOnlyForecaster, EncoderDecoderForecaster, EncoderForecaster
from tsformer.tasks.masked import MaskedFillIn
from tsformer.tasks.reconstruction import ReconstructionTask

__all__ = [
    "DecoderOnlyForecaster",
    "EncoderDecoderForecaster",
    "EncoderForecaster",
    "MaskedFillIn",
    "ReconstructionTask",
    "WindowTask",
]
