"""The feature pipeline: one object scales training's windows and `Forecaster`'s batches.

Fitted on train rows with scikit-learn's numbers, kept as plain numbers in the model folder, and the
same code path for both: a perturbed scaler number moves the DataModule's windows and the loaded
model's batches together, and the two stay equal to the bit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.preprocessing import MinMaxScaler, StandardScaler

from conftest import PLANT_KNOWN, PLANT_TARGETS, TINY
from tsformer.data import TimeSeriesDataModule, simulate_plant
from tsformer.data.features import Affine, FeaturePipeline
from tsformer.jobs.forecasting.forecaster import DataContract, Forecaster, ModelInfo, save_model_folder
from tsformer.train import build_task, compose_config

N, M = 12, 4
PARTS = ["hist_target", "hist_known", "hist_observed", "fut_known", "static_num", "static_cat"]


def table() -> pd.DataFrame:
    """Plant series with every kind of feature: known, observed, static numbers and categories."""
    df = simulate_plant(n_series=2, n_steps=240, seed=0)
    return df.assign(rated_kw=df.series_id.map({0: 50.0, 1: 75.0}), kind=df.series_id.map({0: "A", 1: "B"}))


def datamodule(df: pd.DataFrame, scaler: str = "standard") -> TimeSeriesDataModule:
    dm = TimeSeriesDataModule(
        df,
        target_cols=PLANT_TARGETS,
        known_cols=PLANT_KNOWN[:2],
        observed_cols=PLANT_KNOWN[2:],
        series_col="series_id",
        calendar_features=["hour", "dayofweek"],
        static_cols=["rated_kw"],
        static_categorical_cols=["kind"],
        context_len=N,
        horizon=M,
        scaler=scaler,
    )
    dm.setup()
    return dm


def both_batches(dm: TimeSeriesDataModule, df: pd.DataFrame, folder) -> tuple[dict, dict]:
    """The DataModule's test windows as one batch, and the batch the model folder's `Forecaster`
    builds of the same rows of the same table."""
    cfg = compose_config(
        ["model=enc_dec", *TINY, f"model.context_len={N}", f"model.horizon={M}"], folder / "cfg"
    )
    task = build_task(cfg.model, dm)
    save_model_folder(folder / "model", task, dm, ModelInfo(family=task.family, dataset="plant"))
    forecaster = Forecaster.load(folder / "model")
    test = dm.datasets["test"]
    from_dm = {k: torch.stack([test[i][k] for i in range(len(test))]) for k in PARTS}
    clean = forecaster._validate(df, "plant", None)  # rows in the DataModule's order (series, time)
    windows = [(None, start, None, None) for start in test.starts]  # the batch reads the start rows
    from_model, _ = forecaster.batch(clean, windows)
    return from_dm, from_model


def test_a_perturbed_scaler_moves_training_windows_and_prediction_batches_together(tmp_path, monkeypatch):
    df = table()
    dm = datamodule(df)
    from_dm, from_model = both_batches(dm, df, tmp_path / "fitted")

    fit = FeaturePipeline.fit.__func__

    def perturbed(cls, *args, **kwargs):  # one number of the fitted pipeline: the first target's scale
        pipeline = fit(cls, *args, **kwargs)
        pipeline.target_scaler.scale[0] *= 3.0
        return pipeline

    monkeypatch.setattr(FeaturePipeline, "fit", classmethod(perturbed))
    other = datamodule(df)
    moved_dm, moved_model = both_batches(other, df, tmp_path / "perturbed")

    assert other.features.target_scaler.scale[0] == 3.0 * dm.features.target_scaler.scale[0]
    for part in PARTS:  # the two paths agree to the bit, before and after
        assert torch.equal(from_dm[part], from_model[part]), part
        assert torch.equal(moved_dm[part], moved_model[part]), part
    # and both moved: the first target a third of what it was (about its mean), nothing else
    torch.testing.assert_close(moved_model["hist_target"][..., 0], from_model["hist_target"][..., 0] / 3.0)
    for part in PARTS[1:]:
        assert torch.equal(moved_model[part], from_model[part]), part
    assert torch.equal(moved_model["hist_target"][..., 1], from_model["hist_target"][..., 1])


@pytest.mark.parametrize("kind, sklearn", [("standard", StandardScaler), ("minmax", MinMaxScaler)])
def test_affine_scalers_are_scikit_learns(kind, sklearn):
    values = np.random.default_rng(0).normal(5.0, 3.0, size=(50, 3))
    values[:, 2] = 7.0  # a constant column: scale 1, as scikit-learn does
    affine, fitted = Affine.fit(kind, values), sklearn().fit(values)
    new = np.random.default_rng(1).normal(5.0, 3.0, size=(20, 3))
    if kind == "standard":  # the same arithmetic: equal to the bit
        np.testing.assert_array_equal(affine.transform(new), fitted.transform(new))
        np.testing.assert_array_equal(affine.inverse(new), fitted.inverse_transform(new))
    np.testing.assert_allclose(affine.transform(new), fitted.transform(new), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(affine.inverse(new), fitted.inverse_transform(new), rtol=1e-12)
    assert affine.scale[2] == 1.0
    t = torch.tensor(new, dtype=torch.float32)
    assert affine.inverse(t).dtype == torch.float32
    torch.testing.assert_close(affine.inverse(t), torch.tensor(affine.inverse(new), dtype=torch.float32))


def test_the_pipeline_round_trips_as_plain_numbers():
    df = table()
    dm = datamodule(df)
    features = dm.features
    assert features.static_vocabularies == {"kind": ["A", "B"]}
    calendar = ["cal_hour_sin", "cal_hour_cos", "cal_dayofweek_sin", "cal_dayofweek_cos"]
    assert features.known_names == [*PLANT_KNOWN[:2], *calendar]
    again = FeaturePipeline.from_dict(features.to_dict())
    assert again == features
    arrays, back = features.transform(dm.frame), again.transform(dm.frame)
    for a, b in zip(arrays, back):
        np.testing.assert_array_equal(a, b)
    # the model folder's contract is the same pipeline with the window and reading options
    contract = DataContract.of(dm)
    assert isinstance(contract, FeaturePipeline) and contract.to_dict()["context_len"] == N
    assert DataContract.from_dict(contract.to_dict()) == contract


def test_both_paths_scale_with_the_same_code(tmp_path, monkeypatch):
    """A changed scaling step (every scaled number off by 0.1%) changes training's windows and the
    model's batches alike: there is no second copy of it."""
    df = table()
    transform = Affine.transform

    def off(self, values):
        return transform(self, values) * 1.001

    monkeypatch.setattr(Affine, "transform", off)
    from_dm, from_model = both_batches(datamodule(df), df, tmp_path)
    for part in PARTS:
        assert torch.equal(from_dm[part], from_model[part]), part
    monkeypatch.undo()
    before, _ = both_batches(datamodule(df), df, tmp_path / "before")
    torch.testing.assert_close(from_dm["hist_target"], before["hist_target"] * 1.001)
