"""Where the package finds its configs (conf/) and, when it runs from a source checkout, the checkout;
and how to call its commands so that a printed command line runs as shown.

A checkout (`python train.py`, or `pip install -e .`) reads the top-level conf/, so an edit there is
what the next run composes. An installed wheel reads the same files from inside the package
(`tsformer/conf`): setup.py maps conf/ into the wheel, so the repository keeps one copy of each.
"""

from __future__ import annotations

import os
import shlex
import sys
from importlib import resources
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def checkout_root() -> Path | None:
    """The top of the source checkout this code runs from (`<root>/src/tsformer`), else None (installed)."""
    root = _PACKAGE.parents[1]
    if _PACKAGE.parent.name == "src" and (root / "conf" / "train.yaml").is_file():
        return root
    return None


def config_dir() -> Path:
    """The folder of `train.yaml` and the config groups, as an absolute path (what Hydra needs)."""
    root = checkout_root()
    if root is not None:
        return root / "conf"
    # the wheel's package data: a folder on disk, as pip installs wheels unzipped
    return Path(str(resources.files("tsformer") / "conf"))


def command_line(script: str, *args: str) -> str:
    """The command running `script` ("train" or "predict") with `args`, as a user can paste it in any
    folder, whatever PATH and environment are active: the interpreter running now (where tsformer is
    installed) and `<script>.py` of the checkout or, installed, `-m tsformer.<script>`, both by absolute
    path. `args` are written as given (placeholders such as `<run id>` included)."""
    root = checkout_root()
    runs = shlex.quote(str(root / f"{script}.py")) if root else f"-m tsformer.{script}"
    # sys.executable unresolved: a virtual environment's python is a link to the base interpreter
    return " ".join([shlex.quote(os.path.abspath(sys.executable)), runs, *args])
