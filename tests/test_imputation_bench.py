"""benchmarks/imputation.py: a --quick run writes its table into the results file between its markers,
keeping the notes around it; the interpolation baseline is scored beside the model. Skips where
../shared is absent."""

from __future__ import annotations

import sys

import pytest

from conftest import REPO, import_benchmark

DATA = REPO.parent / "shared" / "data" / "ETT-small"


@pytest.mark.slow
@pytest.mark.needs_data(DATA / "ETTh1.csv")
def test_quick_run_writes_its_table_between_the_notes(tmp_path, monkeypatch):
    """The script's `main` in this process, as `python benchmarks/imputation.py ...` from an empty folder."""
    results = tmp_path / "RESULTS.md"
    results.write_text("notes before\n<!-- table t -->\nold\n<!-- /table t -->\nnotes after\n")
    monkeypatch.setenv("TSFORMER_DATA_DIR", str(REPO.parent / "shared" / "data"))
    monkeypatch.chdir(tmp_path)
    argv = [str(REPO / "benchmarks" / "imputation.py"), "--quick", "--datasets", "ETTh1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--ratios", "0.5", "--results", str(results), "--table", "t"])
    import_benchmark("imputation").main()
    text = results.read_text()
    assert text.startswith("notes before\n<!-- table t -->\n") and text.endswith(
        "<!-- /table t -->\nnotes after\n"
    )
    assert "old" not in text and "test windows: ETTh1 2785" in text
    row = next(line for line in text.splitlines() if line.startswith("| ETTh1"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    _, ratio, mse, mae, interp_mse, interp_mae, timesnet, *_ = cells
    assert (ratio, timesnet) == ("0.5", "0.1159")
    assert all(float(v) > 0 for v in (mse, mae, interp_mse, interp_mae))
