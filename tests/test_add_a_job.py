"""docs/architecture.md's "Adding a job" is a recipe that works: a toy job built from only the files
that section names (in a copy of src/ and conf/) trains, names and tags its run after itself, and its
model folder answers through the `Predictor` as the new job.

The toy job reuses a task and forecasting's outputs (as the section allows: "or reuse a task that
fits"); what it checks is the plumbing: that no file outside the list has to change for a registered
job to run and answer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TINY

pytestmark = pytest.mark.slow  # one process that trains

SECTION = "## Adding a job"

# the toy job: path (as the section names it) -> the file's text; jobs/__init__.py gets its one line
TOY_FILES = {
    "tasks/regression.py": '''"""A toy task: the encoder forecaster under another name (tests/test_add_a_job.py)."""

from tsformer.tasks.forecasting import EncoderForecaster


class RegressionTask(EncoderForecaster):
    family = "enc_only_regressor"
''',
    "jobs/regression/__init__.py": '"""A toy job (tests/test_add_a_job.py)."""\n',
    "jobs/regression/job.py": '''"""A toy job: forecasting's outputs and answer, under its own name."""

from dataclasses import replace

from tsformer.jobs.base import predict_usage
from tsformer.jobs.forecasting import job as forecasting
from tsformer.tasks.regression import RegressionTask

JOB = replace(
    forecasting.JOB,
    name="regression",
    tasks=(RegressionTask,),
    usage=predict_usage("answer new data", "--output", "answers.csv"),
)
''',
    "conf/model/enc_only_regressor.yaml": """defaults:
  - enc_only_forecast
  - _self_

_target_: tsformer.tasks.regression.RegressionTask
""",
}
REGISTRY = "jobs/__init__.py"

SCRIPT = """
import json, sys
import tsformer
from tsformer.serving.predictor import Predictor
from tsformer.train import compose_config, run
from pathlib import Path

overrides, out = json.loads(sys.argv[1]), Path(sys.argv[2])
result = run(compose_config(overrides, out))
predictor = Predictor.of_folder(result.model_folder)
answer = predictor.predict(result.outputs.example, {}, source="example")
found = {"job": predictor.job.name, "rows": len(answer), "run_id": result.run_id, "package": tsformer.__file__}
print("RESULT", json.dumps(found))
"""


def named_files(doc: str) -> set[str]:
    """The files the section names: the first `path` of each row of its table, and those of the
    paragraph after it (`conf/...`), as paths under src/tsformer or the top of the checkout."""
    section = doc.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    files = {re.search(r"`([^`]+)`", row.split("|")[2]).group(1) for row in rows}
    files |= set(re.findall(r"`(conf/[^`]+\.yaml)`", section))
    return files


def test_the_section_names_the_files_of_a_job_and_the_toy_writes_no_other():
    files = named_files((REPO / "docs" / "architecture.md").read_text())
    assert REGISTRY in files
    assert set(TOY_FILES) <= files, set(TOY_FILES) - files


def test_a_toy_job_from_only_the_files_named_trains_tags_its_run_and_answers(tmp_path):
    assert set(TOY_FILES) | {REGISTRY} <= named_files((REPO / "docs" / "architecture.md").read_text())
    copy = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "src", copy / "src", ignore=ignore)
    shutil.copytree(REPO / "conf", copy / "conf", ignore=ignore)
    package = copy / "src" / "tsformer"
    for path, text in TOY_FILES.items():
        target = copy / path if path.startswith("conf/") else package / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    registry = package / REGISTRY
    registered = registry.read_text()
    assert "REGISTERED = (\n" in registered
    registry.write_text(registered.replace("REGISTERED = (\n", 'REGISTERED = (\n    "regression",\n', 1))

    work = tmp_path / "work"
    work.mkdir()
    overrides = ["model=enc_only_regressor", *TINY, f"logger.mlflow.tracking_uri=sqlite:///{work}/mlflow.db"]
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(overrides), str(work / "out")],
        check=False, cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert Path(result["package"]).is_relative_to(copy), result["package"]  # the copy ran, not the checkout
    assert result["job"] == "regression" and result["rows"] > 0

    import mlflow

    run = mlflow.tracking.MlflowClient(f"sqlite:///{work}/mlflow.db").get_run(result["run_id"])
    assert run.data.tags["job"] == "regression"
    assert run.info.run_name.startswith("regression-enc_only_regressor-")
