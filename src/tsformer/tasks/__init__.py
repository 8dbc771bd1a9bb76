"""LightningModules: one per job (state reconstruction, forecasting by family)."""

from tsformer.tasks.base import WindowTask
from tsformer.tasks.forecasting import DecoderOnlyForecaster, EncoderDecoderForecaster, EncoderForecaster
from tsformer.tasks.reconstruction import ReconstructionTask

__all__ = [
    "DecoderOnlyForecaster",
    "EncoderDecoderForecaster",
    "EncoderForecaster",
    "ReconstructionTask",
    "WindowTask",
]
