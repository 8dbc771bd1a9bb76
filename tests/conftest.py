"""Shared helpers: tiny settings for end-to-end runs, a batch of random windows, an empty working
folder, and the skip of tests whose real data is absent.

Test tiers (markers registered in pyproject.toml): `slow` trains (train.py's run, a fit, a train.py or
predict.py process, a notebook, DDP, a sweep), `needs_data` reads the real data sets of ../shared/data,
`gpu` needs CUDA. `make test-fast` leaves out all three; `make test` runs everything.

`make test` stays under 8 minutes on 2 cores by what a test pays for: a train.py or predict.py process
imports torch, Lightning and MLflow before it does anything, and drawing a run's figures is slow. So the entry
points run as processes where the process is what is tested (the README's commands, the contract's
printed command and tsformer-serve, signals, DDP, sweeps, runs started together); elsewhere a test calls
train's `run` or predict's `main` in its own process, and TINY runs draw no figures (figures=true where
a test looks at them)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

REPO = Path(__file__).resolve().parents[1]
# the benchmark scripts' own modules (e.g. anomaly_datasets: the labelled sets' loaders) import as
# top-level names, as when a script runs; appended, so that they shadow no installed package
sys.path.append(str(REPO / "benchmarks"))


def import_benchmark(name: str):
    """benchmarks/<name>.py as a module, even where an installed package has that top-level name (e.g.
    `examples`)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one worker per core: each worker, and the train.py processes it starts,
    # computes on one thread (several threads per worker would only fight over the same cores)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures, which would read the files
def pytest_runtest_setup(item):
    """A test marked `needs_data(path, ...)` is skipped where one of its paths is absent: the real data
    sets are never in the repository."""
    for mark in item.iter_markers("needs_data"):
        missing = [p for p in mark.args if not Path(p).exists()]
        if missing:
            pytest.skip(f"real data not here: {missing[0]}")


def pytest_xdist_auto_num_workers(config):
    """`--numprocesses=auto` (make test): a worker more than the cores (the Makefile caps them at 4).
    Many tests wait on a process, a server or a Spark session, and the extra worker fills those waits."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixtures, which this keeps within a file
def pytest_collection_modifyitems(config, items):
    """The files with a test that trains or starts processes (`slow`) first, the quick ones after: xdist
    (`--dist=loadfile`) hands a worker the next file when it frees up, so the quick files fill the end
    and the workers finish together instead of one waiting on the other's last long file."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: each file's order kept


def checkout_files() -> set[str] | None:
    """The checkout's untracked and ignored files, one `git status` line each (the venv and Python's
    bytecode caches aside); None outside a git checkout (an unpacked source archive)."""
    proc = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all", "--", ".", ":(exclude).venv"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    lines = {line for line in proc.stdout.splitlines() if line.startswith(("??", "!!"))}
    return {line for line in lines if "__pycache__/" not in line and ".pytest_cache/" not in line}


@pytest.fixture(scope="session", autouse=True)
def checkout_left_as_found():
    """The suite leaves the checkout as it found it: a test that writes a run, a model or a file into
    the checkout (mlruns/, mlflow.db, outputs/: a user's own runs live there) fails the session."""
    before = checkout_files()
    yield
    after = checkout_files()
    if before is not None and after is not None:
        new = sorted(after - before)
        assert not new, f"the tests left {len(new)} new files in the checkout {REPO}: {new[:10]}"


@pytest.fixture(scope="session", autouse=True)
def mlflow_databases_from_a_template(tmp_path_factory):
    """A new local MLflow database (`sqlite:///...`, a file that does not exist yet) opened in a test's
    process starts as a copy of one that MLflow created and migrated once per worker, its experiments
    removed (MLflow then creates the Default experiment, rooted where it is, as in a new database).

    MLflow migrates a new database's schema through its whole history when a process first opens it:
    about 1.3 s a database, and nearly every run of the suite starts one. The copy is the same schema of
    the same MLflow version. Processes the tests start (train.py, predict.py, runs started together
    on one new database) create theirs as a user's would.
    """
    import sqlite3

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    original_init = SqlAlchemyStore.__init__

    @functools.cache  # made when a test first opens a new database: a worker that opens none pays nothing
    def template() -> Path:
        path = tmp_path_factory.mktemp("mlflow-template") / "template.db"
        original_init(SqlAlchemyStore.__new__(SqlAlchemyStore), f"sqlite:///{path}", str(path.parent))
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("DELETE FROM experiment_tags")
            db.execute("DELETE FROM experiments")
        return path

    def init_from_template(store, db_uri, *args, **kwargs):
        if db_uri.startswith("sqlite:///") and not db_uri.startswith("sqlite:///:memory:"):
            database = Path(db_uri.removeprefix("sqlite:///").split("?", 1)[0])
            if database.parent.is_dir() and (not database.exists() or database.stat().st_size == 0):
                shutil.copyfile(template(), database)
        return original_init(store, db_uri, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SqlAlchemyStore, "__init__", init_from_template)
        yield


