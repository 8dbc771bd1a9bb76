"""LightningModules: one per job (state reconstruction, masked fill-in, forecasting by family, sequence
classification and the masked pre-training of its encoder)."""

from tsformer.tasks.base import WindowTask
from tsformer.tasks.classification import ClassificationTask
from tsformer.tasks.forecasting import (
    DecoderOnlyForecaster,
    EncoderDecoderForecaster,
    EncoderForecaster,
    LinearForecaster,
)
from tsformer.tasks.masked import MaskedFillIn
from tsformer.tasks.pretraining import MaskedPretraining
from tsformer.tasks.random_kernel_classifier import RandomKernelRidgeTask
from tsformer.tasks.reconstruction import ReconstructionTask

__all__ = [
    "ClassificationTask",
    "DecoderOnlyForecaster",
    "EncoderDecoderForecaster",
    "EncoderForecaster",
    "LinearForecaster",
    "MaskedFillIn",
    "MaskedPretraining",
    "RandomKernelRidgeTask",
    "ReconstructionTask",
    "WindowTask",
]
