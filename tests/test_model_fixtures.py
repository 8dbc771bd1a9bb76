"""Model folders written by an older tsformer (tests/fixtures/README.md) still load and predict the same."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from tsformer.predict import main as predict_main

FIXTURES = REPO / "tests" / "fixtures"


@pytest.mark.parametrize("name", ["forecaster_v2", "classifier_1"])
def test_an_old_model_folder_predicts_what_it_predicted_when_written(name, tmp_path):
    out = tmp_path / "out.csv"
    args = [str(FIXTURES / name), str(FIXTURES / f"{name}_input.csv"), "--output", str(out)]
    assert predict_main(args) == 0
    got, expected = pd.read_csv(out), pd.read_csv(FIXTURES / f"{name}_expected.csv")
    assert list(got.columns) == list(expected.columns)
    numbers = expected.select_dtypes("number").columns
    text = [c for c in expected.columns if c not in numbers]
    assert got[text].astype(str).equals(expected[text].astype(str))
    np.testing.assert_allclose(got[numbers].to_numpy(float), expected[numbers].to_numpy(float), atol=1e-6)
