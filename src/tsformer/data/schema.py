"""Column roles of a tabular time series, and the checks that turn a raw table into a clean one.

Every later stage (split, scalers, windows) assumes a table that is sorted, regular in time and fully
numeric. Rather than let a bad cell surface as a NaN loss three epochs later, `SeriesSchema.validate`
refuses it up front with a message that says where to look: the source (file path or generator
name), the column, the row as counted in the file (for CSV also the line number, row + 2, since line 1
is the header), the series and the timestamp.

Roles of the columns:
- target_cols:   what the model predicts (or reconstructs).
- known_cols:    covariates known in advance for the future too (weather forecast, set-points).
- observed_cols: covariates only measured, so known for the past only.
- series_col:    identifies several series stacked in long format (optional).
- static_cols:   numeric properties of a series that do not change over time (rated power, size).
- static_categorical_cols: categories of a series (turbine model, site); may include series_col
                 itself, which gives every series a learned embedding.
Static columns must hold one value per series; the models see them as embeddings at every step.
Columns of the table with none of these roles are ignored (logged). A name with spaces around it in
the file ('AFDP ') matches the role's name without them (logged).

Times given as text are read with `time_format` (a strftime format) when set. Without it a date
with the year last must read one way only: where day-first and month-first both fit every row
(01/02/2024 .. 12/12/2024) `validate` stops and asks for the format; where one fits, it is used.

Gaps are not errors: consecutive timestamps further apart than the frequency split a series into
contiguous segments (`find_segments`), and windows are cut inside segments only.
"""

from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from pandas.tseries.api import guess_datetime_format
from pandas.tseries.frequencies import to_offset

log = logging.getLogger(__name__)

SINGLE_SERIES_ID = 0  # series id used when the table holds one series (no series_col)


class DataValidationError(ValueError):
    """Input data that cannot be used as is; the message names source, column, row, series and time."""


def _is_csv(source: str) -> bool:
    return str(source).lower().endswith(".csv")


def describe_row(source: str, row: int) -> str:
    """'row 17 (line 19)' for CSV files, where the header is line 1; 'row 17' otherwise."""
    return f"row {row} (line {row + 2})" if _is_csv(source) else f"row {row}"


def plain(value):
    """`value` as Python prints it: numpy scalars become Python ones (inf, 2 instead of np.float64(inf),
    np.int64(2)), so that messages show the value as it is in the file."""
    return value.item() if isinstance(value, np.generic) else value


def setting_name(key: str) -> str:
    """How a user sets a data-reading option `key` ('time_format', 'csv.sep'): training's config
    key and predict.py's flag, for messages that tell which setting to change."""
    return f"data.{key} (predict.py --{key.rpartition('.')[2].replace('_', '-')})"


def _where(source, column=None, row=None, series=None, time=None) -> str:
    parts = []
    if column is not None:
        parts.append(f"column '{column}'")
    if row is not None:
        parts.append(describe_row(source, int(row)))
    if series is not None:
        parts.append(f"series {plain(series)!r}")
    if time is not None:
        parts.append(f"time {pd.Timestamp(time)}")
    return ", ".join(parts)


