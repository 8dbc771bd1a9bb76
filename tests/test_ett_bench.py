"""benchmarks/ett.py (ETT side by side): a --quick run of one of our families writes a RESULTS-style
table whose row was evaluated on every test window of the protocol. Skips where ../shared is absent."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from conftest import REPO, import_benchmark

DATA = REPO.parent / "shared" / "data" / "ETT-small"
needs_data = pytest.mark.needs_data(DATA / "ETTh1.csv")  # skipped where the file is absent (conftest.py)


def parse_tables(text: str) -> list[list[dict[str, str]]]:
    """Every markdown table in `text`, as lists of {column: cell}."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("| "):
                rows.append(dict(zip(header, (c.strip() for c in lines[i].strip("|").split("|")))))
                i += 1
            tables.append(rows)
        else:
            i += 1
    return tables


def import_bench():
    return import_benchmark("ett")


def test_drop_last_mse_keeps_whole_batches_from_the_start():
    bench = import_bench()
    window_mse = np.r_[np.ones(256), np.full(97, 100.0)]  # 353 windows: 2 whole batches of 128, then 97
    assert bench.drop_last_mse(window_mse) == 1.0
    assert np.isnan(bench.drop_last_mse(np.ones(100)))  # not one whole batch


def test_protocol_window_counts():
    bench = import_bench()
    assert bench.protocol_test_windows("ETTh1", 96) == 2785
    assert bench.protocol_test_windows("ETTh1", 720) == 2161
    assert bench.protocol_test_windows("ETTm1", 96) == 11425


# issue 48's recipe as its measured runs composed it (benchmarks/RESULTS_forecasting.md, "The recipe,
# committed before its measured run"), before its settings moved to conf/experiment/forecast_recipe.yaml
MEASURED_RECIPE = [
    "experiment=ett",
    "model=patchtst",
    "model.net.d_model=16",
    "model.net.n_heads=1",
    "model.net.ffn_expansion=8",
    "model.net.dropout=0.3",
    "model.net.attention_output_dropout=0.51",
    "model.linear_path=true",
    "data.batch_size=128",
    "+trainer.val_check_interval=0.25",
    "model.context_len=512",
    "trainer.max_epochs=2",
]


# issue 56's measured run (benchmarks/RESULTS_forecasting.md, "The linear gate and the forecast pool"):
# the same training (it ran with linear_gate=channel; every form was scored); the recipe reports its
# ungated forecast (the gate is opt-in)
MEASURED_GATED_RECIPE = [*MEASURED_RECIPE, "model.linear_gate=none"]


def test_recipe_row_is_the_forecast_recipe_experiment_as_measured(tmp_path):
    """ett.py's tsformer-recipe row (as its --epochs 2 runs compose it), `python train.py
    experiment=forecast_recipe` and the measured runs' settings give the same model, data and trainer."""
    from tsformer.train import compose_config

    bench = import_bench()
    row = [*bench.row_overrides("tsformer-recipe"), "model.context_len=512", "trainer.max_epochs=2"]
    configs = [
        OmegaConf.to_container(compose_config([*overrides, "model.horizon=192"], tmp_path), resolve=True)
        for overrides in (row, ["experiment=forecast_recipe"], MEASURED_GATED_RECIPE)
    ]
    GlobalHydra.instance().clear()
    for key in ("model", "data", "trainer", "callbacks"):
        assert configs[0][key] == configs[1][key] == configs[2][key], key
    assert configs[1]["model"]["linear_path"] and configs[1]["model"]["net"]["n_heads"] == 1


