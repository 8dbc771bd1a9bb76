"""State reconstruction with the encoder-only family: infer hidden states from observed inputs.

Window of N steps: inputs = known + observed covariates `(B, N, Dk + Do)` -> targets `(B, N, Dy)`
at the same steps, with bidirectional attention (no forecasting). The baseline is a per-step linear
regression from the same inputs, fitted on the train rows of each series. With several series the
inputs alone may not tell which series a window is from: without a series-level input (static
columns, or the series id as a static category: an embedding per series) the model cannot learn
how the series differ, and the fit warns.

It takes none of the model options (`supported_options` is empty): the targets are what it infers,
never an input, so RevIN has no history statistics to take and channel independence no channel
series to split; its per-step outputs need one token per step (no patches).
With a distribution head it gives the marginal distribution of every step's states.
"""

from __future__ import annotations

import logging

import torch

from tsformer.models import EncoderOnly, EncoderOnlyConfig
from tsformer.tasks.base import RECONSTRUCTIONS, WindowTask, valid_steps
from tsformer.tasks.baselines import PerRowRegressor

log = logging.getLogger(__name__)


class ReconstructionTask(WindowTask):
    family = "enc_only"
    produces = RECONSTRUCTIONS

    def build_net(self, net: dict) -> EncoderOnly:
        hp = self.hparams
        d_in = self.d_known_in + hp.d_observed
        if d_in == 0:
            raise ValueError(
                "state reconstruction needs input columns: set data.known_cols or data.observed_cols"
            )
        return EncoderOnly(
            EncoderOnlyConfig(
                **net, d_in=d_in, d_out=hp.d_target, head="per_step", n_params=self.head.n_params
            )
        )

    @staticmethod
    def inputs(batch: dict) -> torch.Tensor:
        return torch.cat([batch["hist_known"], batch["hist_observed"]], dim=-1)  # (B, N, Dk + Do)

    def teacher_forced(self, batch: dict):  # nothing to force: the reconstruction itself
        return self.net(self.inputs(batch)), batch["hist_target"], valid_steps(batch, "hist")

    def predict_target(self, batch: dict) -> torch.Tensor:
        return self.head.point_of_raw(self.net(self.inputs(batch)))  # (B, N, Dy)

    def predict_params(self, batch: dict) -> torch.Tensor:
        return self.head.params(self.net(self.inputs(batch)))  # (B, N, Dy, P): marginal distribution per step

    def true_target(self, batch: dict) -> torch.Tensor:
        return batch["hist_target"]

    def target_valid(self, batch: dict) -> torch.Tensor:
        return valid_steps(batch, "hist")

    def naive_baseline(self) -> PerRowRegressor:
        return PerRowRegressor()  # linear regression inputs -> states, one row at a time, per series

    def on_fit_start(self) -> None:
        datamodule = self.trainer.datamodule
        if datamodule is None or self.static.width > 0:
            return
        n_series = datamodule.window_info("train").series_id.nunique()
        if n_series > 1:
            log.warning(
                "state reconstruction of %d series without a series-level input: the model gets no sign of "
                "which series a window is from, while the baseline is fitted per series; give each series "
                "an embedding (data.static_categorical_cols=[%s]) or its properties (data.static_cols)",
                n_series,
                datamodule.schema.series_col,
            )
