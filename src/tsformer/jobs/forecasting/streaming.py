"""A forecaster's answer to rows as they arrive (tsformer-serve's `params: {"stream": "<key>"}`): the
server keeps, per key and series, the rows the series' next window may read, so that a client sends only
its new rows (a new observation, the known inputs of a new future step) and gets the forecasts that the
whole table so far gives (`Forecaster.predict`).

The state of a stream (`ForecastStream`, opaque to the server) holds the kept rows of its series, read
and checked (`SeriesSchema.validate`: times as times, values as numbers). A request's rows are checked
the same way (a bad cell is one line naming its row in the request), then joined to the kept rows of
their series: a row at a time already kept replaces it (the future row of a step whose target is now
observed), the others are added, and each series is sorted by time. The series of the request are
forecast from these rows, exactly as `predict` forecasts a table holding them (its origin: each
series' last row with every target observed, or `params.origin`). Kept afterwards, per series: the rows
of the window the forecast read, `context_len` rows up to its origin and the `horizon` rows after it
(at most `context_len + horizon` rows; a later origin reads at most those of them), and at most
`MAX_SERIES` series per stream. A series' first request holds at least one window (`context_len` rows of
history and the horizon's future rows), as a whole table must.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from tsformer.data.schema import series_ids
from tsformer.data.split_rows import SplitRows, frame_of
from tsformer.jobs.forecasting.forecaster import Forecaster, series_positions

MAX_SERIES = 1000  # series per stream


@dataclass(frozen=True)
class ForecastStream:
    rows: pd.DataFrame | None = None  # the kept rows of every series, checked (`SeriesSchema.validate`)


def answer_stream(
    model: Forecaster,
    state: ForecastStream | None,
    table: pd.DataFrame | SplitRows,
    params: dict,
    source: str,
) -> tuple[pd.DataFrame, ForecastStream]:
    """(the forecasts of the series of `table` from their kept and new rows, the next state); `state` is
    left as it was."""
    if model.task.reconstructs:
        raise ValueError(
            "this model rebuilds each row from its window (a reconstruction model): it answers whole "
            "tables, not streams; send the table without params.stream"
        )
    c = model.contract
    schema = replace(c.schema, time_format=params["time_format"] or c.time_format)
    new = schema.validate(frame_of(table), source, may_be_empty=set(schema.value_cols)).reset_index(drop=True)
    kept = (state or ForecastStream()).rows
    keys = [c.series_col, c.time_col] if c.series_col else [c.time_col]
    joined = new if kept is None else pd.concat([kept, new], ignore_index=True)
    joined = joined.drop_duplicates(keys, keep="last").sort_values(keys, kind="stable", ignore_index=True)
    ids = series_ids(joined, c.schema)
    asked = np.isin(ids, pd.unique(series_ids(new, c.schema)))
    if len(pd.unique(ids)) > MAX_SERIES:
        raise ValueError(f"{source}: a stream keeps at most {MAX_SERIES} series; send more under another key")
    answered = joined[asked].reset_index(drop=True)
    forecasts = model.predict(answered, origin=params.get("origin"), source=source)
    return forecasts, ForecastStream(pd.concat([joined[~asked], _windows(model, answered, forecasts)]))


def _windows(model: Forecaster, rows: pd.DataFrame, forecasts: pd.DataFrame) -> pd.DataFrame:
    """The rows of each series' forecast window: `context_len` up to its origin, `horizon` after it."""
    c = model.contract
    origins = forecasts.groupby("series_id", sort=False)["origin_time"].first()
    kept = []
    for sid, at in series_positions(rows, c).items():
        times = rows[c.time_col].to_numpy()[at]
        last = int(np.flatnonzero(times == np.datetime64(origins[sid]))[-1])
        kept.append(at[max(0, last + 1 - c.context_len) : last + 1 + c.horizon])
    return rows.iloc[np.concatenate(kept)] if kept else rows.iloc[:0]
