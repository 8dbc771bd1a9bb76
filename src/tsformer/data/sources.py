"""Reading users' tables from disk (CSV or Parquet) as raw DataFrames; checking is left to the schema.

The CSV reader keeps every cell as pandas reads it (no date parsing, no type coercion), so that
`SeriesSchema.validate` can still point at the exact cell that is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from tsformer.data.schema import DataValidationError

READERS = {".csv": pd.read_csv, ".parquet": pd.read_parquet, ".pq": pd.read_parquet}


def load_table(path) -> pd.DataFrame:
    """Read a .csv or .parquet file into a DataFrame (row i of the frame = data row i of the file)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"data file not found: {path} (resolved to {path.resolve()}, working directory {Path.cwd()})"
        )
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise DataValidationError(
            f"{path}: unknown file type {path.suffix!r}; supported: {', '.join(sorted(READERS))}"
        )
    try:
        return reader(path)
    except (ValueError, OSError, pd.errors.ParserError) as err:
        raise DataValidationError(f"{path}: cannot be read as {path.suffix} ({err})") from err


# Relative data paths are also looked up here, so that train.py finds the data from any folder.
REPO_ROOT = Path(__file__).resolve().parents[3]


def find_first(candidates, hint: str, file_name: str | None = None) -> Path:
    """The first existing file among `candidates` (one path or a list of paths); with `file_name`,
    the candidates are folders and the first `<folder>/<file_name>` that exists is returned.

    Each file is looked up on its own, so one file placed in the first folder does not hide the
    others in the next. A relative candidate is tried in the working directory, then under the
    repository root (once where the two are the same folder). None found: FileNotFoundError naming
    the file, every place tried once, and `hint` (where the data comes from, what to do).
    """
    candidates = [candidates] if isinstance(candidates, (str, os.PathLike)) else list(candidates)
    tried = []
    for candidate in candidates:
        path = Path(candidate).expanduser()
        for place in [path] if path.is_absolute() else [Path.cwd() / path, REPO_ROOT / path]:
            place = Path(os.path.normpath(place))
            if place in tried:
                continue
            tried.append(place)
            file = place / file_name if file_name else place
            if file.is_file():
                return file.resolve()
    if file_name:
        where = f"{file_name} not found in any of these folders: {', '.join(map(str, tried))}"
    else:
        where = f"no file at any of these paths: {', '.join(map(str, tried))}"
    raise FileNotFoundError(f"{where}; {hint}")
