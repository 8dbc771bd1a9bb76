"""The contract every registered job keeps (`tsformer.jobs.JOBS`), over the registry: every task class
of every job is trained and answered the three ways by one of the test_contract_*.py files
(tests/contract.py); a bad optimisation setting or an unknown setting is one `model.<key>` line before
any MLflow run exists. A job registered with a task class no contract file trains fails here."""

from __future__ import annotations

import pytest

from conftest import REPO
from contract import FILES, RUNS, task_classes
from tsformer.jobs import JOBS
from tsformer.settings import SettingError
from tsformer.train import compose_config, run


def test_every_task_class_of_every_job_is_trained_by_one_contract_file():
    trained = [task for tasks in FILES.values() for task in tasks]
    assert sorted(trained) == sorted(task_classes()) == sorted(RUNS), "a task class without its contract run"
    assert len(trained) == len(set(trained))
    for name in FILES:
        assert (REPO / "tests" / f"test_contract_{name}.py").is_file(), name


def job_overrides(name: str, folder) -> list[str]:
    """The overrides of a tiny run of the job `name` (its first task class's)."""
    task = next(f"{c.__module__}.{c.__qualname__}" for c in JOBS[name].tasks)
    return RUNS[task](folder)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("model.lr_schedule=cosine", "model.lr_schedule: 'cosine' is not one of warmup_cosine, epoch_decay"),
        ("model.lr=0", "model.lr: 0 must be a number above 0"),
        ("+model.colour=red", "model.colour: not a setting of "),
    ],
)
@pytest.mark.parametrize("name", list(JOBS))
def test_a_bad_setting_is_one_line_before_any_mlflow_run(name, setting, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    overrides = [
        *job_overrides(name, tmp_path),
        setting,
        f"logger.mlflow.tracking_uri=sqlite:///{tmp_path}/m.db",
    ]
    with pytest.raises(SettingError) as err:
        run(compose_config(overrides, tmp_path / "out"))
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "mlruns").exists()


def test_every_task_class_declares_what_it_produces_and_refuses_a_horizon_that_does_not_fit():
    """What a task produces is declared (`produces`), never read from the horizon; a window task's
    horizon is checked against it when the task is built (a forecaster of 0 rows, a reconstruction of
    the rows after its window)."""
    from tsformer.tasks.base import FORECASTS, RECONSTRUCTIONS, WindowTask

    sizes = {"net": {"d_model": 8, "n_heads": 2, "n_layers": 1}, "d_target": 1, "d_known": 1, "d_observed": 0}
    for job in JOBS.values():
        for task in job.tasks:
            assert isinstance(task.produces, str) and task.produces, task
            if not issubclass(task, WindowTask):
                continue
            assert task.produces in (FORECASTS, RECONSTRUCTIONS), task  # what a window task's windows give
            wrong = 4 if task.produces == RECONSTRUCTIONS else 0
            with pytest.raises(
                ValueError, match=f"{task.__name__} produces {task.produces} .*horizon={wrong}"
            ):
                task(**sizes, context_len=8, horizon=wrong)
