"""Naive baselines, measured on exactly the windows the model is tested on.

- forecasting: the last observed value repeated over the horizon (persistence);
- state reconstruction: a per-step linear regression from the inputs to the states, fitted on the
  train rows (no temporal context: what the encoder adds over it is the value of the window).
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import LinearRegression


def persistence(hist_target: torch.Tensor, horizon: int) -> torch.Tensor:
    """`(B, N, Dy)` history -> `(B, M, Dy)`: the last observed value for every future step."""
    return hist_target[:, -1:].expand(-1, horizon, -1)


class PerStepLinearBaseline:
    """Linear regression inputs_t -> targets_t, one row at a time, fitted on the train rows."""

    def __init__(self):
        self.model = LinearRegression()

    def fit(self, inputs: np.ndarray, targets: np.ndarray) -> PerStepLinearBaseline:
        """inputs `(rows, D_in)`, targets `(rows, Dy)`, scaled units."""
        self.model.fit(inputs, targets)
        return self

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        """`(B, N, D_in)` -> `(B, N, Dy)`."""
        B, N, D = inputs.shape
        flat = inputs.reshape(B * N, D).detach().cpu().numpy()  # (B*N, D_in)
        pred = self.model.predict(flat).reshape(B, N, -1)  # (B, N, Dy)
        return torch.as_tensor(pred, dtype=inputs.dtype, device=inputs.device)