@dataclass(kw_only=True)
class SeriesSchema:
    """Which column plays which role, and the sampling frequency (inferred from the data when None)."""

    time_col: str = "time"
    target_cols: list[str]
    known_cols: list[str] = field(default_factory=list)
    observed_cols: list[str] = field(default_factory=list)
    series_col: str | None = None
    freq: str | None = None
    static_cols: list[str] = field(default_factory=list)
    static_categorical_cols: list[str] = field(default_factory=list)
    time_format: str | None = None  # strftime format of text times, e.g. "%d/%m/%Y %H:%M"; None: inferred

    def __post_init__(self):
        # Hydra hands over ListConfig objects and may hand over a single string: normalise to lists.
        def as_list(cols):
            return [cols] if isinstance(cols, str) else [str(c) for c in (cols or [])]

        self.target_cols = as_list(self.target_cols)
        self.known_cols = as_list(self.known_cols)
        self.observed_cols = as_list(self.observed_cols)
        self.static_cols = as_list(self.static_cols)
        self.static_categorical_cols = as_list(self.static_categorical_cols)
        if not self.target_cols:
            raise DataValidationError("SeriesSchema needs at least one target column")
        # the series id may also be a static category (one embedding per series): not a second role
        categories = [c for c in self.static_categorical_cols if c != self.series_col]
        used = [self.time_col, *self.value_cols, *self.static_cols, *categories]
        used += [self.series_col] if self.series_col else []
        repeated = sorted({c for c in used if used.count(c) > 1})
        if repeated:
            raise DataValidationError(f"columns given more than one role: {repeated}")

    @property
    def value_cols(self) -> list[str]:
        """Numeric columns in a fixed order: targets, then known, then observed covariates."""
        return [*self.target_cols, *self.known_cols, *self.observed_cols]

    @property
    def columns(self) -> list[str]:
        """Every column the schema reads, in order: time, series id, values, static columns."""
        series = [self.series_col] if self.series_col else []
        categories = [c for c in self.static_categorical_cols if c != self.series_col]
        return [self.time_col, *series, *self.value_cols, *self.static_cols, *categories]

    def validate(self, df: pd.DataFrame, source: str, may_be_empty=(), extra_cols=()) -> pd.DataFrame:
        """Check `df` and return a clean copy sorted by (series, time).

        The returned frame keeps the original row number (position in the file) as its index, so that
        later errors can still point at the file. Times become datetime64[ns] (timezone-aware times,
        also with several UTC offsets as across a daylight-saving change, are converted to naive UTC),
        value columns float64. Columns named in `may_be_empty` may hold empty cells (NaN in the
        result; prediction files leave the future targets empty), never text. `extra_cols` have no
        role in the model but the caller uses them: they are matched like the others and carried over
        unchecked; other columns without a role are left out.
        """
        source = str(source)
        df = df.reset_index(drop=True)  # index = data row number as in the file
        df = self._match_columns(df, source, [str(c) for c in extra_cols])
        if len(df) == 0:
            raise DataValidationError(f"{source}: the table has no data rows")

        series = self._series_ids(df, source)
        times = self._parse_times(df, source, series)
        clean = pd.DataFrame(index=df.index)
        if self.series_col:
            clean[self.series_col] = series
        clean[self.time_col] = times
        for col in self.value_cols:
            clean[col] = self._parse_numeric(df[col], col, source, series, times, col in may_be_empty)
        for col in self.static_cols:
            clean[col] = self._parse_numeric(df[col], col, source, series, times)
        for col in self.static_categorical_cols:
            if col != self.series_col:
                clean[col] = self._parse_category(df[col], col, source, series, times)

        self._check_time_order(clean, source, df)
        self._check_static(clean, source)
        for col in extra_cols:
            clean[col] = df[col]
        sort_keys = [self.series_col, self.time_col] if self.series_col else [self.time_col]
        return clean.sort_values(sort_keys, kind="stable")

    # -- the individual checks -------------------------------------------------------------------

    def _match_columns(self, df, source, extra_cols: list[str], report_unused: bool = True) -> pd.DataFrame:
        """`df` with its columns named as the schema names them; an error for a missing column.

        A name equal to a wanted one up to spaces around it is renamed (spreadsheet exports keep
        them: 'AFDP '); columns that no role wants are reported (once: `validate` reports, a second
        look at the same table does not) and left for `validate` to drop.
        """
        wanted = [*self.columns, *extra_cols]
        present = [str(c) for c in df.columns]
        renames = {}
        for name in wanted:
            if name in present:
                continue
            near = [c for c in present if c.strip() == name.strip()]
            if len(near) > 1:
                raise DataValidationError(
                    f"{source}: columns {near} all match '{name}' once the spaces around them are removed; "
                    "rename them so that one of them is the column wanted"
                )
            if near:
                renames[near[0]] = name
                log.info("%s: column %r read as '%s' (spaces around its name)", source, near[0], name)
        df = df.set_axis(present, axis=1).rename(columns=renames)
        missing = [c for c in wanted if c not in df.columns]
        if missing:
            raise DataValidationError(
                f"{source}: missing column(s) {missing}; the columns present are {present}"
            )
        unused = [c for c in df.columns if c not in wanted]
        if unused and report_unused:
            log.info(
                "%s: column(s) %s have no role (time, series, target, known, observed, static): ignored",
                source,
                unused,
            )
        return df

    def _series_ids(self, df, source) -> pd.Series:
        if not self.series_col:
            return pd.Series(SINGLE_SERIES_ID, index=df.index)
        ids = df[self.series_col]
        empty = ids.isna().to_numpy()
        if empty.any():
            row = int(np.flatnonzero(empty)[0])
            raise DataValidationError(
                f"{source}: {int(empty.sum())} empty series id(s); first at "
                f"{_where(source, self.series_col, row)}"
            )
        return ids

    def _parse_times(self, df, source, series) -> pd.Series:
        raw = df[self.time_col]
        time_format = self.time_format or self._date_order(raw, source)
        return read_times(
            raw, time_format, source, lambda row: _where(source, self.time_col, row, self._sid(series, row))
        )

    def time_format_of(self, df: pd.DataFrame, source: str) -> str | None:
        """The strftime format `validate` reads the text times of `df` with: `time_format` when set,
        else the one inferred from them (what a model folder keeps, so that a new table is read as the
        training file was); None for times that are not text, or that no single format fits."""
        if self.time_format:
            return self.time_format
        raw = self._match_columns(df.reset_index(drop=True), str(source), [], report_unused=False)[
            self.time_col
        ]
        return self._date_order(raw, source) or _inferred_format(raw)

    def _date_order(self, raw: pd.Series, source) -> str | None:
        """The format of text dates with the year last that fits every row: day-first or month-first.

        None where the question does not arise (no such dates, or neither order fits: the parse then
        reports the first bad cell); an error where both fit, since the file cannot tell which it is.
        """
        if raw.dtype.kind not in "OSU" and not isinstance(raw.dtype, pd.StringDtype):
            return None
        text = raw.dropna().astype(str)
        if text.empty:
            return None
        month_first = guess_datetime_format(text.iloc[0])
        if month_first is None or _year_first(month_first):
            return None
        with warnings.catch_warnings():  # pandas warns when the day cannot come first: that is the answer
            warnings.simplefilter("ignore", UserWarning)
            day_first = guess_datetime_format(text.iloc[0], dayfirst=True)
        if day_first is None or day_first == month_first:
            return None
        readings = {}
        for fmt in (day_first, month_first):
            parsed = pd.to_datetime(text, format=fmt, errors="coerce", utc="%z" in fmt)
            if parsed.notna().all():
                readings[fmt] = parsed
        if len(readings) == 2:
            differ = np.flatnonzero((readings[day_first] != readings[month_first]).to_numpy())
            if differ.size:
                i = differ[0]
                raise DataValidationError(
                    f"{source}: the dates of column '{self.time_col}' read both day-first and month-first "
                    f"({text.iloc[i]!r} at {describe_row(source, int(text.index[i]))} is "
                    f"{readings[day_first].iloc[i]} or {readings[month_first].iloc[i]}); "
                    f"set {setting_name('time_format')} to '{day_first}' or '{month_first}'"
                )
        return next(iter(readings), None)

    def _parse_numeric(self, raw: pd.Series, col, source, series, times, may_be_empty=False) -> pd.Series:
        values = pd.to_numeric(raw, errors="coerce").astype("float64")
        missing = raw.isna().to_numpy()
        if not may_be_empty:
            self._refuse_empty(missing, col, source, series, times, "column")
        not_numeric = values.isna().to_numpy() & ~missing
        if not_numeric.any():
            row = int(np.flatnonzero(not_numeric)[0])
            value = plain(raw.iloc[row])
            hint = ""
            if DECIMAL_COMMA.fullmatch(str(value)):
                hint = f"; for a decimal comma set {setting_name('csv.decimal')} to ','"
            raise DataValidationError(
                f"{source}: non-numeric value {value!r} at "
                f"{_where(source, col, row, self._sid(series, row), times[row])}"
                f" ({int(not_numeric.sum())} such cell(s) in this column){hint}"
            )
        infinite = np.isinf(values.to_numpy())
        if infinite.any():
            row = int(np.flatnonzero(infinite)[0])
            raise DataValidationError(
                f"{source}: infinite value {plain(raw.iloc[row])!r} at "
                f"{_where(source, col, row, self._sid(series, row), times[row])}"
            )
        return values

    def _parse_category(self, raw: pd.Series, col, source, series, times) -> pd.Series:
        self._refuse_empty(raw.isna().to_numpy(), col, source, series, times, "static column")
        return raw.astype(str)  # categories are compared as text: 7 and "7" are one category

    def _refuse_empty(self, missing: np.ndarray, col, source, series, times, kind: str) -> None:
        """An error at the first empty cell of a column (`missing`: (rows,) bool), if any."""
        if missing.any():
            row = int(np.flatnonzero(missing)[0])
            raise DataValidationError(
                f"{source}: empty/NaN cell at {_where(source, col, row, self._sid(series, row), times[row])}"
                f" ({int(missing.sum())} empty cell(s) in this {kind})"
            )

    def _check_static(self, clean, source):
        """A static column holds one value per series: the first row that differs is an error."""
        categories = [c for c in self.static_categorical_cols if c != self.series_col]
        groups = clean.groupby(self.series_col, sort=False) if self.series_col else [(None, clean)]
        for col in [*self.static_cols, *categories]:
            for sid, group in groups:
                values = group[col].to_numpy()
                differs = np.flatnonzero(values != values[0])
                if differs.size:
                    row = int(group.index[differs[0]])
                    raise DataValidationError(
                        f"{source}: static column '{col}' changes within a series: "
                        f"{plain(values[differs[0]])!r} at "
                        f"{_where(source, col, row, sid, group[self.time_col].to_numpy()[differs[0]])}, "
                        f"but {plain(values[0])!r} at {describe_row(source, int(group.index[0]))} (a static "
                        "column holds one value per series; time-varying inputs are known_cols or "
                        "observed_cols)"
                    )

    def _check_time_order(self, clean, source, df):
        """Within each series timestamps must be unique and increasing in file order (`df`: the table
        as read, for a hint at the series column when there is none)."""
        keys = [self.series_col, self.time_col] if self.series_col else [self.time_col]
        duplicated = clean.duplicated(keys, keep="first").to_numpy()
        if duplicated.any():
            row = int(clean.index[np.flatnonzero(duplicated)[0]])
            sid = clean[self.series_col].loc[row] if self.series_col else None
            time = clean[self.time_col].loc[row]
            same = clean[self.time_col] == time
            if self.series_col:
                same &= clean[self.series_col] == sid
            first_row = int(clean.index[same.to_numpy()][0])
            raise DataValidationError(
                f"{source}: duplicate timestamp at {_where(source, self.time_col, row, sid, time)}; "
                f"the same time already appears at {describe_row(source, first_row)}"
                f" ({int(duplicated.sum())} duplicate(s) in total){self._series_col_hint(clean, df)}"
            )
        # each series' rows in file order, the series in order of appearance, in one pass: a Python loop
        # over the series' groups is what a served request of many series paid for
        series = (
            pd.factorize(clean[self.series_col])[0] if self.series_col else np.zeros(len(clean), dtype=int)
        )
        order = np.argsort(series, kind="stable")
        s, t = series[order], clean[self.time_col].to_numpy()[order]
        backwards = np.flatnonzero((s[1:] == s[:-1]) & (s[1:] >= 0) & (t[1:] < t[:-1]))
        if backwards.size:  # the first series (in order of appearance) to go back, at its first step back
            at, was = order[backwards[0] + 1], order[backwards[0]]
            row, before = int(clean.index[at]), int(clean.index[was])
            sid = clean[self.series_col].iloc[at] if self.series_col else None
            raise DataValidationError(
                f"{source}: unsorted timestamps at {_where(source, self.time_col, row, sid, t[backwards[0] + 1])}"
                f": earlier than {pd.Timestamp(t[backwards[0]])} at {describe_row(source, before)}"
                " (sort the table by time within each series)"
            )

    def _series_col_hint(self, clean, df) -> str:
        """Without a series column, duplicate times may be several series stacked in long format:
        say so, naming the columns without a role that tell them apart."""
        if self.series_col:
            return ""
        times = clean[self.time_col]
        candidates = [
            c
            for c in df.columns
            if c not in self.columns
            and df[c].nunique() > 1
            and not pd.DataFrame({"id": df[c], "time": times}).duplicated().any()
        ]
        which = f" (one of {candidates})" if candidates else ""
        return f"; if the table holds several series, set data.series_col to the column of series ids{which}"

    def _sid(self, series: pd.Series, row: int):
        return series.iloc[row] if self.series_col else None


