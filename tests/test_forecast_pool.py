"""The forecast pool's data configs (`data=exchange`, `data=ili`; src/tsformer/data/forecast_pool.py):
the literature's 70 / 10 / 20 % split by time, every window, no window's targets in two splits.
Skipped where ../shared/data/forecast_pool is absent."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate

from tsformer.data.forecast_pool import FILES, load_pool, protocol_split_rows
from tsformer.data.sources import REPO_ROOT
from tsformer.train import compose_config

DATA = REPO_ROOT.parent / "shared" / "data" / "forecast_pool"
needs_data = pytest.mark.needs_data(DATA)  # skipped where the folder is absent (conftest.py)


@needs_data
@pytest.mark.parametrize(
    ("config", "file", "L", "H"),
    [("exchange", "exchange_rate", 96, 720), ("ili", "national_illness", 104, 60)],
)
def test_the_split_is_the_literature_s_and_windows_stay_in_their_split(config, file, L, H, tmp_path):
    n_rows = len(pd.read_csv(DATA / f"{file}.csv"))
    val_row, test_row = protocol_split_rows(n_rows)
    assert (val_row, test_row) == {"exchange_rate": (5311, 6071), "national_illness": (676, 773)}[file]
    cfg = compose_config(
        ["experiment=ett", f"data={config}", f"model.context_len={L}", f"model.horizon={H}"], tmp_path
    )
    dm = instantiate(cfg.data)
    dm.setup()
    # the windows whose H target rows lie in each split, every one (stride 1), history reaching back
    expected = {"train": (0, val_row), "val": (val_row, test_row), "test": (test_row, n_rows)}
    for split, (first, end) in expected.items():
        ds = dm.datasets[split]
        assert len(ds.target) == n_rows  # the arrays hold the whole table: starts are its row numbers
        targets_from = ds.starts + L  # the first target row of each window
        assert targets_from.min() == max(first, L) and targets_from.max() + H == end, split
        assert len(ds.starts) == end - max(first, L) - H + 1, split
    assert dm.features.target_cols == list(FILES[file][1].values())
    frame = load_pool([], file)
    scaled_train = dm.datasets["train"].target.numpy()[:val_row]
    np.testing.assert_allclose(scaled_train.mean(axis=0), 0, atol=1e-4)  # the scaler saw the train rows only
    assert frame["time"].is_monotonic_increasing and len(frame) == n_rows
