"""The feature pipeline: a validated table's rows -> the model's scaled numbers, and back.

One object, used by training (`TimeSeriesDataModule.features`, which cuts its windows from what
`transform` gives) and by prediction (`Forecaster`, which loads it from the model folder's
`tsformer.json`): the two cannot drift apart. It holds
- the column roles: targets, known-future and past-only covariates, static numbers and categories;
- the calendar features (sin/cos pairs in [-1, 1], appended to the known covariates unscaled);
- per role a per-column affine scaler (`Affine`: original = scaled * scale + offset) fitted on the
  train rows with the scikit-learn scaler `data.scaler` names (standard, minmax, none), kept as
  plain numbers;
- per static categorical column its categories seen in the train rows (code 0: unseen).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch
from sklearn.preprocessing import MinMaxScaler, StandardScaler

from tsformer.data.calendar import calendar_feature_names, calendar_features

SCALERS = ("standard", "minmax", "none")


def check_scaler(kind: str) -> str:
    if kind not in SCALERS:
        raise ValueError(f"unknown scaler {kind!r}; choose 'standard', 'minmax' or 'none'")
    return kind


@dataclass
class Affine:
    """A fitted per-column scaler as numbers: original = scaled * scale + offset."""

    scale: list[float]
    offset: list[float]

    @classmethod
    def fit(cls, kind: str, values: np.ndarray) -> Affine:
        """The scaler `kind` fitted on `values` (rows, D) with scikit-learn, as numbers."""
        if check_scaler(kind) == "none":
            scale, offset = np.ones(values.shape[1]), np.zeros(values.shape[1])
        elif kind == "standard":
            # sklearn's own numbers: (x - mean_) / scale_ is exactly what its transform computes
            scaler = StandardScaler().fit(values)
            scale, offset = scaler.scale_, scaler.mean_
        else:
            # MinMaxScaler computes x * scale_ + min_; read off as an affine map by inverse-transforming
            # 0 and 1 (it handles constant columns as sklearn does)
            scaler = MinMaxScaler().fit(values)
            zeros = np.zeros((1, values.shape[1]))
            offset = scaler.inverse_transform(zeros)[0]
            scale = scaler.inverse_transform(zeros + 1.0)[0] - offset
        return cls(scale=[float(s) for s in scale], offset=[float(o) for o in offset])

    def transform(self, values):
        """Original -> scaled, numpy arrays or tensors `(..., D)` (tensors keep their dtype and device)."""
        if torch.is_tensor(values):
            scale, offset = self.tensors(values.device)
            return ((values.double() - offset) / scale).to(values.dtype)
        return (values - np.asarray(self.offset)) / np.asarray(self.scale)

    def inverse(self, values):
        """Scaled -> original, numpy arrays or tensors `(..., D)` (tensors keep their dtype and device)."""
        if torch.is_tensor(values):
            scale, offset = self.tensors(values.device)
            return (values.double() * scale + offset).to(values.dtype)
        return values * np.asarray(self.scale) + np.asarray(self.offset)

    def tensors(self, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """`(scale (D,), offset (D,))` float64 tensors."""
        return tuple(torch.tensor(v, dtype=torch.float64, device=device) for v in (self.scale, self.offset))


def static_codes(values, vocabulary: list[str]) -> np.ndarray:
    """Category codes: 1 + position in `vocabulary`, 0 for a category not in it."""
    lookup = {category: i + 1 for i, category in enumerate(vocabulary)}
    return np.array([lookup.get(str(v), 0) for v in values], dtype=np.int64)


class Features(NamedTuple):
    """The model's numbers of every row of a table: float32 `(rows, D)` arrays, int64 codes."""

    target: np.ndarray  # (rows, Dy) scaled
    known: np.ndarray  # (rows, Dk): known_cols scaled, then the calendar channels
    observed: np.ndarray  # (rows, Do) scaled
    static_num: np.ndarray  # (rows, S_num) scaled
    static_cat: np.ndarray  # (rows, S_cat) codes, 0 = a category not seen in training


