"""Files written atomically: a run or a request stopped mid-write never leaves a half-written file
behind (the model folder, the forecasts, every table a job writes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd


def write_csv(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write atomically: a crash mid-write never leaves a half-written file at `path`."""
    return write_atomically(path, lambda tmp: frame.to_csv(tmp, index=False))


def write_parquet(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write atomically, as `write_csv`."""
    return write_atomically(path, lambda tmp: frame.to_parquet(tmp, index=False))


def write_json(value, path: str | Path) -> Path:
    """Write `value` as indented JSON, atomically, as `write_csv`."""
    return write_atomically(path, lambda tmp: tmp.write_text(json.dumps(value, indent=2)))


def write_atomically(path: str | Path, write) -> Path:
    """`write(tmp)` writes a file beside `path`, then it replaces `path` in one step: a crash mid-write
    never leaves a half-written file at `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    write(tmp)
    os.replace(tmp, path)
    return path
