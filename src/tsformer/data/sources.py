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


def find_first(candidates, want_dir: bool, hint: str) -> Path:
    """The first existing path among `candidates` (one path or a list of paths).

    A relative candidate is tried in the working directory, then under the repository root. None
    found: FileNotFoundError with every place tried and `hint` (where the data comes from).
    """
    candidates = [candidates] if isinstance(candidates, (str, os.PathLike)) else list(candidates)
    tried = []
    for candidate in candidates:
        path = Path(candidate).expanduser()
        for place in [path] if path.is_absolute() else [Path.cwd() / path, REPO_ROOT / path]:
            if place.is_dir() if want_dir else place.is_file():
                return place.resolve()
            tried.append(str(place))
    raise FileNotFoundError(f"{hint}; tried: {', '.join(tried)}")
