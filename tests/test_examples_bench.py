"""benchmarks/examples.py: the linear baseline beside each worked example's model, and one line where the
model loses to it (issue 48, point 7). Pure functions on metric dicts: no run."""

from __future__ import annotations

import pytest

from conftest import import_benchmark


@pytest.fixture(scope="module")
def examples():
    return import_benchmark("examples")


def seeds(model: list[float], linear: list[float], name: str = "linear") -> list[dict]:
    return [
        {"test/mae_orig": m, f"test/{name}_mae_orig": lin, "test/baseline_mae_orig": 9.0}
        for m, lin in zip(model, linear)
    ]


def test_the_linear_baseline_is_shown_beside_the_model_and_a_loss_to_it_is_said(examples):
    losing = seeds([2.0, 2.2], [1.5, 1.7])
    figures = examples.linear_figures(losing, "linear")
    assert figures["model / linear"] == f"{2.1 / 1.6:.3f}"
    row = {"MAE (orig)": "2.1", **figures}
    (line,) = examples.loses_to_linear("plant, enc_dec", row, losing, ["baseline", "linear"], {})
    assert line.startswith("plant, enc_dec: the Transformer loses to the linear baseline")
    winning = seeds([1.0, 1.2], [1.5, 1.7])
    assert examples.loses_to_linear("plant", row, winning, ["baseline", "linear"], {}) == []
    # reconstruction (the gas turbine): its linear baseline is the naive one, the per-row regression
    gas = seeds([2.0], [1.0], name="baseline_hgb")
    gas[0]["test/baseline_mae_orig"] = 1.5
    spec = {"linear": "baseline"}
    assert examples.linear_figures(gas, "baseline")["model / linear"] == f"{2.0 / 1.5:.3f}"
    assert len(examples.loses_to_linear("gas", row, gas, ["baseline", "baseline_hgb"], spec)) == 1
    assert examples.linear_figures(gas, "linear")["linear MAE (orig)"] == "not measured"
