"""Baselines, measured on exactly the windows the model is tested on.

A baseline has a `name`, is fitted on the train split (`fit(datamodule)`) and predicts the target
steps of a batch of windows in scaled units (`predict(batch) -> (B, T_out, Dy)`), like the task.
Every run measures the naive baseline of its job (metrics `test/baseline_*`):
- forecasting: `Persistence`, the last observed value repeated over the horizon;
- state reconstruction: `PerRowRegressor(LinearRegression())`, inputs -> states one row at a time.
More can be added per experiment (`baselines:` in the config), e.g. gradient boosting per row;
their metrics are `test/<name>_*`.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import LinearRegression


class Persistence:
    """Forecast: the last observed target, `(B, N, Dy)` history -> `(B, M, Dy)`."""

    def __init__(self, name: str = "baseline"):
        self.name = name

    def fit(self, datamodule) -> None:
        pass  # nothing to learn

    def predict(self, batch: dict) -> torch.Tensor:
        return batch["hist_target"][:, -1:].expand(-1, batch["fut_target"].shape[1], -1)


class PerRowRegressor:
    """A scikit-learn regressor from the inputs of a step to its targets, without temporal context.

    Inputs: known + observed covariates of the target steps; fitted on the rows that train windows
    predict. Works for reconstruction windows (targets = the window) and forecast windows (targets =
    the future steps, whose known covariates are given; observed ones are not, so they are left out).
    """

    def __init__(self, estimator=None, name: str = "baseline"):
        self.estimator = estimator if estimator is not None else LinearRegression()
        self.name = name

    def fit(self, datamodule) -> None:
        train = datamodule.datasets["train"]
        self.reconstruction = train.horizon == 0
        rows = np.unique(train.target_rows())  # every row some train window predicts
        inputs = self._inputs_of_rows(train.known, train.observed)[rows].numpy()
        targets = train.target[rows].numpy()
        self.estimator.fit(inputs, targets[:, 0] if targets.shape[1] == 1 else targets)

    def _inputs_of_rows(self, known: torch.Tensor, observed: torch.Tensor) -> torch.Tensor:
        return torch.cat([known, observed], dim=-1) if self.reconstruction else known

    def predict(self, batch: dict) -> torch.Tensor:
        if self.reconstruction:
            inputs = self._inputs_of_rows(batch["hist_known"], batch["hist_observed"])  # (B, N, D)
        else:
            inputs = batch["fut_known"]  # (B, M, Dk)
        B, T, D = inputs.shape
        pred = self.estimator.predict(inputs.reshape(B * T, D).detach().cpu().numpy())  # (B*T,) or (B*T, Dy)
        pred = pred.reshape(B, T, -1)  # (B, T, Dy)
        return torch.as_tensor(pred, dtype=inputs.dtype, device=inputs.device)
