"""The UEA/UCR archive's `.ts` files, read without aeon or sktime (as their users hold the archive).

A file is comment lines (`#`), a header of `@key value` lines, then `@data` and one line per series:
its dimensions separated by `:`, each dimension's values by `,`, and, when `@classLabel true`, the
label as the last `:` field. `?` (or `NaN`) is a missing value. With `@timeStamps true` each value is
`(time,value)` and the first dimension's times become the series' steps.

- Unequal lengths (`@equalLength false`): each series keeps its own length. Missing values at the end
  of every dimension of a series (the padding some archive files carry) are cut off: the series is
  shorter; a missing value elsewhere is an error naming the file and line (the long-table route
  refuses empty cells the same way), so nothing is filled in silently.
- `@classLabel true a b c`: the header's classes; a series labelled otherwise is an error naming the
  file and line.
- Every other malformed line (a wrong number of dimensions, a value that is not a number, a length
  other than `@seriesLength` in an equal-length file, dimensions of different lengths) is one error
  line naming the file and line number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tsformer.data.schema import DataValidationError

_TIMED_VALUE = re.compile(r"\(([^,()]*),([^()]*)\)")


@dataclass
class TsFile:
    """A `.ts` file's series: `x` (T_i, D) float64 arrays, one label each (None without labels)."""

    path: str
    header: dict[str, str]
    x: list[np.ndarray]
    labels: np.ndarray | None  # (S,) object: the label text of each series
    steps: list[np.ndarray]  # (T_i,) each series' time stamps, or 0..T_i-1
    class_labels: list[str] | None  # the header's `@classLabel true ...` list
    lines: np.ndarray  # (S,) the line number (1-based) of each series, for messages

    @property
    def n_dims(self) -> int:
        return self.x[0].shape[1]

    def long_table(self) -> pd.DataFrame:
        """The series as the long table `data=sequences` reads: series_id (0, 1, ... in file order),
        step, ch0, ch1, ..., label (when the file has labels); one row per series and step."""
        frame = pd.DataFrame(
            {
                "series_id": np.repeat(np.arange(len(self.x)), [len(x) for x in self.x]),
                "step": np.concatenate(self.steps),
                **{f"ch{d}": np.concatenate([x[:, d] for x in self.x]) for d in range(self.n_dims)},
            }
        )
        if self.labels is not None:
            frame["label"] = np.repeat(self.labels, [len(x) for x in self.x])
        return frame


def read_ts(path) -> TsFile:
    """Parse the `.ts` file at `path` (module docstring); a malformed line raises a
    `DataValidationError` naming the file and line."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path} (resolved to {path.resolve()})")
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read().splitlines()
    header, data_at = _header(text, path)
    labelled, class_labels = _class_labels(header, path)
    timed = _flag(header, "timestamps", False, path)
    equal = _flag(header, "equallength", False, path)
    length = int(header["serieslength"]) if equal and header.get("serieslength", "").isdigit() else None
    dims = int(header["dimensions"]) if header.get("dimensions", "").isdigit() else None
    dims = 1 if _flag(header, "univariate", False, path) else dims
    xs, labels, steps, lines = [], [], [], []
    for number in range(data_at + 1, len(text) + 1):
        line = text[number - 1].strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}, line {number}"
        fields = line.split(":")
        if labelled:
            labels.append(_label(fields, class_labels, where))
        dims = len(fields) if dims is None else dims
        if len(fields) != dims:
            raise DataValidationError(
                f"{where}: {len(fields)} dimension(s) separated by ':', the file has {dims}"
                + (" and a class label last" if labelled else "")
            )
        values, times = zip(*(_dimension(f, timed, where, d) for d, f in enumerate(fields)), strict=True)
        x, t = _one_series(list(values), times[0], where)
        if length is not None and len(x) != length:
            raise DataValidationError(f"{where}: {len(x)} values a dimension, @seriesLength is {length}")
        xs.append(x)
        steps.append(t)
        lines.append(number)
    if not xs:
        raise DataValidationError(f"{path}: no series after @data")
    return TsFile(
        path=str(path),
        header=header,
        x=xs,
        labels=np.array(labels, dtype=object) if labelled else None,
        steps=steps,
        class_labels=class_labels,
        lines=np.array(lines),
    )


def archive_ts_file(archive, name: str, split: str) -> str:
    """`<archive>/<name>/<name>_<split>.ts`, the archive's own layout (data.archive=, data.name=)."""
    path = Path(archive).expanduser() / name / f"{name}_{split}.ts"
    if not path.is_file():
        raise FileNotFoundError(
            f"data.archive={archive} data.name={name}: no {path}; the archive's layout is "
            f"<archive>/<name>/<name>_TRAIN.ts and <name>_TEST.ts"
        )
    return str(path)


