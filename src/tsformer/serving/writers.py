"""Files written atomically: a run or a request stopped mid-write never leaves a half-written file
behind (the model folder, the forecasts, every table a job writes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

# the options of pandas.read_csv that DataFrame.to_csv takes too: a table written back as it was read
WRITE_OPTIONS = ("sep", "decimal", "encoding", "date_format")


def write_csv(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write atomically: a crash mid-write never leaves a half-written file at `path`."""
    return write_atomically(path, lambda tmp: frame.to_csv(tmp, index=False))


def write_answer(answer: pd.DataFrame, path: str | Path, as_read: dict | None = None) -> list[Path]:
    """A `Predictor`'s answer as predict.py writes it: a CSV at `path` (`as_read`: the pandas.read_csv
    options the input was read with, and its `date_format`: the answer is the input table completed),
    then each table of `answer.attrs["beside"]` beside it, `<stem>_<name>.csv`; each file atomically."""
    path = Path(path)
    options = {k: v for k, v in (as_read or {}).items() if k in WRITE_OPTIONS and v is not None}
    written = [write_atomically(path, lambda tmp: answer.to_csv(tmp, index=False, **options))]
    for name, table in answer.attrs.get("beside", {}).items():
        written.append(write_csv(table, path.with_name(f"{path.stem}_{name}.csv")))
    return written


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