# a number written with a decimal comma, as some locales' spreadsheets export it: 12,5 or -0,25
DECIMAL_COMMA = re.compile(r"[-+]?\d+,\d+")


def _inferred_format(raw: pd.Series) -> str | None:
    """The format pandas infers for text times (from the first one), when it reads every one of them."""
    if raw.dtype.kind not in "OSU" and not isinstance(raw.dtype, pd.StringDtype):
        return None
    text = raw.dropna().astype(str)
    found = guess_datetime_format(text.iloc[0]) if len(text) else None
    if found is None:
        return None
    parsed = pd.to_datetime(text, format=found, errors="coerce", utc="%z" in found)
    return found if parsed.notna().all() else None


def _year_first(time_format: str) -> bool:
    """True for formats that start with the year (ISO dates): never read day-first."""
    return time_format.startswith(("%Y", "%y"))


def _to_datetime(raw: pd.Series, time_format: str | None, source: str) -> pd.Series:
    """`raw` as naive times, NaT where a cell does not parse; aware times are converted to UTC.

    Times with several UTC offsets (a daylight-saving change) make pandas refuse a common time zone
    unless asked to convert: they are read again as UTC.
    """
    try:
        times = pd.to_datetime(raw, format=time_format, errors="coerce")
    except ValueError:
        times = pd.to_datetime(raw, format=time_format, errors="coerce", utc=True)
    if getattr(times.dt, "tz", None) is not None:
        log.info("%s: timezone-aware times converted to naive UTC", source)
        times = times.dt.tz_convert("UTC").dt.tz_localize(None)
    return times


