"""The notebooks run top to bottom (nbclient, tiny settings: TSFORMER_NB_TINY=1) and are committed
without outputs."""

from __future__ import annotations

import re

import nbformat
import pytest
from mlflow import MlflowClient
from nbclient import NotebookClient

from conftest import REPO

# per notebook: a pattern its outputs' text must show, and how many figures they hold
# (the quickstart prints its run's name, <family>-<data>-<HHMMSS>-<tag>, and status)
NOTEBOOKS = {
    "01_quickstart.ipynb": (r"enc_dec-plant-\d{6}-[0-9a-f]{6} FINISHED", 3),
    "02_inside_the_transformer.ipynb": ("x faster; largest difference", 4),
}


def code_cells(name: str) -> list:
    notebook = nbformat.read(REPO / "notebooks" / name, as_version=4)
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def test_notebooks_are_committed_without_outputs():
    assert sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb")) == sorted(NOTEBOOKS)
    for name in NOTEBOOKS:
        for cell in code_cells(name):
            assert cell.outputs == [] and cell.execution_count is None, (name, cell.source[:60])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs_top_to_bottom(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TSFORMER_NB_TINY", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    notebook = nbformat.read(REPO / "notebooks" / name, as_version=4)
    # the kernel runs in tmp_path: the notebook's mlflow.db and outputs/ land there
    resources = {"metadata": {"path": str(tmp_path)}}
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources=resources).execute()

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "tsformer"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    executed = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in executed)
    outputs = [out for cell in executed for out in cell.outputs]
    expected, n_figures = NOTEBOOKS[name]
    assert re.search(expected, "".join(out.get("text", "") for out in outputs))
    assert sum("image/png" in out.get("data", {}) for out in outputs) == n_figures
