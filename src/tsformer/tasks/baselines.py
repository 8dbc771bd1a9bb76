"""Baselines, measured on exactly the windows the model is tested on.

A baseline has a `name` and a one-line `description` (printed under a run's summary), is fitted on
the train split and predicts the target steps of a batch of windows in scaled units
(`predict(batch) -> (B, T_out, Dy)`), like the task. `fit(train, features, table)` gets what it may
use: the train `WindowDataset`, the data's `FeaturePipeline` and the columns of the table it names
in `columns` (none but for `PowerCurve`), rows in the order of the datasets' arrays.
Every run measures the naive baseline of its job (metrics `test/baseline_*`):
- forecasting: `Persistence`, the last observed value repeated over the horizon, and beside it
  `LinearForecast` (metrics `test/linear_*`): the closed-form channel-shared ridge of `model=linear`
  (`models/linear.py`), the first thing a Transformer forecaster must beat;
- state reconstruction: `PerRowRegressor(LinearRegression())`, inputs -> states one row at a time,
  one regression per series.
More can be added per experiment (`baselines:` in the config), e.g. gradient boosting per row;
their metrics are `test/<name>_*`.

With a distribution head the naive baseline is also made probabilistic (`ErrorQuantiles`): its
forecast plus the empirical quantiles of its own errors on the validation windows, by step and
variable; its probabilistic metrics are `test/baseline_crps` etc.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from sklearn.base import clone
from sklearn.linear_model import LinearRegression
from torch.utils.data import DataLoader

from tsformer.data.features import FeaturePipeline
from tsformer.data.windows import WindowDataset
from tsformer.models.linear import ChannelSharedLinear, LinearConfig
from tsformer.tasks.probabilistic import QuantileFunctionForecast


def fit_baselines(
    baselines: list,
    train: WindowDataset,
    features: FeaturePipeline,
    frame: pd.DataFrame,
    val: WindowDataset | None = None,
) -> None:
    """Fit each baseline on the train windows, with the columns of `frame` (the validated table,
    rows as in the datasets' arrays) that it names in `columns`; a baseline that chooses a setting
    (`chooses_on_validation`) gets the validation windows `val` too."""
    for baseline in baselines:
        wanted = [c for c in getattr(baseline, "columns", ()) if c in frame.columns]
        if getattr(baseline, "chooses_on_validation", False):
            if val is None:
                raise ValueError(
                    f"the baseline {baseline.name} chooses its setting on validation windows: none given"
                )
            baseline.fit(train, features, frame[wanted], val=val)
        else:
            baseline.fit(train, features, frame[wanted])


class Persistence:
    """Forecast: the last observed target, `(B, N, Dy)` history -> `(B, M, Dy)`."""

    description = "the last observed value repeated over the horizon"

    def __init__(self, name: str = "baseline"):
        self.name = name

    def fit(self, train: WindowDataset, features: FeaturePipeline, table: pd.DataFrame) -> None:
        pass  # nothing to learn

    def predict(self, batch: dict) -> torch.Tensor:
        return batch["hist_target"][:, -1:].expand(-1, batch["fut_target"].shape[1], -1)


def window_batches(dataset: WindowDataset, batch_size: int = 1024) -> DataLoader:
    """Every window of `dataset` once, in order, batched as the model's loaders batch them."""
    return DataLoader(dataset, batch_size=batch_size, shuffle=False)


@dataclass
class SolvedLinear:
    """A closed-form linear forecaster as the task solved it (its linear path, its gate's reference, the
    `model=linear` network) on a data module's train windows, its penalty chosen on its validation windows:
    the run's `linear` baseline takes it instead of solving the same equations again (`LinearForecast.fit`),
    when it is the same fit (the same config, the same windows)."""

    cfg: LinearConfig
    state: dict[str, torch.Tensor]  # its state dict as solved (copies, before any training moves it)
    val_mse: dict[float, float]  # {penalty: validation MSE}, as `ChannelSharedLinear.fit` returned them
    train: WindowDataset  # the windows it was solved on (the data module's own objects)
    val: WindowDataset

    @classmethod
    def of(cls, model: ChannelSharedLinear, val_mse: dict, train: WindowDataset, val: WindowDataset):
        state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        return cls(model.cfg, state, dict(val_mse), train, val)

    def fits(self, cfg: LinearConfig, train: WindowDataset, val: WindowDataset) -> bool:
        """Whether solving `cfg` on `train` and `val` is this fit again."""
        return self.cfg == cfg and self.train is train and self.val is val


class LinearForecast:
    """The closed-form linear forecaster (`models/linear.py`, the `model=linear` family) as a baseline:
    fitted on the train windows, its penalty chosen on the validation windows, with the run's window
    sizes and known covariates. A few numpy-sized solves: seconds at L = 512 on ETT, ms on tiny runs.
    `solved`: the same fit, solved by the task already (`SolvedLinear`): taken as it is, not solved again."""

    chooses_on_validation = True

    def __init__(self, subtract: str = "last", name: str = "linear"):
        self.subtract = subtract
        self.name = name
        self.description = self._description(with_known=True)
        self.solved: SolvedLinear | None = None

    def _description(self, with_known: bool) -> str:
        known = " and the future known covariates" if with_known else ""
        return (
            f"ridge regression from each channel's window (minus its {self.subtract} value){known}, weights "
            "shared by the channels, penalty chosen on validation windows"
        )

    def fit(
        self, train: WindowDataset, features: FeaturePipeline, table: pd.DataFrame, val: WindowDataset
    ) -> None:
        cfg = LinearConfig(train.context_len, train.horizon, train.known.shape[1], self.subtract)
        self.description = self._description(with_known=cfg.d_known > 0)
        self.model = ChannelSharedLinear(cfg)
        if self.solved is not None and self.solved.fits(cfg, train, val):  # the task's solve of the same fit
            self.model.load_state_dict(self.solved.state)
            self.val_mse = dict(self.solved.val_mse)
        else:
            self.val_mse = self.model.fit(window_batches(train), window_batches(val))

    @torch.no_grad()
    def predict(self, batch: dict) -> torch.Tensor:
        self.model.to(batch["hist_target"].device)
        return self.model(batch["hist_target"], batch["fut_known"])  # (B, M, Dy)


class PerRowRegressor:
    """A scikit-learn regressor from the inputs of a step to its targets, without temporal context.

    Inputs: known + observed covariates of the target steps; fitted on the rows that train windows
    predict. Works for reconstruction windows (targets = the window) and forecast windows (targets =
    the future steps, whose known covariates are given; observed ones are not, so they are left out).

    With several series, one regressor per series (`per_series`, the default): series often differ
    by an offset or a gain that the inputs do not show, and a pooled fit would make a baseline that
    ignores them, which any model that knows the series beats without learning anything. A series
    without train rows gets the pooled regressor.
    """

    def __init__(self, estimator=None, name: str = "baseline", per_series: bool = True):
        self.estimator = estimator if estimator is not None else LinearRegression()
        self.name = name
        self.per_series = bool(per_series)
        per = " per series" if self.per_series else ""
        self.description = f"{type(self.estimator).__name__}{per} from each step's covariates to its targets"

    def fit(self, train: WindowDataset, features: FeaturePipeline, table: pd.DataFrame) -> None:
        self.reconstruction = train.targets_are_window
        rows = train.measured_target_rows()
        inputs = self._inputs_of_rows(train.known, train.observed)[rows].numpy()  # (R, D)
        targets = train.target[rows].numpy()  # (R, Dy)
        series = train.series[rows].numpy() if self.per_series else np.zeros(len(rows), dtype=np.int64)

        def fitted(selected: np.ndarray):
            y = targets[selected]
            return clone(self.estimator).fit(inputs[selected], y[:, 0] if y.shape[1] == 1 else y)

        self.by_series = {int(s): fitted(series == s) for s in np.unique(series)}
        self.pooled = next(iter(self.by_series.values())) if len(self.by_series) == 1 else fitted(slice(None))

    def _inputs_of_rows(self, known: torch.Tensor, observed: torch.Tensor) -> torch.Tensor:
        return torch.cat([known, observed], dim=-1) if self.reconstruction else known

    def predict(self, batch: dict) -> torch.Tensor:
        if self.reconstruction:
            inputs = self._inputs_of_rows(batch["hist_known"], batch["hist_observed"])  # (B, N, D)
        else:
            inputs = batch["fut_known"]  # (B, M, Dk)
        B, T, D = inputs.shape
        flat = inputs.detach().cpu().numpy()  # (B, T, D)
        series = batch["series"].cpu().numpy() if self.per_series else np.zeros(B, dtype=np.int64)  # (B,)
        pred = None
        for s in np.unique(series):
            windows = series == s
            estimator = self.by_series.get(int(s), self.pooled)
            part = estimator.predict(flat[windows].reshape(-1, D)).reshape(int(windows.sum()), T, -1)
            if pred is None:
                pred = np.empty((B, T, part.shape[-1]), dtype=part.dtype)  # (B, T, Dy)
            pred[windows] = part
        return torch.as_tensor(pred, dtype=inputs.dtype, device=inputs.device)


class PowerCurve:
    """Wind power forecast: the manufacturer's power curve at the forecast wind speed of each future step.

    What an operator has without any learning: the curve applied to the weather forecast, which is
    the same future wind the model gets (noisy in the forecast-error setting). It knows nothing of
    curtailment or downtime. The curve is read off the train rows of a column carried beside the
    model's (`extra_cols` of the DataModule, e.g. T1's `theoretical_power`): the median of
    (wind speed, curve) in bins of `bin_width` m/s, made non-decreasing, interpolated in between and
    held constant beyond the ends (np.interp). Needs one target, the power.
    """

    def __init__(
        self,
        speed_col: str = "wind_speed",
        curve_col: str = "theoretical_power",
        target_col: str = "power",
        bin_width: float = 0.1,
        name: str = "baseline_power_curve",
    ):
        self.description = "the manufacturer's power curve at the forecast wind speed"
        self.speed_col, self.curve_col, self.target_col = speed_col, curve_col, target_col
        self.columns = (speed_col, curve_col)  # the measured speed and the curve of the train rows
        self.bin_width = float(bin_width)
        self.name = name

    def fit(self, train: WindowDataset, features: FeaturePipeline, table: pd.DataFrame) -> None:
        """`table`: the columns speed_col and curve_col, rows as in `train`'s arrays."""
        if features.target_cols != [self.target_col]:
            raise ValueError(f"{self.name} predicts {self.target_col!r} only, not {features.target_cols}")
        if self.speed_col not in features.known_cols:
            raise ValueError(f"{self.name} needs {self.speed_col!r} among the known covariates")
        if self.curve_col not in table.columns:
            raise ValueError(f"{self.name} needs the column {self.curve_col!r} in data.extra_cols")
        rows = train.measured_target_rows()
        speed = table[self.speed_col].to_numpy()[rows]
        curve = table[self.curve_col].to_numpy()[rows]
        ok = np.isfinite(speed) & np.isfinite(curve)
        table = (
            pd.DataFrame({"speed": speed[ok], "power": curve[ok]})
            .groupby(np.floor(speed[ok] / self.bin_width).astype(np.int64))
            .median()
        )  # one row per speed bin, in increasing order
        self.speeds = table["speed"].to_numpy()
        self.powers = np.maximum.accumulate(table["power"].to_numpy())  # monotone up to rated power

        k = features.known_cols.index(self.speed_col)
        scaler = features.covariate_scaler
        self._speed_index, self._speed_scale, self._speed_offset = k, scaler.scale[k], scaler.offset[k]
        self._to_scaled = features.transform_target  # kW -> the target's scaled units

    def curve(self, speed: np.ndarray) -> np.ndarray:
        """Power (kW) at wind speeds (m/s), any shape."""
        return np.interp(speed, self.speeds, self.powers)

    def predict(self, batch: dict) -> torch.Tensor:
        fut_known = batch["fut_known"]  # (B, M, Dk) scaled
        speed = fut_known[..., self._speed_index].detach().cpu().numpy()  # (B, M) scaled
        speed = speed * self._speed_scale + self._speed_offset  # m/s
        power = self.curve(speed)[..., None]  # (B, M, 1) kW
        return torch.as_tensor(self._to_scaled(power), dtype=fut_known.dtype, device=fut_known.device)


class ErrorQuantiles:
    """A point baseline made probabilistic: its forecast plus the empirical quantiles of its own
    errors (truth - forecast) on every validation window, separately for each step and variable.

    For persistence this is the classic "persistence + climatology of its errors by lead time": the
    spread grows with the step as the errors do. Fitted after the point baseline (`fit_errors`),
    on the validation split only; filled steps (data.fill) are left out of the errors.
    """

    def __init__(self, point_baseline):
        self.point_baseline = point_baseline
        self.name = point_baseline.name
        self._cache: dict[tuple, torch.Tensor] = {}

    def fit_errors(self, val_batches, reconstruction: bool) -> None:
        """`val_batches`: the validation loader; `reconstruction`: windows without a horizon."""
        part = "hist" if reconstruction else "fut"
        errors = []
        for batch in val_batches:
            true = batch[f"{part}_target"]  # (B, T, Dy) scaled
            error = true - self.point_baseline.predict(batch).to(true.dtype)
            if f"{part}_valid" in batch:
                error = error.masked_fill(~batch[f"{part}_valid"].unsqueeze(-1), float("nan"))
            errors.append(error)
        self.errors = torch.cat(errors)  # (W_val, T, Dy), NaN on filled steps
        self._cache = {}

    def error_quantiles(self, levels) -> torch.Tensor:
        """`(T, Dy, K)` empirical quantiles of the validation errors at each step and variable."""
        key = tuple(float(x) for x in levels)
        if key not in self._cache:
            q = torch.nanquantile(
                self.errors.double(), torch.tensor(key, dtype=torch.float64), dim=0
            )  # (K, T, Dy)
            self._cache[key] = q.movedim(0, -1).float()  # (T, Dy, K)
        return self._cache[key]

    def forecast(self, batch: dict, point: torch.Tensor | None = None) -> QuantileFunctionForecast:
        """`point`: the point baseline's forecast of `batch` `(B, T, Dy)`, when the caller has it already."""
        point = self.point_baseline.predict(batch) if point is None else point  # (B, T, Dy)

        def quantiles(levels):
            return point.unsqueeze(-1) + self.error_quantiles(levels).to(
                point.device, point.dtype
            )  # (B, T, Dy, K)

        return QuantileFunctionForecast(quantiles, lambda: point)