def read_times(raw: pd.Series, time_format: str | None, source: str, where=None) -> pd.Series:
    """The column `raw` as naive times (`datetime64[ns]`), read with `time_format` (None: inferred from
    the first row); an empty or unparseable cell is one `DataValidationError` naming its place
    (`where(row)`, default: the column and row in `source`)."""
    where = where or (lambda row: _where(source, raw.name, row))
    try:
        times = _to_datetime(raw, time_format, source)
    except (ValueError, TypeError) as err:
        raise DataValidationError(f"{source}: column '{raw.name}' cannot be read as times: {err}") from err
    bad = times.isna().to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        value = plain(raw.iloc[row])
        what = "empty time" if pd.isna(value) else f"unparseable time {value!r}"
        read_as = f"the format {time_format!r}" if time_format else "a format inferred from the first row"
        raise DataValidationError(
            f"{source}: {what} at {where(row)} ({int(bad.sum())} bad time cell(s) in total, read with "
            f"{read_as}); set the times' strftime format with {setting_name('time_format')}, e.g. '%d/%m/%Y %H:%M'"
        )
    return times.astype("datetime64[ns]")


def series_ids(clean: pd.DataFrame, schema: SeriesSchema) -> np.ndarray:
    """Series id of every row of a validated frame (SINGLE_SERIES_ID when there is no series column)."""
    if schema.series_col:
        return clean[schema.series_col].to_numpy()
    return np.full(len(clean), SINGLE_SERIES_ID)


