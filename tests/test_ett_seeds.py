"""benchmarks/ett_seeds.py: the recipe's test MSE of a gated run's row is the ungated model's with
--ungated, and --compare divides the new rows' validation MSE by the base rows' of the same seed."""

from __future__ import annotations

import pytest

from conftest import import_benchmark

MAIN = "| model | dataset | L | H | mse | mae | train_s | params | source |\n|---|---|---|---|---|---|---|---|---|\n"
DETAIL = (
    "| model | dataset | L | H | steps | linear_mse_same_run | best_val_mse | gate_test_ungated |\n"
    "|---|---|---|---|---|---|---|---|\n"
)


def results(path, rows):
    """A results file with one (main, detail) pair of rows per (H, mse, val, ungated)."""
    main = "".join(f"| m | D | 96 | {h} | {mse} | 0.1 | 5.0 | 10 | measured now |\n" for h, mse, _, _ in rows)
    detail = "".join(f"| m | D | 96 | {h} | 7 | 0.5 | {val} | {ungated} |\n" for h, _, val, ungated in rows)
    path.write_text(f"# t\n\n{MAIN}{main}\ntext\n\n{DETAIL}{detail}")
    return path


def test_ungated_takes_a_gated_rows_model_as_trained(tmp_path):
    seeds = import_benchmark("ett_seeds")
    path = results(tmp_path / "D_seed0.md", [(96, 0.40, 0.30, 0.38), (192, 0.50, 0.35, "-")])
    gated = seeds.seed_rows([path])
    ungated = seeds.seed_rows([path], ungated=True)
    assert gated[("m", "D", "96", "96", "0")]["mse"] == 0.40
    assert ungated[("m", "D", "96", "96", "0")]["mse"] == 0.38
    assert ungated[("m", "D", "96", "192", "0")]["mse"] == 0.50  # no gate: the row's own mse


def test_compare_divides_validation_mse_of_the_same_row_and_seed(tmp_path, capsys):
    seeds = import_benchmark("ett_seeds")
    base = results(tmp_path / "base_seed0.md", [(96, 0.40, 0.30, "-"), (192, 0.50, 0.40, "-")])
    new = results(tmp_path / "new_seed0.md", [(96, 0.41, 0.27, "-"), (192, 0.52, 0.44, "-")])
    seeds.compare([base], [new])
    out = capsys.readouterr().out
    assert "| 0.3000 | 0.2700 | 0.9000 |" in out and "| 0.4000 | 0.4400 | 1.1000 |" in out
    assert "mean r over 2 rows: 1.00000" in out
    with pytest.raises(SystemExit, match="no base row"):
        seeds.compare([base], [results(tmp_path / "other_seed1.md", [(96, 0.4, 0.3, "-")])])
