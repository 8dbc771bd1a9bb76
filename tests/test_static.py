"""Static covariates: one value per series, checked, scaled/encoded on train rows, seen by every family
at every step, and carried by the model folder to prediction."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
import torch
from hydra.utils import get_class

from conftest import PLANT_KNOWN, PLANT_TARGETS, TINY, plant_csv_overrides
from tsformer.data import DataValidationError, TimeSeriesDataModule, simulate_plant
from tsformer.jobs.forecasting.forecaster import Forecaster
from tsformer.tasks.base import RECONSTRUCTIONS
from tsformer.train import compose_config, run

TARGETS, KNOWN = PLANT_TARGETS, PLANT_KNOWN


def plant_with_statics(n_series=3, n_steps=300) -> pd.DataFrame:
    df = simulate_plant(n_series=n_series, n_steps=n_steps, seed=0)
    rated = {0: 50.0, 1: 75.0, 2: 100.0, 3: 125.0}
    kind = {0: "A", 1: "B", 2: "A", 3: "C"}
    return df.assign(rated_kw=df.series_id.map(rated), kind=df.series_id.map(kind))


def make_dm(df, **kw):
    args = {
        "target_cols": TARGETS,
        "known_cols": KNOWN,
        "series_col": "series_id",
        "context_len": 12,
        "horizon": 4,
        "static_cols": ["rated_kw"],
        "static_categorical_cols": ["kind", "series_id"],
        "eval_batch_size": 1000,
    }
    dm = TimeSeriesDataModule(df, **(args | kw))
    dm.setup()
    return dm


def test_static_values_reach_every_window_of_their_series():
    dm = make_dm(plant_with_statics())
    assert dm.d_static_num == 1
    assert dm.features.static_vocabularies == {"kind": ["A", "B"], "series_id": ["0", "1", "2"]}
    assert dm.static_vocab_sizes == [3, 4]  # + the 'unseen' code 0
    batch = next(iter(dm.test_dataloader()))
    info = dm.window_info("test")
    series = info.series_id.to_numpy()[batch["window"].numpy()]
    np.testing.assert_array_equal(batch["static_cat"][:, 1].numpy(), series + 1)
    np.testing.assert_array_equal(batch["static_cat"][:, 0].numpy(), np.where(series == 1, 2, 1))
    # rated_kw scaled on the train rows: standard scaling of 50/75/100 (equal row counts)
    expected = (np.array([50.0, 75.0, 100.0])[series] - 75.0) / np.std([50.0, 75.0, 100.0])
    np.testing.assert_allclose(batch["static_num"][:, 0].numpy(), expected, rtol=1e-5)


def test_a_static_column_that_changes_within_a_series_is_refused():
    df = plant_with_statics()
    df.loc[(df.series_id == 1) & (df.index % 300 == 100), "rated_kw"] = 80.0
    with pytest.raises(DataValidationError) as err:
        make_dm(df)
    message = str(err.value)
    for word in ["static column 'rated_kw'", "series 1", "80.0", "75.0", "time 2024-01-01 01:40:00"]:
        assert word in message, (word, message)
    df = plant_with_statics()
    df.loc[5, "kind"] = None
    with pytest.raises(DataValidationError, match="empty/NaN cell at column 'kind', row 5"):
        make_dm(df)


@pytest.mark.parametrize("family", ["enc_dec", "dec_only", "enc_only_forecast", "enc_only"])
def test_every_family_reads_the_static_covariates(family, in_tmp):
    """Same window, another series' static values -> another prediction (all families)."""
    cfg = compose_config([f"model={family}", *TINY], in_tmp)
    horizon = 0 if get_class(cfg.model._target_).produces == RECONSTRUCTIONS else 4
    dm = make_dm(plant_with_statics(), horizon=horizon)
    from hydra.utils import instantiate

    task = instantiate(
        cfg.model,
        _convert_="all",
        d_target=2,
        d_known=3,
        d_observed=0,
        context_len=12,
        horizon=horizon,
        d_static_num=dm.d_static_num,
        static_vocab_sizes=dm.static_vocab_sizes,
    ).eval()
    batch = next(iter(dm.test_dataloader()))
    with torch.no_grad():
        pred = task.forecast(batch)
        other = dict(batch, static_cat=(batch["static_cat"] % 2) + 1)  # other categories
        assert (task.forecast(other) - pred).abs().max() > 1e-5
        other = dict(batch, static_num=batch["static_num"] + 1.0)
        assert (task.forecast(other) - pred).abs().max() > 1e-5
    # the embeddings are trained: they receive gradients
    task.train()
    task.loss(batch).backward()
    assert all(e.weight.grad is not None and e.weight.grad.abs().sum() > 0 for e in task.static.embeddings)


@pytest.mark.slow
def test_model_folder_carries_the_statics_to_prediction(in_tmp, tmp_path, caplog):
    df = plant_with_statics(n_series=3, n_steps=800)
    df.to_csv(tmp_path / "plant.csv", index=False)
    overrides = [
        "model=dec_only",
        *plant_csv_overrides(tmp_path / "plant.csv"),
        "data.static_cols=[rated_kw]",
        "data.static_categorical_cols=[kind,series_id]",
        "logger=none",
    ]
    result = run(compose_config(overrides, in_tmp / "out"))
    forecaster = Forecaster.load(result.model_folder)
    origin = pd.Timestamp(result.forecasts.origin_time.max())
    table = df[df.time <= origin + 30 * pd.Timedelta("1min")].copy()
    table.loc[table.time > origin, TARGETS] = np.nan
    out = forecaster.predict(table)
    both = result.forecasts.merge(out, on=["series_id", "origin_time", "target_time", "step", "variable"])
    assert len(both) == len(out) == 3 * 30 * 2
    np.testing.assert_allclose(both.y_pred_y, both.y_pred_x, rtol=1e-5, atol=1e-5)
    # a new series of an unseen kind: forecast with the 'unseen' embeddings, and a warning naming them
    new = table[table.series_id == 2].assign(series_id=7, kind="Z")
    with caplog.at_level(logging.WARNING):
        assert forecaster.predict(new).y_pred.notna().all()
    assert "'kind': ['Z'] not seen in training" in caplog.text and "['7']" in caplog.text
    with pytest.raises(DataValidationError, match="missing column"):
        forecaster.predict(table.drop(columns="rated_kw"))