def resolve_freq(clean: pd.DataFrame, schema: SeriesSchema, source: str) -> pd.DateOffset:
    """The sampling step: `schema.freq` when given, else the most common step between rows; a given
    freq must be that step.

    Steps shorter than the frequency mean the data are not on one regular grid: that is an error,
    because a window of N rows would then not cover N time steps.
    """
    times = clean[schema.time_col].to_numpy()
    ids = series_ids(clean, schema)
    same_series = ids[1:] == ids[:-1]
    steps = (times[1:] - times[:-1])[same_series]
    if steps.size:
        values, counts = np.unique(steps, return_counts=True)
        common = pd.Timedelta(values[np.argmax(counts)])
    elif schema.freq is None:
        raise DataValidationError(f"{source}: cannot infer the frequency from one row per series; set freq")
    offset = to_offset(schema.freq) if schema.freq is not None else to_offset(common)
    step = fixed_step(offset, source)
    if steps.size and step != common:
        # with another step every row would be a gap (or too close): no window, and no clear reason
        raise DataValidationError(
            f"{source}: data.freq={offset.freqstr!r} is not the data's step: {int(counts.max())} of the "
            f"{steps.size} steps between consecutive rows (column '{schema.time_col}') are "
            f"{to_offset(common).freqstr!r}; set data.freq to {to_offset(common).freqstr!r}, or leave it "
            "unset (null) to infer it"
        )
    too_short = np.flatnonzero(steps < step)
    if too_short.size:
        pos = int(np.flatnonzero(same_series)[too_short[0]]) + 1
        row = int(clean.index[pos])
        raise DataValidationError(
            f"{source}: timestamps closer than the frequency {offset.freqstr} at "
            f"{_where(source, schema.time_col, row, ids[pos] if schema.series_col else None, times[pos])}"
            " (resample the data to a regular grid, or set freq)"
        )
    return offset


