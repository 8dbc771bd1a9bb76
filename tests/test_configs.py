"""Every config in conf/ composes and instantiates: each model with each data set, each experiment."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from hydra.utils import get_class, instantiate

from conftest import marked
from tsformer.jobs import JOBS, job_of_task
from tsformer.train import CONFIG_DIR, build_task, compose_config, instantiate_group

CONF = Path(CONFIG_DIR)
# the data= and experiment= options that read a real data set, not a simulation
REAL_DATA = {
    "ett",
    "exchange",
    "forecast_recipe",
    "gas_turbine",
    "gas_turbine_refit",
    "ili",
    "imputation_ett",
    "wind_scada",
    "wind_scada_forecast_error",
}
ARCHIVE = {
    "japanese_vowels",
    "osuleaf",
    "basic_motions",
    "gun_point",
    "italy_power_demand",
    "acsf1",
}  # needs_data


def target_of(overrides: list[str], group: str) -> type:
    """The class `_target_` of the composed `group` (the model's task class, the data module's)."""
    return get_class(compose_config(overrides, "/tmp/unused")[group]._target_)


@functools.cache  # composing takes a moment: once per option
def data_class_of(group: str, option: str) -> type | None:
    """The data module class an option of `model`, `data` or `experiment` goes with, by the registry:
    a model's task class is run by a job (`job_of_task`), which takes one (`Job.data_class`); a data
    option's own class, as the registered jobs name it; an experiment's model's. None: other groups."""
    if group not in ("model", "data", "experiment"):
        return None
    if group == "data":
        data_module = target_of([f"data={option}"], "data")  # composed once, not once per job
        (data_class,) = {j.data_class for j in JOBS.values() if issubclass(data_module, j.data_class)}
        return data_class
    model = target_of([f"{group}={option}"], "model")
    return job_of_task(model).data_class


def options(group: str, job: str = "forecasting") -> list[str]:
    """The options of `group` that go with the data of a job: forecasting's (reconstruction's and
    fill-in's), classification's (pre-training's) or anomaly detection's; every option of other groups."""
    every = sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.stem.startswith("_"))
    return [o for o in every if data_class_of(group, o) in (JOBS[job].data_class, None)]


# small simulated data: composing must not wait on 20000-step simulations
SMALL = {"n_series": 1, "n_steps": 1500}  # of a simulator's data.source


def compose_small(overrides: list[str], out):
    """Compose; simulated data is made small, real data is used as it is (skipped where absent). The
    simulator's sizes are set on the composed config, as `data.source.n_series=1 ...` overrides would set
    them (a second composition costs a tenth of a second, and these tests compose about a hundred)."""
    cfg = compose_config(overrides, out)
    if "simulators" in str((cfg.data.get("source") or {}).get("_target_", "")):
        cfg.data.source.update(SMALL)
    return cfg


def build(cfg):
    try:
        dm = instantiate(cfg.data)  # a real data set's loader reads its files here (Hydra wraps its errors)
        dm.setup()
    except Exception as err:
        missing = err if isinstance(err, FileNotFoundError) else err.__cause__
        if not isinstance(missing, FileNotFoundError):
            raise
        pytest.skip(str(missing).splitlines()[0])  # a real data set this machine does not have
    task = instantiate(
        cfg.model, _convert_="all", d_target=dm.d_target, d_known=dm.d_known, d_observed=dm.d_observed
    )
    return dm, task


def test_groups_have_the_options_the_docs_name():
    assert {"enc_only", "dec_only", "enc_dec", "enc_only_forecast", "enc_only_masked", "patchtst"} <= set(
        options("model")
    )
    assert {"default", "cpu", "gpu", "ddp"} <= set(options("trainer"))
    assert {"mlflow", "csv", "none"} <= set(options("logger"))
    assert {"state_reconstruction", "wind_power", "sensor_30_70"} <= set(options("experiment"))
    assert {"point", "gaussian", "student_t", "quantile"} <= set(options("head"))


@pytest.mark.slow  # builds the data and the model of every pair
@pytest.mark.parametrize("head", options("head"))
@pytest.mark.parametrize("model", options("model"))
def test_each_head_with_each_model(model, head, in_tmp):
    """`python train.py model=<family> head=<head>` builds, and forecasts quantiles of a test batch."""
    overrides = [f"model={model}", f"head={head}", "++model.head.num_samples=4", "data.eval_batch_size=8"]
    cfg = compose_small(overrides, in_tmp / "out")
    # masked fill-in fills in values, the linear forecaster is a least-squares fit: a point head only
    if model in ("enc_only_masked", "linear") and head != "point":
        with pytest.raises(Exception, match="point head"):
            build(cfg)
        return
    dm, task = build(cfg)
    assert (
        task.hparams.head["kind"] == head
    )  # in the hyperparameters: checkpoints and model folders rebuild it
    batch = next(iter(dm.test_dataloader()))
    with torch.no_grad():
        point, quantiles = task.eval().forecast_with_quantiles(batch, [0.1, 0.5, 0.9])
    assert point.shape == task.true_target(batch).shape
    if head == "point":
        assert quantiles is None
    else:
        assert quantiles.shape == (*point.shape, 3) and (quantiles.diff(dim=-1) >= 0).all()


