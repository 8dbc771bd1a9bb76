"""The run's settings: refused before anything is built, and the part of its folder's name no other run has.

`check(cfg)` runs first thing in `train.run`: a setting that cannot work (a batch of 0 windows, a
negative learning rate, a fit of 0 epochs whose model would be exported as if trained) stops the
run with a `SettingError` naming the setting, before data is read or an MLflow run exists.
`train.main` prints a `SettingError` (like a `DataValidationError`) as one line and exits 2.

`run_tag` is the config's `${run_tag:}` (conf/hydra/default.yaml): the run folder is
`outputs/<date>/<time>-<tag>`, so runs started in the same second in one folder each get their own
checkpoints, model folder and log.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from numbers import Real

from omegaconf import DictConfig, OmegaConf


class SettingError(ValueError):
    """A setting the run cannot work with; the message names it and says what to give instead."""


# -- the run folder's tag ------------------------------------------------------------------------------


def _launch_id() -> str | None:
    """What every process of one multi-process launch shares when a launcher started each of them
    with the same command line (torchrun, srun); None for a process started on its own. Lightning's
    own DDP launcher needs none: it passes the first process's folder on (`hydra.run.dir=`)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("TORCHELASTIC_RUN_ID"):
        return "torchrun-" + os.environ["TORCHELASTIC_RUN_ID"]
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in os.environ:
        return f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '')}"
    return None


def _new_tag() -> str:
    launch = _launch_id()
    if launch is not None:
        return hashlib.sha1(launch.encode()).hexdigest()[:6]
    return secrets.token_hex(3)


RUN_TAG = _new_tag()  # one per process: every resolution of the run folder in it gives the same


def run_tag() -> str:
    return RUN_TAG


OmegaConf.register_new_resolver("run_tag", run_tag, replace=True)


# -- the checks ----------------------------------------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _at_least_one(key: str, what: str):
    def rule(value) -> str | None:
        if not (_is_int(value) and value >= 1):
            return f"must be a whole number of at least 1 ({what}), e.g. {key}=1"
        return None

    return rule


def _fraction(value) -> str | None:
    if not (_is_number(value) and 0 <= value < 1):
        return "must be a number from 0 up to (not including) 1, the share of the timestamps it takes"
    return None


def _seed(value) -> str | None:
    return None if _is_int(value) else "must be a whole number, e.g. seed=42"


def _trains_at_all(key: str, none_means: str):
    """Lightning would fit nothing with 0 and the untrained model would be tested and exported."""

    def rule(value) -> str | None:
        if value is not None and not _is_number(value):
            return f"must be a number ({none_means})"
        if value is not None and value == 0:
            return (
                "trains nothing, and the untrained model would be tested and exported as if trained; "
                f"give at least 1 ({none_means})"
            )
        return None

    return rule


def _all_test_windows(value) -> str | None:
    if value != 1.0:
        return (
            "every test window is evaluated and exported, so it must stay 1.0 "
            "(use smaller data or data.eval_stride to test faster)"
        )
    return None


def _label_share(value) -> str | None:
    if not _is_number(value) or not 0 < value <= 1:
        return "the share of the training samples that keep their label must be in (0, 1], e.g. 0.1"
    return None


# setting -> rule: a message saying what is wrong with its value, None when it is fine. Absent
# settings (a config without that group) are not checked.
RULES = {
    "seed": _seed,
    "data.batch_size": _at_least_one("data.batch_size", "windows per training batch"),
    "data.eval_batch_size": _at_least_one("data.eval_batch_size", "windows per validation or test batch"),
    "data.train_stride": _at_least_one("data.train_stride", "steps between training windows"),
    "data.eval_stride": _at_least_one("data.eval_stride", "steps between validation and test windows"),
    "data.val_fraction": _fraction,
    "data.test_fraction": _fraction,
    "data.label_fraction": _label_share,
    "trainer.max_epochs": _trains_at_all("trainer.max_epochs", "-1 or null: no limit"),
    "trainer.max_steps": _trains_at_all("trainer.max_steps", "-1: no limit"),
    "trainer.limit_train_batches": _trains_at_all("trainer.limit_train_batches", "1.0: every batch"),
    "trainer.limit_test_batches": _all_test_windows,
}

