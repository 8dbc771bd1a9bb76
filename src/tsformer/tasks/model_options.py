"""RevIN and channel independence around any forecasting family, in one place.

Both options change what the network sees, not how a family works, so they wrap the family from
outside (`WindowTask.forecast` and `WindowTask.training_loss`):

    batch (data's scaled units, Dy target channels)
      -> ModelOptions.enter:  RevIN normalises hist_target AND fut_target with the HISTORY's mean and
                              std per window and channel (`nn/revin.py`); channel independence splits
                              every window into Dy one-channel windows (`nn/channels.py`)
      -> the family (teacher_forced / predict_target) works on this batch as on any other: the
         targets it reads, feeds back and predicts are in normalised units, Dy' = 1 channel with CI
      -> NetworkView.to_data_units / to_batch_layout: predictions back to the data's units and to
         (B, T, Dy)

What that means per family (all tested: the future truth never changes a forecast):
- enc_only_forecast: the history is normalised; the future tokens' zeros mean "the history's mean".
- enc_dec: the encoder reads the normalised history; teacher forcing feeds the decoder fut_target
  normalised with the HISTORY statistics (the only ones a forecast has); `generate` feeds back
  normalised predictions and everything is denormalised once, at the end.
- dec_only: the same over one token sequence: normalised history, normalised teacher forcing,
  normalised generation, denormalised at the end. Its past-only covariates (also fed back) are left
  as they are: RevIN is for targets.
With channel independence, the known and past-only covariates and the static features are repeated
for each channel series; dec_only then predicts the past-only covariates once per channel series
(and drops them, as always).

The training loss is computed after denormalisation, in the data's scaled units (as PatchTST does),
so `train/loss` and `val/loss` keep their meaning whatever the options.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tsformer.nn.channels import merge_channels, repeat_per_channel, split_channels
from tsformer.nn.revin import InstanceScale, RevIN

# the (B, T, Dy) tensors in the targets' units; everything else is per window. fut_linear: a linear
# forecast the network adds to its own (EncoderForecaster's linear path)
TARGET_KEYS = ("hist_target", "fut_target", "fut_linear")


@dataclass
class NetworkView:
    """How one batch was handed to the network, to bring its outputs back."""

    d_target: int  # target channels of the data
    channel_independent: bool
    scale: InstanceScale | None  # RevIN's map, in the network's layout: (B', 1, Dy')

    @property
    def d_target_net(self) -> int:
        return 1 if self.channel_independent else self.d_target

    def to_data_units(self, y: torch.Tensor) -> torch.Tensor:
        """`(B', T, C)` network outputs (targets first, then e.g. dec_only's past-only channels) ->
        the same with the target channels denormalised; the network's layout is kept."""
        if self.scale is None:
            return y
        Dy = self.d_target_net
        return torch.cat([self.scale.denormalise(y[..., :Dy]), y[..., Dy:]], dim=-1)  # (B', T, C)

    def to_batch_layout(self, y: torch.Tensor) -> torch.Tensor:
        """A prediction of the targets `(B', T, Dy')` -> `(B, T, Dy)` in the data's units."""
        y = self.to_data_units(y)
        return merge_channels(y, self.d_target) if self.channel_independent else y  # (B, T, Dy)

    def params_to_data_units(self, params: torch.Tensor, head) -> torch.Tensor:
        """A head's parameters `(B', T, C, P)` (targets first) with the target channels' distributions
        mapped back to the data's units (RevIN is a positive affine map per window and channel)."""
        if self.scale is None:
            return params
        Dy = self.d_target_net
        loc, scale = self.scale.loc, self.scale.scale  # (B', 1, Dy')
        return torch.cat([head.affine(params[..., :Dy, :], loc, scale), params[..., Dy:, :]], dim=-2)

    def params_to_batch_layout(self, params: torch.Tensor, head) -> torch.Tensor:
        """The parameters of a target prediction `(B', T, Dy', P)` -> `(B, T, Dy, P)`, data's units."""
        params = self.params_to_data_units(params, head)
        if not self.channel_independent:
            return params
        return merge_channels(params, self.d_target, channel_dim=-2)  # (B * Dy, T, 1, P) -> (B, T, Dy, P)

    def paths_to_batch_layout(self, paths: torch.Tensor) -> torch.Tensor:
        """Sampled target paths `(B', S, T, Dy')` -> `(B, S, T, Dy)` in the data's units."""
        if self.scale is not None:
            paths = self.scale.denormalise(paths.movedim(1, 0)).movedim(
                0, 1
            )  # (S, B', T, Dy'): loc, scale broadcast
        if not self.channel_independent:
            return paths
        return merge_channels(paths, self.d_target)  # (B * Dy, S, T, 1) -> (B, S, T, Dy)


class ModelOptions(nn.Module):
    """`model.revin`, `model.revin_affine`, `model.channel_independent` (see the module docstring)."""

    def __init__(
        self,
        d_target: int,
        revin: bool = False,
        revin_affine: bool = False,
        channel_independent: bool = False,
    ):
        super().__init__()
        if revin_affine and not revin:
            raise ValueError("model.revin_affine=true needs model.revin=true")
        self.d_target = d_target
        self.revin = RevIN(d_target, affine=revin_affine) if revin else None
        self.channel_independent = bool(channel_independent)

    @property
    def d_target_net(self) -> int:
        """Target channels the network reads and predicts: 1 per channel series with CI."""
        return 1 if self.channel_independent else self.d_target

    def enter(self, batch: dict) -> tuple[dict, NetworkView]:
        """The batch as the network sees it, and the view that brings its outputs back."""
        scale = None
        if self.revin is not None:
            scale = self.revin(batch["hist_target"])  # (B, 1, Dy): from the history only
            batch = batch | {k: scale.normalise(batch[k]) for k in TARGET_KEYS if k in batch}
        if self.channel_independent:
            Dy = self.d_target
            if batch["hist_target"].shape[-1] != Dy:
                raise ValueError(f"expected {Dy} target channels, got {tuple(batch['hist_target'].shape)}")
            batch = {k: self._split(k, v) for k, v in batch.items()}  # (B * Dy, ...)
            if scale is not None:  # (B, 1, Dy) -> (B * Dy, 1, 1), row for row with the targets
                scale = InstanceScale(loc=split_channels(scale.loc), scale=split_channels(scale.scale))
        return batch, NetworkView(self.d_target, self.channel_independent, scale)

    def _split(self, key: str, value):
        if key in TARGET_KEYS:
            return split_channels(value)  # (B, T, Dy) -> (B * Dy, T, 1)
        if torch.is_tensor(value) and value.dim() > 0:
            return repeat_per_channel(value, self.d_target)  # (B, ...) -> (B * Dy, ...)
        return value