@pytest.mark.slow  # builds the data and the model of every pair
@pytest.mark.parametrize("model", options("model"))
@pytest.mark.parametrize(
    "data", marked([d for d in options("data") if d != "csv"], REAL_DATA, pytest.mark.needs_data)
)
def test_each_model_with_each_data_set(model, data, in_tmp):
    # one test batch is forecast: 8 windows are enough (the real data sets' own batch is 256)
    short = ["model.context_len=36"] if data == "ili" else []  # ILI's validation split has 97 rows
    cfg = compose_small([f"model={model}", f"data={data}", "data.eval_batch_size=8", *short], in_tmp / "out")
    if model == "enc_only" and data in (
        "ett",
        "exchange",
        "ili",
    ):  # no covariates: nothing to rebuild states from
        with pytest.raises(Exception, match="state reconstruction needs input columns"):
            build(cfg)
        return
    dm, task = build(cfg)
    assert (dm.context_len, dm.horizon) == (cfg.model.context_len, cfg.model.horizon)
    assert dm.n_windows("test") > 0
    batch = next(iter(dm.test_dataloader()))
    with torch.no_grad():
        pred = task.eval().forecast(batch)
    assert pred.shape == task.true_target(batch).shape


@pytest.mark.parametrize("experiment", marked(options("experiment"), REAL_DATA, pytest.mark.needs_data))
def test_each_experiment(experiment, in_tmp):
    cfg = compose_small([f"experiment={experiment}"], in_tmp / "out")
    dm, _ = build(cfg)
    assert dm.n_windows("test") > 0


@pytest.mark.parametrize("model", options("model", "anomaly"))
@pytest.mark.parametrize("experiment", options("experiment", "anomaly"))
def test_each_anomaly_experiment_with_each_detector(experiment, model, in_tmp):
    """Each builds its labelled table's data and the detector sized for it: the label is no channel."""
    small = ["data.source.n_steps=1400", "data.source.test_fraction=0.5", "data.train_end=0.5"]
    small.append("data.label_col=label")  # anomaly_benchmark reads none: its script keeps the labels
    cfg = compose_config([f"experiment={experiment}", f"model={model}", *small], in_tmp / "out")
    dm = instantiate(cfg.data)
    dm.setup()
    task = build_task(cfg.model, dm)
    channels = [*cfg.data.target_cols, *cfg.data.get("known_cols", [])]  # the known inputs last
    assert task.channels == channels and cfg.data.label_col not in task.channels
    assert set(dm.tables["test"][cfg.data.label_col].unique()) == {0, 1}
    assert 0 < task.hparams.false_alarm_rate < 1 and task.window == dm.window


@pytest.mark.parametrize(
    "experiment", marked(options("experiment", "classification"), ARCHIVE, pytest.mark.needs_data)
)
def test_each_classification_experiment(experiment, in_tmp):
    """Each builds its data and the classifier sized for it (an archive set is skipped where absent)."""
    small = ["data.source.n_series=8", "data.source.n_steps=600"] if experiment == "plant_regime" else []
    cfg = compose_config([f"experiment={experiment}", *small], in_tmp / "out")
    try:
        dm = instantiate(cfg.data)
    except Exception as err:
        if not isinstance(err.__cause__, FileNotFoundError):
            raise
        pytest.skip(str(err.__cause__).splitlines()[0])
    dm.setup()
    task = build_task(cfg.model, dm)
    batch = next(iter(dm.test_dataloader()))
    with torch.no_grad():
        assert task.eval().predict_proba(batch).shape == (len(batch["label"]), dm.n_classes)


@pytest.mark.parametrize("trainer", marked(options("trainer"), {"gpu"}, pytest.mark.gpu))
@pytest.mark.parametrize("logger", options("logger"))
def test_trainer_callbacks_and_loggers_instantiate(trainer, logger, in_tmp):
    if trainer == "gpu":
        pytest.importorskip("torch").cuda.is_available() or pytest.skip("no GPU here")
    overrides = [f"trainer={trainer}", f"logger={logger}"]
    if trainer == "ddp" and 0 < torch.cuda.device_count() < 2:
        # 2 processes on a 1-GPU machine: Lightning refuses devices=2 on the GPU it picks (seen on a
        # lent H100); the CPU processes are what this machine can run
        overrides.append("trainer.accelerator=cpu")
    cfg = compose_config(overrides, in_tmp / "out")
    callbacks = instantiate_group(cfg.get("callbacks"))
    loggers = instantiate_group(cfg.get("logger"))
    trainer_obj = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    assert trainer_obj.max_epochs == cfg.trainer.max_epochs
    assert len(loggers) == (0 if logger == "none" else 1)


def test_default_trainer_picks_the_accelerator_itself(in_tmp):
    cfg = compose_config([], in_tmp / "out")
    assert cfg.trainer.accelerator == "auto"


def test_csv_data_requires_the_file_and_targets(in_tmp):
    cfg = compose_config(["data=csv"], in_tmp / "out")
    with pytest.raises(Exception, match="source"):
        instantiate(cfg.data)


@pytest.mark.slow
def test_console_script_composes_from_any_folder(tmp_path):
    """`tsformer-train` (installed by pip) finds conf/ wherever it is run from."""
    import subprocess
    import sys

    script = Path(sys.executable).parent / "tsformer-train"
    assert script.exists(), "the console script is installed with the package"
    proc = subprocess.run(
        [str(script), "--cfg", "job", "model=dec_only"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tsformer.tasks.DecoderOnlyForecaster" in proc.stdout


def test_configs_name_no_path_outside_the_repository():
    """Data outside the repository is found by the loaders' fallback folders, not by config paths."""
    outside = [str(p.relative_to(CONF)) for p in CONF.rglob("*.yaml") if "../" in p.read_text()]
    assert outside == []