# -- helpers --------------------------------------------------------------------------------------


def _header(text: list[str], path) -> tuple[dict[str, str], int]:
    """The `@key value` lines (keys lower-cased) and the line number of `@data`."""
    header: dict[str, str] = {}
    for number, raw in enumerate(text, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not line.startswith("@"):
            raise DataValidationError(
                f"{path}, line {number}: a value line before @data; a .ts file's header (@problemName, "
                "..., @classLabel) ends with a line @data"
            )
        key, _, value = line[1:].partition(" ")
        if key.lower() == "data":
            return header, number
        header[key.lower()] = value.strip()
    raise DataValidationError(f"{path}: no @data line; not a .ts file of the UEA/UCR archive")


def _label(fields: list[str], class_labels: list[str] | None, where: str) -> str:
    """The class label, popped from the end of a data line's `:` fields, checked against the header's."""
    if len(fields) < 2:
        raise DataValidationError(f"{where}: no class label (the last ':' field); @classLabel is true")
    label = fields.pop().strip()
    if class_labels and label not in class_labels:
        raise DataValidationError(
            f"{where}: class label {label!r} is not in the header's @classLabel list {class_labels}"
        )
    return label


def _flag(header: dict, key: str, default: bool, path) -> bool:
    value = header.get(key)
    if value is None:
        return default
    first = value.split()[0].lower() if value.split() else ""
    if first not in ("true", "false"):
        raise DataValidationError(f"{path}: @{key} {value!r}: expected true or false")
    return first == "true"


def _class_labels(header: dict, path) -> tuple[bool, list[str] | None]:
    value = header.get("classlabel")
    if value is None:
        return False, None
    labelled = _flag(header, "classlabel", False, path)
    names = value.split()[1:]
    return labelled, (names or None) if labelled else None


def _dimension(field: str, timed: bool, where: str, d: int) -> tuple[np.ndarray, np.ndarray | None]:
    """One dimension's values (T,) float64 (NaN for `?`) and, when timed, its times (T,)."""
    field = field.strip()
    if timed:
        pairs = _TIMED_VALUE.findall(field)
        if not pairs:
            raise DataValidationError(f"{where}, dimension {d}: no (time,value) pairs (@timeStamps is true)")
        times, values = zip(*pairs, strict=True)
        times = np.array([_number(t, where, d) for t in times], dtype=np.float64)
        return np.array([_number(v, where, d) for v in values], dtype=np.float64), times
    if not field:
        raise DataValidationError(f"{where}, dimension {d}: no values")
    parts = field.split(",")
    try:
        return np.array(["nan" if p.strip() == "?" else p for p in parts], dtype=np.float64), None
    except ValueError:
        bad = next(p for p in parts if _not_number(p))
        raise DataValidationError(
            f"{where}, dimension {d}: {bad.strip()!r} is not a number (missing values are '?')"
        ) from None


def _number(text: str, where: str, d: int) -> float:
    text = text.strip()
    if text == "?":
        return float("nan")
    try:
        return float(text)
    except ValueError:
        raise DataValidationError(f"{where}, dimension {d}: {text!r} is not a number") from None


def _not_number(text: str) -> bool:
    try:
        float(text)
        return False
    except ValueError:
        return text.strip() != "?"


def _one_series(values: list[np.ndarray], times, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The dimensions as one (T, D) array, the trailing all-missing steps cut off, and its steps (T,)."""
    lengths = {len(v) for v in values}
    if len(lengths) > 1:
        raise DataValidationError(
            f"{where}: dimensions of different lengths {[len(v) for v in values]}; a series' dimensions "
            "share its steps"
        )
    x = np.stack(values, axis=1)  # (T, D)
    present = ~np.isnan(x).all(axis=1)
    if not present.any():
        raise DataValidationError(f"{where}: every value is missing")
    end = int(np.flatnonzero(present)[-1]) + 1
    x = x[:end]
    if np.isnan(x).any():
        step, dim = (int(i) for i in np.argwhere(np.isnan(x))[0])
        raise DataValidationError(
            f"{where}, dimension {dim}, step {step}: missing value inside the series (only the padding at "
            "its end can be missing); fill it in or cut the series there"
        )
    steps = np.arange(end) if times is None else times[:end]
    return x, steps
