"""A table's windows follow the model's sizes: a data.context_len or data.horizon of its own is one line
before any data or MLflow run (the network would be built for other windows than it trains on)."""

from __future__ import annotations

import pytest

from tsformer import settings
from tsformer.settings import SettingError
from tsformer.train import compose_config


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.context_len=32", "data.context_len=32 differs from model.context_len=30"),
        ("data.horizon=5", "data.horizon=5 differs from model.horizon="),
    ],
)
def test_a_window_size_of_the_data_alone_is_refused(tmp_path, override, message):
    with pytest.raises(SettingError, match=message):
        settings.check(compose_config([override], tmp_path))


def test_the_model_sizes_set_the_windows(tmp_path):
    cfg = compose_config(["model.context_len=32", "model.horizon=5"], tmp_path)
    settings.check(cfg)  # no error
    assert (cfg.data.context_len, cfg.data.horizon) == (32, 5)