def marked(params, which, mark) -> list:
    """`params` for parametrize, those in `which` carrying `mark` (e.g. a data set that needs_data)."""
    return [pytest.param(p, marks=mark) if p in which else p for p in params]


# Tiny settings for end-to-end runs on 2 CPU cores: a few steps, a small model, little data.
TINY = [
    "model.net.d_model=16",
    "model.net.n_heads=2",
    "model.net.n_layers=1",
    "model.warmup_steps=2",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=2",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "data.source.n_series=2",
    "data.source.n_steps=800",
    "n_plot_windows=2",
    "figures=false",  # drawing is slow: the tests that look at figures ask for them (figures=true)
]


# a tiny anomaly-detection run on the simulated plant with faults (4 series of 1400 rows, half normal)
# model=linear has no network and no optimiser: TINY without their sizes
NOT_LINEAR = ("model.net.", "model.warmup_steps")
TINY_LINEAR = [o for o in TINY if not o.startswith(NOT_LINEAR)]

TINY_ANOMALY = [
    "experiment=plant_anomaly",
    *[o for o in TINY if not o.startswith(("data.source", "n_plot"))],
    "trainer.limit_train_batches=20",
    "data.source.n_steps=1400",
    "data.source.test_fraction=0.5",
    "data.train_end=0.5",
    "data.batch_size=16",
    "model.context_len=16",
    "model.false_alarm_rate=0.01",
]


PLANT_TARGETS = ["dynamic_temperature", "dynamic_pressure"]
PLANT_KNOWN = ["ambient_pressure", "ambient_temperature", "supply_voltage"]


def small_plant_datamodule(context_len: int, horizon: int):
    """A set-up data module of a small simulated plant table (2 series of 200 rows, simulator seed 0),
    its targets and known inputs PLANT_TARGETS and PLANT_KNOWN, test batches of 16 windows."""
    from tsformer.data import TimeSeriesDataModule, simulate_plant

    dm = TimeSeriesDataModule(
        simulate_plant(n_series=2, n_steps=200, freq="1min", seed=0),
        target_cols=PLANT_TARGETS,
        known_cols=PLANT_KNOWN,
        series_col="series_id",
        context_len=context_len,
        horizon=horizon,
        eval_batch_size=16,
    )
    dm.setup()
    return dm


def plant_csv_overrides(path) -> list[str]:
    """TINY settings for a simulated plant table saved as a CSV at `path`, read through data=csv."""
    return [
        *[o for o in TINY if not o.startswith("data.source")],
        "data=csv",
        f"data.source={path}",
        f"data.target_cols=[{','.join(PLANT_TARGETS)}]",
        f"data.known_cols=[{','.join(PLANT_KNOWN)}]",
        "data.series_col=series_id",
    ]


def random_windows(
    n_hist: int, n_fut: int, d_target: int, d_known: int, d_observed: int, seed: int = 0
) -> dict:
    """A batch of 4 windows of standard normal values, as `WindowDataset` batches them (windows 0..3);
    the parts drawn in this order from one generator seeded with `seed`."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    return {
        "hist_target": r(4, n_hist, d_target),
        "hist_known": r(4, n_hist, d_known),
        "hist_observed": r(4, n_hist, d_observed),
        "fut_target": r(4, n_fut, d_target),
        "fut_known": r(4, n_fut, d_known),
        "fut_observed": r(4, n_fut, d_observed),
        "window": torch.arange(4),
    }


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run from an empty folder, as a user would (mlflow.db lands there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


class CountAllocations(TorchDispatchMode):
    """The number of tensor elements created on a real device (not PyTorch's meta device)."""

    def __init__(self):
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.elements += sum(
            t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.device.type != "meta"
        )
        return out
