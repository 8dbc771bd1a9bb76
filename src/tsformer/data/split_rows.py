"""`SplitRows`: a few rows as a `dataframe_split` request holds them (column names, rows of JSON values),
for a reader that takes them straight into arrays: a stream's request of one row cost more to build as a
DataFrame than to score (benchmarks/RESULTS_serve.md). Whatever such a reader does not take as it is (a
cell that is not a plain number or text, a column of mixed kinds) it reads from `frame`, the DataFrame
pandas builds of the same rows, so that its answer and its one-line errors are the table's own.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import pandas as pd

INT64 = (-(2**63), 2**63 - 1)


class SplitRows:
    def __init__(self, columns: list[str], data: list[list]):
        self.columns = columns
        self.data = data
        self._at = {name: i for i, name in enumerate(columns)}

    @classmethod
    def of(cls, columns, data) -> SplitRows | None:
        """The rows of `dataframe_split`'s `columns` and `data` when they have the plain shape (distinct
        text names, at least one row, every row a list of one value per column); None otherwise (the
        caller builds the DataFrame, which reads or refuses them as it does every table)."""
        plain = (
            isinstance(columns, list) and isinstance(data, list) and len(data) > 0
            and all(isinstance(c, str) for c in columns) and len(set(columns)) == len(columns)
            and all(isinstance(row, list) and len(row) == len(columns) for row in data)
        )  # fmt: skip
        return cls(columns, data) if plain else None

    def __len__(self) -> int:
        return len(self.data)

    def __contains__(self, name: str) -> bool:
        return name in self._at

    def values(self, name: str) -> list:
        """The cells of column `name`, as JSON gave them."""
        at = self._at[name]
        return [row[at] for row in self.data]

    def numbers(self, names: list[str]) -> np.ndarray | None:
        """`(T, len(names))` float64 of the named columns when each cell is a finite int or float (not a
        bool); None otherwise (a missing column, an empty or text cell: `frame` says which)."""
        if not all(name in self._at for name in names):
            return None
        at = [self._at[name] for name in names]
        cells = [[row[i] for i in at] for row in self.data]
        if not all(type(v) is float or type(v) is int for row in cells for v in row):
            return None
        out = np.array(cells, dtype=np.float64).reshape(len(cells), len(at))
        return out if np.isfinite(out).all() else None

    def ids(self, name: str) -> np.ndarray | None:
        """Column `name` as the DataFrame's column gives it (`to_numpy`) when every cell is an int
        (int64) or every cell text (object); None for any other column."""
        cells = self.values(name)
        if all(type(v) is int and INT64[0] <= v <= INT64[1] for v in cells):
            return np.array(cells, dtype=np.int64)
        if all(type(v) is str for v in cells):
            return np.array(cells, dtype=object)
        return None

    @cached_property
    def frame(self) -> pd.DataFrame:
        """The DataFrame of these rows, as the server builds every other request's table."""
        return pd.DataFrame(self.data, columns=self.columns)


def frame_of(table: pd.DataFrame | SplitRows) -> pd.DataFrame:
    """`table` as a DataFrame: a reader of DataFrames only takes a `SplitRows` through this."""
    return table.frame if isinstance(table, SplitRows) else table
