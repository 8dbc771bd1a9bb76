"""The package installed from its wheel trains and forecasts without the source tree.

The wheel is built from a copy of the files the build reads (the checkout keeps no build/ folder, and
no file left over from an earlier build can slip in), offline (`--no-build-isolation`: the
environment's setuptools). It is installed with `--target` into a folder put first on PYTHONPATH, so
the installed copy is imported, not the checkout's src/ (checked). From an empty folder,
`tsformer-train` composes the configs shipped in the wheel and trains a tiny run; the printed
`-m tsformer.predict` command and `tsformer-data simulate` work as an installed user has them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient

from conftest import REPO, TINY
from tsformer.jobs.forecasting.export import COLUMNS

BUILD_INPUTS = ["pyproject.toml", "setup.py", "README.md", "src", "conf"]
PACKAGED = "tsformer/conf/"  # where conf/ lies in the wheel
HORIZON = 70  # model=enc_dec's horizon: the rows to forecast


def run_installed(args: list, cwd: Path, site: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env |= {"PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, (args, proc.stderr[-3000:])
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built and installed into a folder of its own: that folder (the `--target`)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=skip)
        else:
            shutil.copy2(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "-q"]
    build = [*pip, "wheel", str(source), "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp)]
    subprocess.run(build, check=True, capture_output=True, timeout=600)
    (wheel,) = tmp.glob("tsformer-*.whl")
    conf = sorted(p.relative_to(REPO / "conf").as_posix() for p in (REPO / "conf").rglob("*.yaml"))
    with zipfile.ZipFile(wheel) as z:
        shipped = sorted(n.removeprefix(PACKAGED) for n in z.namelist() if n.startswith(PACKAGED))
    assert shipped == conf  # every config, and nothing else, under tsformer/conf
    site = tmp / "site"
    install = [*pip, "install", str(wheel), "--no-deps", "--no-index", "--target", str(site)]
    subprocess.run(install, check=True, capture_output=True, timeout=600)
    return site


@pytest.mark.slow
def test_the_installed_package_imports_from_its_own_folder(installed, tmp_path):
    code = "import tsformer.config as c; print(c.__file__, c.config_dir(), c.checkout_root())"
    out = run_installed([sys.executable, "-c", code], tmp_path, installed).stdout.split()
    assert out == [str(installed / "tsformer" / "config.py"), str(installed / "tsformer" / "conf"), "None"]


@pytest.mark.slow
def test_the_installed_package_trains_and_forecasts_from_an_empty_folder(installed, tmp_path):
    proc = run_installed([installed / "bin" / "tsformer-train", "model=enc_dec", *TINY], tmp_path, installed)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED"
    assert run.data.tags["git_commit"] == "unknown"  # no checkout: a repository around it is not tsformer's
    (model,) = tmp_path.glob("outputs/*/*/model")
    assert sorted(p.name for p in model.iterdir()) == ["tsformer.json", "weights.pt"]

    # the summary's predict command, as printed for an installed package, on new data from tsformer-data
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("forecast new data: ")]
    command = line.removeprefix("forecast new data: ")
    assert f"-m tsformer.predict {shlex.quote(str(model.resolve()))} " in command  # the folder: from anywhere
    simulate = [installed / "bin" / "tsformer-data", "simulate", "plant", "-o", "new.csv", "--n-series", "2",
                "--n-steps", "800", "--seed", "0", "--future-steps", str(HORIZON)]  # fmt: skip
    run_installed(simulate, tmp_path, installed)
    command = command.replace("<table.csv>", "new.csv").replace("forecasts.csv", "printed.csv")
    run_installed(shlex.split(command), tmp_path, installed)
    forecasts = pd.read_csv(tmp_path / "printed.csv")
    assert list(forecasts.columns) == COLUMNS
    assert len(forecasts) == 2 * HORIZON * 2 and forecasts.y_pred.notna().all()  # 2 series x H x 2 targets
