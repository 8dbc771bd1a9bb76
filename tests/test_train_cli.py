"""`python train.py` as a user runs it: each run its own output folder, and what it prints.

- two runs started in the same second in one folder get a folder each, and each run's logged model
  is the one it trained (its forecasts through `predict.py <run id>` are its own CSV's);
- the summary's predict command works as printed, without the virtual environment active;
- a setting that cannot work, or bad data, is one line `error: ...` and exit status 2 before any
  MLflow run exists; HYDRA_FULL_ERROR=1 shows the traceback.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from conftest import REPO, TINY
from test_data_validation import BAD_INPUTS, good_table, good_table_overrides
from tsformer.data import simulate_plant

# every test here runs train.py (or reads a module fixture that does)
pytestmark = pytest.mark.slow

TARGETS = ["dynamic_temperature", "dynamic_pressure"]
KEYS = ["series_id", "origin_time", "target_time", "step", "variable"]
SEEDS = (1, 2)  # two runs of the same settings, different seeds: two different models

# Runs train.py as `python train.py <overrides>` would, once the file `go` exists, with Hydra's clock
# (`${now:...}`, the run folder's time) at the second written in it: the runs start in the same
# second for certain, however loaded the machine is.
STARTER = """
import datetime, runpy, sys, time
from pathlib import Path
go, ready, script = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
sys.argv = [script, *sys.argv[4:]]
import hydra.core.utils
import tsformer.train
ready.touch()
while not go.exists() or not go.read_text():
    time.sleep(0.005)
start = datetime.datetime.fromisoformat(go.read_text())