@dataclass
class FeaturePipeline:
    """Column roles, calendar features, scalers and static vocabularies (see the module docstring).

    Also the first fields of the model folder's data contract (`forecaster.DataContract`), stored as
    they are here: plain numbers and names.
    """

    time_col: str
    target_cols: list[str]
    known_cols: list[str]
    observed_cols: list[str]
    calendar: list[str]
    target_scaler: Affine
    covariate_scaler: Affine | None  # known then observed columns; None when there are none
    static_cols: list[str] = field(default_factory=list)
    static_categorical_cols: list[str] = field(default_factory=list)
    static_scaler: Affine | None = None  # None when there are no static_cols
    static_vocabularies: dict[str, list[str]] = field(default_factory=dict)  # categories seen in training

    @classmethod
    def fit(
        cls,
        frame: pd.DataFrame,
        is_train: np.ndarray,
        *,
        scaler: str,
        time_col: str,
        target_cols: list[str],
        known_cols: list[str] = (),
        observed_cols: list[str] = (),
        calendar: list[str] = (),
        static_cols: list[str] = (),
        static_categorical_cols: list[str] = (),
    ) -> FeaturePipeline:
        """Fitted on the rows of the validated `frame` where `is_train` `(rows,)` is True."""
        covariate_cols = [*known_cols, *observed_cols]

        def fitted(columns):
            values = frame[list(columns)].to_numpy(dtype=np.float64)[is_train]  # (train rows, D)
            return Affine.fit(scaler, values) if columns else None

        vocabularies = {
            col: sorted(set(frame[col].astype(str).to_numpy()[is_train])) for col in static_categorical_cols
        }
        return cls(
            time_col=time_col,
            target_cols=list(target_cols),
            known_cols=list(known_cols),
            observed_cols=list(observed_cols),
            calendar=list(calendar),
            target_scaler=fitted(target_cols),
            covariate_scaler=fitted(covariate_cols),
            static_cols=list(static_cols),
            static_categorical_cols=list(static_categorical_cols),
            static_scaler=fitted(static_cols),
            static_vocabularies=vocabularies,
        )

    def pipeline_fields(self) -> dict:
        """This pipeline's own fields by name (of a `DataContract` too: they are its first ones)."""
        return {f.name: getattr(self, f.name) for f in fields(FeaturePipeline)}

    # -- sizes ------------------------------------------------------------------------------------

    @property
    def known_names(self) -> list[str]:
        """Known-future channels: known_cols, then the calendar sin/cos columns."""
        return [*self.known_cols, *calendar_feature_names(self.calendar)]

    @property
    def static_vocab_sizes(self) -> list[int]:
        """Embedding table sizes of the static categorical columns: categories + 1 (unseen)."""
        return [len(self.static_vocabularies[c]) + 1 for c in self.static_categorical_cols]

    # -- rows -> numbers ----------------------------------------------------------------------------

    def transform(self, frame: pd.DataFrame) -> Features:
        """The numbers of every row of `frame` (a validated table with the columns of the roles)."""

        def scaled(columns, affine):
            values = frame[list(columns)].to_numpy(dtype=np.float64)  # (rows, D)
            return affine.transform(values) if affine is not None else values

        covariates = scaled([*self.known_cols, *self.observed_cols], self.covariate_scaler)  # (rows, Dk+Do)
        n_known = len(self.known_cols)
        known, observed = covariates[:, :n_known], covariates[:, n_known:]
        if self.calendar:
            times = frame[self.time_col].to_numpy()
            known = np.hstack([known, calendar_features(times, self.calendar).to_numpy()])  # (rows, Dk)
        static_cat = np.zeros((len(frame), len(self.static_categorical_cols)), dtype=np.int64)
        for j, col in enumerate(self.static_categorical_cols):
            static_cat[:, j] = static_codes(frame[col].astype(str), self.static_vocabularies[col])

        def as_f32(a):
            return np.ascontiguousarray(a, dtype=np.float32)

        return Features(
            target=as_f32(scaled(self.target_cols, self.target_scaler)),
            known=as_f32(known),
            observed=as_f32(observed),
            static_num=as_f32(scaled(self.static_cols, self.static_scaler)),
            static_cat=static_cat,
        )

    def unseen_categories(self, frame: pd.DataFrame) -> dict[str, list[str]]:
        """Per static categorical column, the categories of `frame` not seen in training (if any)."""
        unseen = {}
        for col in self.static_categorical_cols:
            new = sorted(set(frame[col].astype(str)) - set(self.static_vocabularies[col]))
            if new:
                unseen[col] = new
        return unseen

    def transform_target(self, values):
        """Original units -> scaled, numpy arrays or tensors `(..., Dy)`, computed in float64 and
        returned in the dtype of `values` (float64 for integers)."""
        return self._on_targets(values, self.target_scaler.transform)

    def inverse_target(self, values):
        """Scaled -> original units, as `transform_target`."""
        return self._on_targets(values, self.target_scaler.inverse)

    def _on_targets(self, values, apply):
        values = values if torch.is_tensor(values) else np.asarray(values)
        if values.shape[-1] != len(self.target_cols):
            raise ValueError(
                f"last dimension must be the {len(self.target_cols)} targets, got shape {tuple(values.shape)}"
            )
        out = apply(values)
        return out.astype(values.dtype) if not torch.is_tensor(values) and values.dtype.kind == "f" else out

    # -- plain dicts (the model folder) ---------------------------------------------------------------

    def to_dict(self) -> dict:
        """JSON values: names, lists of numbers, the scalers as `{"scale": [...], "offset": [...]}`."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        """The inverse of `to_dict` (also for a subclass, such as the model folder's data contract)."""
        d = dict(d)
        for key in ("target_scaler", "covariate_scaler", "static_scaler"):
            d[key] = Affine(**d[key]) if d.get(key) else None
        return cls(**d)
