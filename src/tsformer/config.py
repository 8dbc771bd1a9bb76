"""Where the package finds its configs (conf/) and, when it runs from a source checkout, the checkout.

A checkout (`python train.py`, or `pip install -e .`) reads the top-level conf/, so an edit there is
what the next run composes. An installed wheel reads the same files from inside the package
(`tsformer/conf`): setup.py maps conf/ into the wheel, so the repository keeps one copy of each.
"""

from __future__ import annotations

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