class Clock(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return start

hydra.core.utils.datetime = Clock
runpy.run_path(script, run_name="__main__")
"""


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"OMP_NUM_THREADS": "1"}


def runs_in(folder) -> list:
    db = Path(folder) / "mlflow.db"
    if not db.exists():
        return []
    client = MlflowClient(f"sqlite:///{db}")
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two tiny runs started together in one folder, no hydra.run.dir: (folder, {seed: stdout})."""
    folder = tmp_path_factory.mktemp("together")
    go = folder / "go"
    procs = {}
    for seed in SEEDS:
        cmd = [
            sys.executable,
            "-c",
            STARTER,
            str(go),
            str(folder / f"ready{seed}"),
            str(REPO / "train.py"),
            *TINY,
            f"seed={seed}",
        ]
        procs[seed] = subprocess.Popen(
            cmd, cwd=folder, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    deadline = time.time() + 300
    while not all((folder / f"ready{s}").exists() for s in SEEDS):
        assert time.time() < deadline and all(p.poll() is None for p in procs.values()), "a run did not start"
        time.sleep(0.05)
    go.write_text(datetime.now().replace(microsecond=0).isoformat())
    outputs = {}
    for seed, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        outputs[seed] = stdout
    return folder, outputs


def future_table(origin: pd.Timestamp, horizon: int) -> pd.DataFrame:
    """The tiny runs' table (TINY: 2 series, 800 steps, simulator seed 0) up to `origin`, then
    `horizon` rows per series with the targets empty."""
    df = simulate_plant(n_series=2, n_steps=800, freq="1min", seed=0)
    df = df[df.time <= origin + horizon * pd.Timedelta("1min")].copy()
    df.loc[df.time > origin, TARGETS] = np.nan
    return df


def test_runs_started_together_own_their_folder_and_model(two_runs, tmp_path, monkeypatch, capsys):
    from tsformer.predict import main as predict_main

    folder, _ = two_runs
    monkeypatch.chdir(folder)  # `predict.py <run id>` finds the run in ./mlflow.db, as from a shell there
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    runs = runs_in(folder)
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    out_dirs = [Path(r.data.tags["output_dir"]) for r in runs]
    # the case at issue: both folders named after the same second
    assert out_dirs[0].parent == out_dirs[1].parent and out_dirs[0].name[:8] == out_dirs[1].name[:8]
    assert out_dirs[0] != out_dirs[1]
    assert sorted(p.name for p in (folder / "outputs").glob("*/*")) == sorted(d.name for d in out_dirs)
    # <job>-<family>-<data file stem>-<start time>-<the folder's tag>: two names, each naming its folder
    names = {r.info.run_name for r in runs}
    assert len(names) == 2 and all(
        re.fullmatch(r"forecasting-enc_dec-plant-\d{6}-[0-9a-f]{6}", n) for n in names
    ), names
    assert {n[-6:] for n in names} == {d.name[-6:] for d in out_dirs}

    forecasts = {}
    for run, out_dir in zip(runs, out_dirs):
        assert sorted(p.name for p in (out_dir / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
        log = (out_dir / "train.log").read_text()  # this run's log alone
        assert f"MLflow run id: {run.info.run_id}" in log and log.count("MLflow run id") == 1
        own = pd.read_csv(out_dir / "forecasts.csv", parse_dates=["origin_time", "target_time"])
        origin = own.origin_time.max()
        horizon = int(own.step.max())
        future_table(origin, horizon).to_csv(tmp_path / "new.csv", index=False)
        result = tmp_path / f"{run.info.run_id}.csv"
        # predict.py's own code, in this process (the printed command runs as a process in the next test)
        assert predict_main([run.info.run_id, str(tmp_path / "new.csv"), "-o", str(result)]) == 0
        assert f"run {run.info.run_id}" in capsys.readouterr().out  # the logged model says which run wrote it
        logged = pd.read_csv(result, parse_dates=["origin_time", "target_time"])
        both = own.merge(logged, on=KEYS, suffixes=("_own", "_logged"))
        assert len(both) == len(logged) == 2 * horizon * len(TARGETS)
        np.testing.assert_allclose(both.y_pred_logged, both.y_pred_own, rtol=1e-4, atol=1e-4)
        forecasts[run.info.run_id] = logged.y_pred.to_numpy()
    first, second = forecasts.values()
    assert np.abs(first - second).max() > 1e-3  # two models: the comparison above can tell them apart


def test_the_printed_predict_command_works_as_shown_without_the_environment_active(two_runs, tmp_path):
    _, outputs = two_runs
    stdout = outputs[SEEDS[0]]
    (line,) = [line for line in stdout.splitlines() if line.startswith("forecast new data: ")]
    run_id = re.search(r"MLflow run id: ([0-9a-f]{32})", stdout).group(1)
    out_dir = Path(re.search(r"forecasts CSV: (.*)", stdout).group(1)).parent
    own = pd.read_csv(out_dir / "forecasts.csv", parse_dates=["origin_time"])
    future_table(own.origin_time.max(), int(own.step.max())).to_csv(tmp_path / "new.csv", index=False)
    command = line.removeprefix("forecast new data: ")
    assert (
        run_id in stdout and shlex.quote(str(out_dir / "model")) in command
    )  # the folder: no database needed
    command = command.replace("<table.csv>", shlex.quote(str(tmp_path / "new.csv")))
    command = command.replace("forecasts.csv", shlex.quote(str(tmp_path / "printed.csv")))
    # a shell as a user has it before `source .venv/bin/activate`, in another folder: no venv on PATH
    env = {k: v for k, v in clean_env().items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = "/usr/bin:/bin"
    proc = subprocess.run(
        command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, (command, proc.stderr[-3000:])
    assert (tmp_path / "printed.csv").exists()


def test_summary_says_what_the_baseline_and_the_units_are(two_runs):
    _, outputs = two_runs
    stdout = outputs[SEEDS[0]]
    assert "baseline: the last observed value repeated over the horizon" in stdout
    assert "*_orig rows: in the targets' own units" in stdout


# -- settings and data refused: one line, exit 2, no MLflow run ---------------------------------------

BAD_SETTINGS = {
    "data.batch_size=0": "data.batch_size=0",
    "model.lr=-1": "model.lr: -1",
    "data.eval_stride=0": "data.eval_stride=0",
    "seed=abc": "seed=abc",
    "data.val_fraction=0.6": "data.val_fraction=0.6 and data.test_fraction=0.5",
    "trainer.max_epochs=0": "trainer.max_epochs=0",
    "model.net.n_heads=3": "model: d_model=16 must be divisible by n_heads=3",  # refused by the model itself
}


def error_line(stderr: str) -> str:
    """The error message: the last line, the only one that says `error:` (log lines may precede it)."""
    lines = stderr.strip().splitlines()
    assert [line for line in lines if "error" in line.lower()] == lines[-1:], stderr[-3000:]
    return lines[-1]


def train_py(cwd, overrides, env=None, run_dir="out") -> subprocess.Popen:
    tiny = [o for o in TINY if not o.startswith("data.source.")] if "data=csv" in overrides else TINY
    cmd = [sys.executable, str(REPO / "train.py"), *tiny, *overrides, f"hydra.run.dir={run_dir}"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return subprocess.Popen(cmd, cwd=cwd, env=env or clean_env(), **pipes)


def refusal_in_process(overrides: list[str], output_dir: Path) -> str:
    """The user error train's `run` raises for `overrides`, as the text main() prints after `error: `
    (in this process: the process around it, exit 2 and one line, is tested with a process below)."""
    from tsformer.train import _user_error, compose_config, run

    with pytest.raises(Exception) as raised:
        run(compose_config(overrides, output_dir))
    user_error = _user_error(raised.value)
    assert user_error is not None, raised.value
    return str(user_error)


def test_each_bad_setting_is_a_user_error_naming_it_before_any_mlflow_run(in_tmp):
    for setting, message in BAD_SETTINGS.items():
        folder = in_tmp / setting
        folder.mkdir()
        extra = ["data.test_fraction=0.5"] if setting.startswith("data.val_fraction") else []
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(folder)
            refusal = refusal_in_process([*TINY, setting, *extra], folder / "out")
        assert refusal.startswith(message), (setting, refusal)
        assert "\n" not in refusal, setting  # one line
        assert not (folder / "mlflow.db").exists(), setting
        assert not (folder / "out" / "checkpoints").exists(), setting


def test_bad_data_is_one_line_exit_2_and_full_error_shows_the_traceback(tmp_path):
    """Two processes: bad data as a user sees it (exit 2, one line naming the file and row, no run), and
    a bad setting with HYDRA_FULL_ERROR=1 (the traceback, exit 1, still no MLflow run). A bad setting's
    line and exit status come from the same `_user_error` as bad data's: each setting's line is checked in
    this process above."""
    corrupt, _ = BAD_INPUTS["non-numeric value"]
    path = tmp_path / "bad_plant.csv"
    corrupt(good_table(400)).to_csv(path, index=False)
    setting = "model.net.n_heads=3"  # refused by the model itself: the deepest of BAD_SETTINGS
    procs = {}
    for name, overrides, extra_env in (("plain", good_table_overrides(path), {}),
                                       ("full", [setting], {"HYDRA_FULL_ERROR": "1"})):  # fmt: skip
        (tmp_path / name).mkdir()
        procs[name] = train_py(tmp_path / name, overrides, env=clean_env() | extra_env)
    stdout, stderr = procs["plain"].communicate(timeout=300)
    assert procs["plain"].returncode == 2, stderr[-3000:]
    assert "Traceback" not in stdout + stderr
    line = error_line(stderr)
    assert line.startswith("error: ") and "bad_plant.csv" in line and "row 47 (line 49)" in line
    assert stderr.strip().splitlines() == [line], stderr[-3000:]  # nothing else, as predict.py prints
    assert not runs_in(tmp_path / "plain")
    _, stderr = procs["full"].communicate(timeout=300)
    assert procs["full"].returncode == 1 and "Traceback" in stderr and BAD_SETTINGS[setting] in stderr
    assert not (tmp_path / "full" / "mlflow.db").exists()
    assert not (tmp_path / "full" / "out" / "checkpoints").exists()


def test_a_second_run_into_a_used_output_folder_is_refused(two_runs, monkeypatch):
    folder, _ = two_runs
    used = Path(runs_in(folder)[0].data.tags["output_dir"])
    monkeypatch.chdir(folder)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    refusal = refusal_in_process(TINY, used)
    assert refusal.startswith(f"output folder {used}") and f"resume={used}" in refusal
    assert len(runs_in(folder)) == 2
