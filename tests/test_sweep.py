"""Sweeps: `python train.py -m ...` leaves one MLflow run per trial, nested under a parent run for the sweep.

An Optuna sweep (hparams_search=optuna) with one trial that crashes in training goes on, records the
crash as FAILED and optimises the value train returns; a grid sweep over the families (Hydra's basic
sweeper) works, and its jobs that cannot even be built get FAILED runs of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from mlflow import MlflowClient
from omegaconf import OmegaConf

from conftest import REPO, TINY
from tsformer.sweep import OBJECTIVE, PARENT_RUN_FILE
from tsformer.train import CONFIG_DIR


def run_sweep(cwd, overrides):
    """`python train.py -m <overrides>` in `cwd` (mlflow.db lands there), sweep folder cwd/sweep."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests")])}
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, str(REPO / "train.py"), "-m", *overrides, f"hydra.sweep.dir={cwd / 'sweep'}"]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


def sweep_runs(folder):
    """(parent run, its child runs by trial number) of the one sweep in folder/mlflow.db."""
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "tsformer"]
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if "sweeper" in r.data.tags]
    children = {int(r.data.tags["sweep_trial"]): r for r in runs if r is not parent}
    for child in children.values():  # every run of the folder is a trial of this sweep, nested under it
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["sweep"] == str((folder / "sweep").resolve())
    assert (folder / "sweep" / PARENT_RUN_FILE).read_text().strip() == parent.info.run_id
    return client, parent, children


@pytest.mark.slow
def test_optuna_sweep_goes_on_past_a_crashing_trial(in_tmp):
    crash_trial = 1
    overrides = [o for o in TINY if not o.startswith("model.net.d_model")]
    overrides += [
        "hparams_search=optuna",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.sampler.seed=0",
        "hydra.sweeper.params=null",  # the search space: the two settings below, not the config's
        "model.net.d_model=choice(8,16)",
        "model.lr=interval(1e-4,1e-2)",
        "+callbacks.crash._target_=crash_callback.CrashInTrial",
        f"+callbacks.crash.trial={crash_trial}",
    ]
    proc = run_sweep(in_tmp, overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]

    client, parent, trials = sweep_runs(in_tmp)
    assert sorted(trials) == [0, 1, 2]
    failed = trials.pop(crash_trial)
    assert failed.info.status == "FAILED"
    assert "simulated crash in trial 1" in failed.data.tags["error"]
    assert "simulated crash in trial 1" in (in_tmp / "sweep" / str(crash_trial) / "train.log").read_text()
    assert OBJECTIVE not in failed.data.metrics

    # the finished trials: Optuna's settings in their params; the value train returned (the best
    # val/mse) logged as the objective
    lrs = set()
    for trial in trials.values():
        assert trial.info.status == "FINISHED"
        overrides = dict(o.split("=", 1) for o in trial.data.tags["sweep_overrides"].split())
        assert trial.data.params["model/net/d_model"] == overrides["model.net.d_model"]
        assert float(trial.data.params["model/lr"]) == pytest.approx(float(overrides["model.lr"]))
        lrs.add(overrides["model.lr"])
        val_mse = min(m.value for m in client.get_metric_history(trial.info.run_id, "val/mse"))
        assert trial.data.metrics[OBJECTIVE] == pytest.approx(val_mse)
    assert len(lrs) == 2  # two different trials, not one setting twice

    # the parent: the sweep, its counts, and Optuna's best trial, which is the best finished run
    assert parent.info.status == "FINISHED" and parent.data.tags["sweeper"] == "optuna"
    assert parent.data.metrics["sweep/trials_finished"] == 2
    assert parent.data.metrics["sweep/trials_failed"] == 1
    results = OmegaConf.load(in_tmp / "sweep" / "optimization_results.yaml")
    best = min(trials.values(), key=lambda r: r.data.metrics[OBJECTIVE])
    assert results.best_value == pytest.approx(best.data.metrics[OBJECTIVE])
    assert parent.data.metrics["sweep/best_value"] == pytest.approx(results.best_value)
    assert parent.data.tags["best_run_id"] == best.info.run_id
    assert parent.data.tags["best/model.net.d_model"] == best.data.params["model/net/d_model"]


@pytest.mark.slow
def test_grid_sweep_over_the_families_with_an_impossible_setting(in_tmp):
    """A grid (Hydra's basic sweeper) of the three families x 2 or 3 heads at d_model=16: the 2-head
    jobs train; the 3-head ones fail when the model is built, before train.py opens a run, and the
    sweep's callback opens one for each, FAILED. Hydra runs every job, then exits with the error."""
    tiny = [o for o in TINY if not o.startswith("model.net.n_heads")]
    proc = run_sweep(in_tmp, ["model=enc_only,dec_only,enc_dec", "model.net.n_heads=2,3", *tiny])
    assert proc.returncode == 1, proc.stderr[-3000:]
    _, parent, trials = sweep_runs(in_tmp)
    assert sorted(trials) == list(range(6))
    by_heads = {"2": [], "3": []}
    for trial in trials.values():
        by_heads[trial.data.params["model/net/n_heads"]].append(trial)
    assert sorted(r.data.tags["family"] for r in by_heads["2"]) == ["dec_only", "enc_dec", "enc_only"]
    assert all(r.info.status == "FINISHED" and OBJECTIVE in r.data.metrics for r in by_heads["2"])
    assert len(by_heads["3"]) == 3
    for trial in by_heads["3"]:
        assert trial.info.status == "FAILED"
        assert "d_model=16 must be divisible by n_heads=3" in trial.data.tags["error"]
        assert trial.data.params["model/net/d_model"] == "16"
    assert parent.data.tags["sweeper"] == "grid" and parent.info.status == "FAILED"
    failed = sorted(int(r.data.tags["sweep_trial"]) for r in by_heads["3"])
    assert f"failed trials: {', '.join(map(str, failed))}" in parent.data.tags["error"]
    assert (
        parent.data.metrics["sweep/trials_finished"] == 3 and parent.data.metrics["sweep/trials_failed"] == 3
    )


@pytest.mark.parametrize("model", ["enc_only", "dec_only", "enc_dec", "enc_only_forecast", "patchtst"])
def test_optuna_search_space_names_real_settings_of_every_family(model):
    """A misspelt or impossible search space would crash every trial of a long sweep: each name in
    hparams_search=optuna is a setting of the family, and each d_model on offer suits its heads."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(
            "train", overrides=["hparams_search=optuna", f"model={model}"], return_hydra_config=True
        )
    assert "optuna" in cfg.hydra.sweeper._target_
    assert cfg.hydra.callbacks.mlflow_sweep._target_ == "tsformer.sweep.MLflowSweep"
    parser = OverridesParser.create()
    for key, space in cfg.hydra.sweeper.params.items():
        assert OmegaConf.select(cfg, key, default="missing") != "missing", key
        override = parser.parse_override(f"{key}={space}")
        assert override.is_sweep_override(), (key, space)
        if key == "model.net.d_model":
            for d_model in override.sweep_iterator():
                assert d_model % cfg.model.net.n_heads == 0, (model, d_model, cfg.model.net.n_heads)
