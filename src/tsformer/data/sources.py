"""Reading users' tables from disk (CSV or Parquet) as raw DataFrames; checking is left to the schema.

The CSV reader keeps every cell as pandas reads it (no date parsing, no type coercion), so that
`SeriesSchema.validate` can still point at the exact cell that is wrong. CSV files written in other
conventions (semicolons, decimal commas, Latin-1) are read with pandas' own options (`CSV_OPTIONS`);
a file that only reads with other options gets an error naming the setting to change.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from tsformer.config import checkout_root
from tsformer.data.schema import DataValidationError, setting_name

READERS = {".csv": pd.read_csv, ".parquet": pd.read_parquet, ".pq": pd.read_parquet}
# pandas.read_csv options a user sets for a CSV file (data.csv.<name>, predict.py --<name>)
CSV_OPTIONS = ("sep", "decimal", "encoding")
# what a header read as a single column shows when the file is separated by something else
OTHER_SEPARATORS = (";", "\t", "|", ",")


def load_table(path, **csv_options) -> pd.DataFrame:
    """Read a .csv or .parquet file into a DataFrame (row i of the frame = data row i of the file).

    `csv_options` (any of `CSV_OPTIONS`; None = pandas' default) are passed to pandas.read_csv for a
    CSV file; Parquet files carry their own types and ignore them.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"data file not found: {path} (resolved to {path.resolve()}, working directory {Path.cwd()})"
        )
    reader = reader_of(path)
    unknown = sorted(set(csv_options) - set(CSV_OPTIONS))
    if unknown:
        raise ValueError(f"unknown CSV option(s) {unknown}; supported: {list(CSV_OPTIONS)}")
    options = {k: v for k, v in csv_options.items() if v is not None} if reader is pd.read_csv else {}
    try:
        table = reader(path, **options)
    except UnicodeDecodeError as err:
        raise DataValidationError(
            f"{path}: not {err.encoding} text (byte {err.object[err.start]:#04x} at byte {err.start}); "
            f"set the file's encoding with {setting_name('csv.encoding')}, e.g. 'latin-1' or 'cp1252'"
        ) from err
    except (ValueError, OSError, pd.errors.ParserError) as err:
        raise unreadable(path, err) from err
    if reader is pd.read_csv and len(table.columns) == 1:
        header = str(table.columns[0])
        separator = options.get("sep", ",")
        found = [s for s in OTHER_SEPARATORS if s != separator and s in header]
        if found:
            raise DataValidationError(
                f"{path}: the header reads as one column {header!r}, separated by {found[0]!r} rather than "
                f"{separator!r}; set {setting_name('csv.sep')} to {found[0]!r}"
            )
    return table


def reader_of(path: Path):
    """The pandas reader of a table file by its suffix (`READERS`); another suffix is refused in one line."""
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise DataValidationError(
            f"{path}: unknown file type {path.suffix!r}; supported: {', '.join(sorted(READERS))}"
        )
    return reader


def unreadable(path: Path, err: Exception, kind: str | None = None) -> DataValidationError:
    """The line saying a table file cannot be read as `kind` (default: its suffix), and why."""
    return DataValidationError(f"{path}: cannot be read as {kind or path.suffix} ({err})")


def check_parquet_footer(path: Path) -> None:
    """`path`'s Parquet footer read (its schema and row groups, not its data), or the line `load_table`
    gives for a file it cannot read: a reader that is not pandas (Spark) says it as predict.py does."""
    import pyarrow.parquet as pq

    try:
        pq.read_table(path, columns=[])  # as pandas opens it (the same error), reading no column
    except (ValueError, OSError) as err:  # pyarrow's ArrowInvalid is a ValueError
        named = path.suffix.lower() in (".parquet", ".pq")  # else a file of a folder Spark reads as Parquet
        raise unreadable(path, err, None if named else "Parquet") from err


# In a checkout, relative data paths are also looked up under it, so that train.py finds data/ from any
# folder; an installed package has no such place (None).
REPO_ROOT = checkout_root()

# Copies of the data kept outside the repository, tried after the config's folders: <dir>/<name> for
# each dir of $TSFORMER_DATA_DIR (os.pathsep-separated), then the developers' ../shared/data/<name>
# beside a checkout, so that configs name only paths inside the repository.
DATA_DIR_ENV = "TSFORMER_DATA_DIR"


def shared_data_folders(name: str) -> list[Path]:
    """The folders `<dir>/<name>` a loader tries after its config's (see DATA_DIR_ENV above)."""
    dirs = [Path(p) for p in os.environ.get(DATA_DIR_ENV, "").split(os.pathsep) if p]
    if REPO_ROOT is not None:  # an installed package has no checkout beside it
        dirs.append(REPO_ROOT.parent / "shared" / "data")
    return [d / name for d in dirs]


def find_first(candidates, hint: str, file_name: str | None = None) -> Path:
    """The first existing file among `candidates` (one path or a list of paths); with `file_name`,
    the candidates are folders and the first `<folder>/<file_name>` that exists is returned.

    Each file is looked up on its own, so one file placed in the first folder does not hide the
    others in the next. A relative candidate is tried in the working directory, then, running from a
    checkout, under its root (once where the two are the same folder). None found: FileNotFoundError naming
    the file, every place tried once, and `hint` (where the data comes from, what to do).
    """
    candidates = [candidates] if isinstance(candidates, (str, os.PathLike)) else list(candidates)
    tried = []
    for candidate in candidates:
        path = Path(candidate).expanduser()
        bases = [Path.cwd(), REPO_ROOT] if REPO_ROOT is not None else [Path.cwd()]
        for place in [path] if path.is_absolute() else [base / path for base in bases]:
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
