"""`TransformerConfig`: the hyperparameters every model family shares.

Each family's config (`EncoderOnlyConfig`, `DecoderOnlyConfig`, `EncoderDecoderConfig`) extends it
with its own input/output sizes and options.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TransformerConfig:
    d_model: int = 64
    n_heads: int = 4  # d_k = d_model / n_heads
    n_layers: int = 2
    ffn_expansion: int = 4  # FFN hidden size = ffn_expansion * d_model
    activation: str = "gelu"  # "gelu" | "relu"
    dropout: float = 0.0  # lean default: dropout costs a lot on CPU; raise it for real training
    attention_dropout: float | None = None  # on the attention weights; None: `dropout` (PatchTST's code: 0)
    # on an attention sublayer's output, before the residual add; None: `dropout`. PatchTST's code drops
    # it out twice in a row (its projection's dropout, then the residual's), which is one dropout of
    # 1 - (1 - p)^2 in distribution: 0.51 at its ETTh1 dropout 0.3, 0.36 at its ETTm1 0.2
    attention_output_dropout: float | None = None
    # dropout masks from 16 random bits an element instead of a Bernoulli draw (nn/dropout.py): the same
    # dropout in distribution, other masks than torch's, so off by default (it keeps runs' numbers)
    fast_dropout: bool = False
    norm: str = "pre"  # "pre" (modern default, stable) | "post" (original paper, wants LR warmup)
    norm_layer: str = (
        "layer"  # "layer" (LayerNorm) | "batch" (BatchNorm over the batch's tokens, encoders only)
    )
    positional: str = "sinusoidal"  # "sinusoidal" | "learned" | "rope" | "relative_bias" | "none"
    max_len: int = 1024  # positions a learned encoding knows; relative_bias: offsets up to max_len - 1
    rope_base: float = 10000.0
    fused_attention: bool = True  # F.scaled_dot_product_attention; False = readable reference path
    # each layer's attention scores add the previous layer's (PatchTST's encoder); encoders only
    residual_attention: bool = False
    bias: bool = True
    # encoders: how steps become tokens (nn/conv_embedding.py): "linear" (one step or patch, projected)
    # | "conv" (Conv1d layers of these kernels, LayerNorm, GELU; one token per conv_stride steps)
    # | "multiscale" (InceptionTime modules: parallel kernels of several lengths; nn/multiscale_embedding.py)
    embedding: str = "linear"
    conv_kernels: tuple[int, ...] = (8, 5, 3)
    conv_stride: int = 1  # conv and multiscale: one token per conv_stride steps
    multiscale_kernels: tuple[int, ...] = (9, 19, 39)  # in steps, side by side in each module
    multiscale_modules: int = 3  # the first reads the steps at conv_stride, the others the tokens
    multiscale_bottleneck: int = 32  # channels a wider input is narrowed to before the kernels

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def attention_weights_dropout(self) -> float:
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    @property
    def attention_residual_dropout(self) -> float:
        return self.dropout if self.attention_output_dropout is None else self.attention_output_dropout

    def __post_init__(self):
        # a dropout probability outside [0, 1): nn.Dropout's own error names no setting, and p = 1 zeroes all
        for name in ("dropout", "attention_dropout", "attention_output_dropout"):
            p = getattr(self, name)
            if p is not None and not 0.0 <= p < 1.0:
                raise ValueError(f"model.net.{name}={p}: a dropout probability must be in [0, 1)")
