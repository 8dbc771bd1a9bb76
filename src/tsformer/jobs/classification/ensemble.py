"""An ensemble of classifiers: N networks trained with N seeds, their probabilities averaged, one folder.

The convolutional classifiers of the archive (InceptionTime, Ismail Fawaz et al. 2020) average about
five networks that differ only in their random initialisation. One command trains them:

    python -m tsformer.jobs.classification.ensemble members=5 experiment=osuleaf seed=0        # seeds 0..4, outputs/ensemble-...
    python -m tsformer.jobs.classification.ensemble members=3 output=ens experiment=gun_point   # into ./ens
    python predict.py ens/model sequences.csv --output classes.csv         # like one network

Each member is an ordinary `train.run` of the same overrides with its own seed (its own output folder
`member_<i>`, its own MLflow run when a logger is configured). The ensemble folder `<output>/model` (a
kind of its own, format `ensemble-1`: `FOLDER`) holds the members' model folders (`member_<i>/`) and a
`tsformer.json` naming them beside their shared data contract; it loads (`load_ensemble`, hence
`predict.py` and the pyfunc model) as a `Classifier` giving the mean of the members' probabilities. The members must read the data the same way: the same contract
(columns, classes, channel scaler); members trained on different training series (a validation share
drawn by each seed) are refused when the folder is written. The command prints the members' and the
ensemble's test accuracy (on the members' test samples, every one).
"""

from __future__ import annotations

import json
import shutil
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tsformer import model_folder
from tsformer.jobs.classification.classifier import FOLDER as CLASSIFIER
from tsformer.jobs.classification.classifier import Classifier, SequenceContract
from tsformer.model_folder import CONFIG_FILE, FolderKind, ModelFolderError, Upgrade
from tsformer.settings import SettingError
from tsformer.tasks.classification import ClassificationTask

MEMBER = "member_{}"


class MeanOfMembers(nn.Module):
    """The members' classification tasks as one: `predict_proba` is the mean of theirs."""

    def __init__(self, tasks: list[nn.Module]):
        super().__init__()
        self.members = nn.ModuleList(tasks)

    def predict_proba(self, batch: dict) -> torch.Tensor:
        return torch.stack([task.predict_proba(batch) for task in self.members]).mean(dim=0)  # (B, C)


def write_ensemble_folder(folder: str | Path, member_folders: list[Path]) -> Path:
    """Copy the members' model folders into `folder` and name them in its `tsformer.json`; the members
    must share one data contract (checked here, not when a user predicts)."""
    folder = Path(folder)
    configs = [json.loads((Path(m) / CONFIG_FILE).read_text()) for m in member_folders]
    shared = [_shared_contract(c) for c in configs]  # each member keeps its own temperature
    first = configs[0]
    for path, config, data in zip(member_folders, configs, shared, strict=True):
        if config.get("format") != first.get("format") or data != shared[0]:
            raise ModelFolderError(
                f"{path}: its data contract differs from {member_folders[0]}'s (columns, classes or channel "
                "scaler): the members must read the data the same way; train them on the same training "
                "series (data.val_fraction=0, or the same validation series)"
            )
    folder.mkdir(parents=True, exist_ok=False)
    names = []
    for i, member in enumerate(member_folders):
        names.append(MEMBER.format(i))
        shutil.copytree(member, folder / names[-1])
    # task_class: the job its folder is (`jobs.job_of_folder`), as its members'
    keys = {"task_class": first["task_class"], "members": names, "data": shared[0], "info": first["info"]}
    return model_folder.write_config(folder, FOLDER, keys).parent


def _shared_contract(config: dict) -> dict:
    """A member's `data` without its own calibration: what the members must share."""
    return {k: v for k, v in config.get("data", {}).items() if k != "calibration"}


def load_ensemble(folder: str | Path) -> Classifier:
    """The members' classifiers (subfolders of `folder`, each checked as any classifier's folder) as one
    whose probabilities are their mean; the members read the data alike (checked when it was written)."""
    members, _ = model_folder.member_folders(folder, FOLDER)
    loaded = [Classifier.load(m) for m in members]
    return Classifier(MeanOfMembers([c.task for c in loaded]), loaded[0].contract, loaded[0].info)


FOLDER = FolderKind(
    name="ensemble",
    version=1,
    describes="classifier ensemble",
    contract=SequenceContract,
    tasks=(ClassificationTask,),
    load=load_ensemble,
    upgrades={0: Upgrade()},  # 0: the header "classifier-1" naming members; the same keys
    member_kind=CLASSIFIER,
)


def _option(args: list[str], key: str, default: str | None) -> tuple[str | None, list[str]]:
    """The value of `key=...` among `args` (removed from them), or `default`."""
    found = [a for a in args if a.startswith(f"{key}=")]
    rest = [a for a in args if not a.startswith(f"{key}=")]
    return (found[-1].split("=", 1)[1] if found else default), rest


def train_ensemble(overrides: list[str], members: int, output: Path) -> dict:
    """Train `members` networks of `overrides` (seeds seed, seed + 1, ...) and write `output`/model."""
    from tsformer.train import compose_config, run

    if members < 1:
        raise SettingError(f"members={members}: an ensemble needs at least 1 network, e.g. members=5")
    seed, overrides = _option(overrides, "seed", None)
    cfg = compose_config(overrides, output / MEMBER.format(0))
    if str(cfg.data.get("_target_")).endswith("SequenceDataModule") and cfg.data.get("val_fraction"):
        raise SettingError(  # before training: each seed would hold out other series, and scale by them
            f"members={members} with data.val_fraction={cfg.data.val_fraction}: each seed holds out other "
            "validation series, so the members would read the data differently; train them on every series: "
            "data.val_fraction=0 callbacks=last_weights (the archive experiments' default)"
        )
    first = cfg.seed if seed is None else int(seed)
    results = []
    for i in range(members):
        cfg = compose_config([*overrides, f"seed={first + i}"], output / MEMBER.format(i))
        results.append(run(cfg))
    folder = write_ensemble_folder(output / "model", [r.model_folder for r in results])
    frames = [r.forecasts for r in results]  # the classes of every test sample, in one order
    columns = [c for c in frames[0].columns if c.startswith("p_")]
    proba = np.mean([f[columns].to_numpy() for f in frames], axis=0)  # (S, C)
    truth = frames[0].y_true.astype(str).to_numpy()
    classes = np.array([c[2:] for c in columns])
    accuracy = {
        "members": [float((f.y_pred.astype(str) == f.y_true.astype(str)).mean()) for f in frames],
        "ensemble": float((classes[proba.argmax(axis=1)] == truth).mean()),
    }
    return {"folder": folder, "test_accuracy": accuracy}


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    members, args = _option(args, "members", "5")
    output, args = _option(args, "output", None)
    output = Path(output or f"outputs/ensemble-{datetime.now():%Y-%m-%d_%H-%M-%S}")
    try:
        done = train_ensemble(args, int(members), output)
    except (SettingError, ModelFolderError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    acc = done["test_accuracy"]
    print(f"test accuracy of the members: {', '.join(f'{a:.4f}' for a in acc['members'])}")
    print(f"test accuracy of the ensemble (mean of their probabilities): {acc['ensemble']:.4f}")
    print(f"ensemble model folder: {done['folder'].resolve()}")


if __name__ == "__main__":
    main()