@pytest.mark.slow
@needs_data
def test_quick_run_writes_results_rows(tmp_path, monkeypatch, capsys):
    """The script's `main` in this process, as `python benchmarks/ett.py ...` from an empty folder (a
    process would add only its imports)."""
    results = tmp_path / "RESULTS.md"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    argv = [
        str(REPO / "benchmarks" / "ett.py"),
        "--quick",
        "--models",
        "tsformer-enc_only_forecast",
        "--datasets",
        "ETTh1",
        "--lookbacks",
        "96",
        "--horizons",
        "96",
        "--results",
        str(results),
        "--override",
        "trainer.limit_train_batches=2",  # fewer steps than the --quick budget of 3
    ]
    monkeypatch.setattr(sys, "argv", argv)
    import_bench().main()
    printed = capsys.readouterr().out
    assert (tmp_path / "mlflow.db").is_file()  # every run is logged, where the script was run

    main, details = parse_tables(results.read_text())
    assert list(main[0]) == ["model", "dataset", "L", "H", "mse", "mae", "train_s", "params", "source"]
    ours = [r for r in main if r["model"] == "tsformer-enc_only_forecast"]
    assert len(ours) == 1
    row = ours[0]
    assert (row["dataset"], row["L"], row["H"]) == ("ETTh1", "96", "96")
    assert 0 < float(row["mse"]) < 10 and 0 < float(row["mae"]) < 10
    assert int(row["params"].replace(",", "")) > 0 and float(row["train_s"]) > 0
    assert row["source"].startswith("measured") and "--quick" in row["source"]
    published = [r for r in main if r["source"].startswith("Nie et al.")]
    assert [(r["dataset"], r["H"], r["mse"]) for r in published] == [("ETTh1", "96", "0.3700")]

    detail = next(r for r in details if r["model"] == "tsformer-enc_only_forecast")
    assert (
        detail["test_windows"] == detail["expected_windows"] == "2785"
    )  # every rolling origin of the test period
    assert float(detail["persistence_mse_ours"]) > 0
    # the MSE over the windows a drop_last loader of 128 keeps (2688 of 2785): close to, not equal to, mse
    assert 0 < float(detail["mse_drop_last_128"]) < 10 and detail["mse_drop_last_128"] != row["mse"]
    assert detail["steps"] == "2"  # the optimizer steps the run made, not the budget
    assert "--override trainer.limit_train_batches=2" in results.read_text()  # the command line, recorded
    assert "2785 test windows (protocol 2785" in printed


def test_count_ops_counts_work_not_views():
    import torch

    bench = import_bench()
    x = torch.randn(3, 4)
    assert bench.count_ops(lambda: (x.view(12).unsqueeze(0).transpose(0, 1), x.unbind(0), x.split(1))) == 0
    assert bench.count_ops(lambda: (x @ x.t()).relu()) == 2  # mm, relu
    w = torch.randn(4, 2, requires_grad=True)
    assert bench.count_ops(lambda: (x @ w).sum().backward()) > 2  # the backward's ops count too


def test_op_times_lists_the_ops_of_a_step_largest_first():
    """Which op comes first depends on the machine's load: the test checks the table, not a timing."""
    import torch

    bench = import_bench()
    big, small = torch.randn(400, 400), torch.randn(3)

    def step():
        (big @ big).sum()
        small.relu()

    ops, total_ms = bench.op_times(step, n_top=20, cuda=False)
    assert {"mm", "sum"} <= {name for name, _ in ops}  # aten op names, without the prefix
    times = [ms for _, ms in ops]
    assert times == sorted(times, reverse=True) and min(times) >= 0  # ms per step, largest first
    assert total_ms >= sum(times) - 0.05 * len(times)  # within the whole step (each rounded to 0.1 ms)
    assert len(bench.op_times(step, n_top=2, cuda=False)[0]) == 2


@pytest.mark.slow
@needs_data
@pytest.mark.parametrize("mode", ["step", "network"])
def test_throughput_child_times_our_training_step(mode, monkeypatch):
    monkeypatch.chdir(REPO)  # the ETT configs read ../shared relative to the project
    bench = import_bench()
    row = bench.throughput_child("tsformer-enc_dec", 96, 96, steps=1, d_model=16, mode=mode, profile_ops=4)
    assert row["model"] == "tsformer-enc_dec" and row["mode"] == mode
    assert row["channel_windows_per_s"] > 0 and row["ops_per_step"] > 50
    assert len(row["top_ops_ms_per_step"]) == 4
    assert row["profiled_ms_per_step"] >= sum(ms for _, ms in row["top_ops_ms_per_step"]) > 0