_ABSENT = object()
SEQUENCES = "tsformer.data.sequences."  # the classification data modules


def _check_model(model: DictConfig) -> None:
    """The `model` config against its task class: every setting one it takes, the optimisation's
    values ones that work (`tasks.optimisation`)."""
    from hydra.utils import get_class

    from tsformer.tasks.setting_groups import check_task_settings

    try:
        task_class = get_class(str(model.get("_target_")))
    except (ImportError, ValueError):
        return  # the job's look-up names it (`train.job_of`)
    problem = check_task_settings(task_class, OmegaConf.to_container(model, resolve=True))
    if problem is not None:
        raise SettingError(problem)


def check(cfg: DictConfig) -> None:
    """Raise a `SettingError` for the first setting of `cfg` that cannot work (see `RULES`)."""
    for key, rule in RULES.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT:
            continue
        problem = rule(value)
        if problem is not None:
            raise SettingError(f"{key}={value}: {problem}")
    if cfg.get("init_from_freeze") and not cfg.get("init_from"):
        raise SettingError("init_from_freeze=true: nothing to freeze without init_from=<run id | folder>")
    data = cfg.get("data")
    if data is not None and data.get("val_start") is None:  # both fractions are cut off the end then
        val, test = data.get("val_fraction"), data.get("test_fraction")
        if _is_number(val) and _is_number(test) and val + test >= 1:
            raise SettingError(
                f"data.val_fraction={val} and data.test_fraction={test} leave no training data: "
                "their sum must stay below 1, e.g. data.val_fraction=0.15 data.test_fraction=0.15"
            )
    _refuse_validation_callbacks_without_validation(cfg)
    if data is not None and data.get("pretraining") and not str(data.get("_target_")).startswith(SEQUENCES):
        raise SettingError(
            f"pretrain=masked pre-trains a classifier's encoder on labelled sequences or streams (e.g. "
            f"experiment=osuleaf pretrain=masked); data={data.get('name')} is a table of windows: masked "
            "fill-in on windows is model=enc_only_masked"
        )
    if cfg.get("model") is not None:
        _check_model(cfg.model)
        _refuse_window_mismatch(cfg.model, data)


def _refuse_window_mismatch(model: DictConfig, data: DictConfig | None) -> None:
    """The windows of a table follow the model's sizes (`data.context_len: ${model.context_len}`): a
    window of another length would train a network its model folder does not describe."""
    for key in ("context_len", "horizon"):
        if data is None or model.get(key) is None or data.get(key) is None:
            continue
        if data[key] != model[key]:
            raise SettingError(
                f"data.{key}={data[key]} differs from model.{key}={model[key]}: set model.{key} "
                f"(data.{key} follows it)"
            )


def _refuse_validation_callbacks_without_validation(cfg: DictConfig) -> None:
    """`data.val_fraction=0` on labelled sequences trains on every series and validates none: what
    follows `val/loss` (early stopping, the "best" checkpoint) would have nothing to follow."""
    data = cfg.get("data")
    if data is None or data.get("val_fraction") != 0 or not str(data.get("_target_")).startswith(SEQUENCES):
        return
    if data.get("pretraining"):
        raise SettingError(
            "data.val_fraction=0 with pretrain=masked: pre-training is checkpointed on the validation "
            "series' masked MSE; give data.val_fraction > 0"
        )
    callbacks = cfg.get("callbacks") or {}
    fix = "use callbacks=last_weights (a fixed budget of trainer.max_steps or max_epochs, the last weights kept)"
    # an experiment's `callbacks.early_stopping.patience` leaves a node without `_target_`: nothing built
    if (callbacks.get("early_stopping") or {}).get("_target_"):
        raise SettingError(
            f"data.val_fraction=0 validates no series, so early stopping has nothing to follow: {fix}"
        )
    checkpoint = callbacks.get("model_checkpoint")
    if checkpoint is not None and checkpoint.get("monitor") is not None:
        raise SettingError(
            f"data.val_fraction=0 validates no series, so there is no best checkpoint by "
            f"{checkpoint.get('monitor')}: {fix}"
        )
