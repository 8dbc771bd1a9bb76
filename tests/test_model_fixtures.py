"""Model folders written by an older tsformer (tests/fixtures/README.md), one of every header it wrote,
still load and predict the same: predict.py writes what that tsformer's predict.py wrote of the same
table (the anomaly model: its events beside its rows too)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from tsformer.predict import main as predict_main

FIXTURES = REPO / "tests" / "fixtures"
# folder -> the tables predict.py writes beside its output ('<stem>_<name>.csv')
OLD_FOLDERS = {"forecaster_v2": [], "classifier_1": [], "anomaly_1": ["events"], "ensemble_0": []}
# columns added to a table since (issue 57: an event's page beside its start, its first alarm)
ADDED = {"events": ["page_time", "page_delay_rows", "page_delay"]}


def assert_same_table(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert list(got.columns) == list(expected.columns)
    numbers = expected.select_dtypes("number").columns
    text = [c for c in expected.columns if c not in numbers]
    assert got[text].astype(str).equals(expected[text].astype(str))
    np.testing.assert_allclose(got[numbers].to_numpy(float), expected[numbers].to_numpy(float), atol=1e-6)


@pytest.mark.parametrize("name", list(OLD_FOLDERS))
def test_an_old_model_folder_predicts_what_it_predicted_when_written(name, tmp_path):
    out = tmp_path / "out.csv"
    args = [str(FIXTURES / name), str(FIXTURES / f"{name}_input.csv"), "--output", str(out)]
    assert predict_main(args) == 0
    assert_same_table(pd.read_csv(out), pd.read_csv(FIXTURES / f"{name}_expected.csv"))
    for beside in OLD_FOLDERS[name]:
        expected = pd.read_csv(FIXTURES / f"{name}_expected_{beside}.csv")
        got = pd.read_csv(tmp_path / f"out_{beside}.csv")
        if beside == "events":  # its rule pages at every alarm (1 of 1): each event paged at its start
            assert (got["page_delay_rows"] == 0).all() and got["page_time"].equals(got["start"])
        assert_same_table(got.drop(columns=ADDED.get(beside, [])), expected)