def fixed_step(offset: pd.DateOffset, source: str = "data") -> pd.Timedelta:
    """The offset as a fixed duration; calendar offsets like month ends have none."""
    try:
        return pd.Timedelta(offset)
    except (ValueError, TypeError) as err:
        raise DataValidationError(
            f"{source}: frequency {offset.freqstr!r} has no fixed length; use one like 'h', '10min', 's'"
        ) from err


def find_segments(clean: pd.DataFrame, schema: SeriesSchema, step: pd.Timedelta, source: str) -> pd.DataFrame:
    """Contiguous runs of rows: a new segment starts with each series and after each gap.

    Returns one row per segment: `series_id`, `start`, `stop` (positions in `clean`, stop exclusive).
    Nothing is dropped; the number of gaps is logged so that a user sees what the windows skip.
    """
    times = clean[schema.time_col].to_numpy()
    ids = series_ids(clean, schema)
    new_series = np.r_[True, ids[1:] != ids[:-1]]
    gap = np.r_[False, (times[1:] - times[:-1]) != step.to_timedelta64()] & ~new_series
    starts = np.flatnonzero(new_series | gap)
    stops = np.r_[starts[1:], len(clean)]
    if gap.any():
        log.info(
            "%s: %d gap(s) longer than %s found; series split into %d contiguous segment(s)",
            source,
            int(gap.sum()),
            step,
            len(starts),
        )
    return pd.DataFrame({"series_id": ids[starts], "start": starts, "stop": stops})
