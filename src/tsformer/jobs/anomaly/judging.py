"""A trained anomaly detector with its calibrated threshold and event rule (`AnomalyModel`): how a table
is judged (per row `series_id, time, score, threshold, alarm, event_id, top_channel_1..3`, and the label
when the table has one; per event `event_id, series_id, start, end, n_rows, page_time, page_delay_rows,
page_delay, peak_score, peak_time, top_channels`: an event from its first alarm, paged `page_delay_rows`
later, `tasks.alarms.event_spans`), and its model folder (what an engineer reads of it, its evaluation and figures: `report.py`).

The model folder (`model_folder.py`): `tsformer.json` (format `anomaly-3`: `FOLDER`, the detector task's
class and hyperparameters: its score, how rows are scored, the channels read as states, the memory's
size; the table's columns) and `weights.pt` (the task's state dict: the network, the train rows' mean and
sd per channel, the channels' usual errors, the memory of normal windows and the threshold). Loading it
runs no code. Folders of formats `anomaly-1` and `anomaly-2` (issue 34's detectors, scored value by
value) read with `row_score: value` and an empty memory: they score as they did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from tsformer import model_folder
from tsformer.data.anomaly import SERIES_COL, check_labels, check_table, rows_by_key, series_rows
from tsformer.data.schema import DataValidationError
from tsformer.model_folder import RESTORE, FolderKind, ModelFolderError, ModelInfo, Upgrade
from tsformer.tasks.alarms import DriftRule, EventRule, drifting_threshold, event_spans
from tsformer.tasks.anomaly import AnomalyScoring, Scores, ranked_channels

N_TOP = 3  # top contributing channels per row and event


@dataclass
class AnomalyContract:
    """What a table must hold for the detector (its channels are the task's `target_names`)."""

    time_col: str = "time"
    label_col: str | None = None
    csv: dict = field(default_factory=dict)  # the training CSV's read options


def _check_contract(contract: AnomalyContract, hparams: dict, path: Path) -> None:
    if len(hparams.get("target_names") or []) != hparams.get("d_target"):
        raise ModelFolderError(f"{path}: hparams.target_names must name the d_target channels: {RESTORE}")


@dataclass
class AnomalyModel:
    """A trained detector with its calibrated threshold and event rule: scores, alarms and events of a table."""

    detector: AnomalyScoring  # scores a table (`score`)
    threshold: float
    false_alarm_rate: float
    rule: EventRule
    time_col: str = "time"
    label_col: str | None = None
    contract: AnomalyContract = field(default_factory=AnomalyContract)
    info: ModelInfo | None = None

    @classmethod
    def of_task(cls, task: AnomalyScoring, contract: AnomalyContract, info: ModelInfo | None = None):
        """The model of a calibrated detector task (`task.calibrate`)."""
        return cls(task, float(task.threshold), float(task.hparams.false_alarm_rate), EventRule(**task.event_rule),
                   contract.time_col, contract.label_col, contract, info)  # fmt: skip

    def save(self, folder: Path) -> Path:
        """The model folder (each file written atomically)."""
        return model_folder.write(folder, FOLDER, self.detector, self.contract, self.info)

    @classmethod
    def load(cls, folder: str | Path) -> AnomalyModel:
        """The model in `folder`, checked (`model_folder.read`)."""
        return cls.of_task(*model_folder.read(folder, FOLDER))

    # -- judging a table --------------------------------------------------------------------------

    def judge(
        self,
        table: pd.DataFrame,
        source: str = "table",
        causal: bool | None = None,
        context: pd.DataFrame | None = None,
    ) -> tuple[pd.DataFrame, pd.DataFrame, Scores]:
        """(per-row table, events table, scores) of `table` (the rows in its order); `causal` as the
        detector's `score` (default: the model's setting; a stream's rows are scored causally). With
        `context`, each series' earlier rows (`scored_in_context`): its first rows scored from whole
        windows; the context rows are neither judged nor reported."""
        check_labels(table, self.label_col)
        if context is None:
            scores = self.detector.score(table, source, causal)
        else:
            scores = scored_in_context(self.detector, table, context, source, causal, self.time_col)
        threshold = self.thresholds(scores.score, table)  # (T,)
        alarm = scores.score > threshold
        event = np.full(len(table), -1)
        pages = []  # each event's page: (its position in the table, its series' rows after the event's start)
        for rows in series_rows(table).values():  # events never cross series
            for span in event_spans(alarm[rows], self.rule, scores.score[rows] / threshold[rows]):
                event[rows[span.start : span.end]] = len(pages)
                pages.append((rows[span.page], span.page - span.start))
        series = table[SERIES_COL].to_numpy() if SERIES_COL in table.columns else np.zeros(len(table), int)
        times = table[self.time_col].to_numpy() if self.time_col in table.columns else np.arange(len(table))
        top = np.asarray(scores.top_channels(N_TOP))  # (T, N_TOP)
        rows = pd.DataFrame(
            {
                "series_id": series,
                "time": times,
                "score": scores.score,
                "threshold": threshold,
                "alarm": alarm.astype(int),
                "event_id": pd.array(np.where(event >= 0, event, None), dtype="Int64"),
            }
            | {f"top_channel_{i + 1}": top[:, i] for i in range(top.shape[1])}
        )
        if self.label_col is not None and self.label_col in table.columns:
            rows["label"] = pd.to_numeric(table[self.label_col]).astype(int).to_numpy()
        return rows, self.events_table(rows, event, pages, scores), scores

    def thresholds(self, score: np.ndarray, table: pd.DataFrame) -> np.ndarray:
        """`(T,)` each row's threshold: the calibrated one, or with `model.threshold_drift` the one that
        follows slow drift, series by series (`tasks.alarms.drifting_threshold`)."""
        out = np.full(len(score), self.threshold)
        hp = self.detector.hparams
        drift = hp.get("threshold_drift")
        if not drift:
            return out
        rule = DriftRule(**drift)
        level = hp.get(f"val_score_{rule.level}")
        if level is None:  # a model folder from before the level was kept
            return out
        for rows in series_rows(table).values():
            out[rows] = drifting_threshold(score[rows], self.threshold, level, rule)
        return out

    def events_table(
        self, rows: pd.DataFrame, event: np.ndarray, pages: list[tuple], scores: Scores
    ) -> pd.DataFrame:
        """Per event (`event (T,)` each row's event, -1 outside; `pages` each event's page: its row in
        the table, and its series' rows from the event's start) its figures: `EVENT_COLUMNS`."""
        records = []
        names = scores.channels
        for e, (page, delay) in enumerate(pages):
            at = np.flatnonzero(event == e)
            peak = at[np.argmax(scores.score[at])]
            summed = scores.contributions[at].sum(axis=0)
            start, paged = rows["time"].iloc[at[0]], rows["time"].iloc[page]
            records.append(
                {
                    "event_id": e,
                    "series_id": rows["series_id"].iloc[at[0]],
                    "start": start,
                    "end": rows["time"].iloc[at[-1]],
                    "n_rows": len(at),
                    "page_time": paged,
                    "page_delay_rows": int(delay),
                    "page_delay": elapsed(start, paged),
                    "peak_score": float(scores.score[peak]),
                    "peak_time": rows["time"].iloc[peak],
                    "top_channels": ";".join(c for c in ranked_channels(summed, names, N_TOP) if c),
                }
            )
        return pd.DataFrame(records, columns=EVENT_COLUMNS)


def context_reach(detector: AnomalyScoring) -> int:
    """Rows before a table that can move its scores, rounded up to whole strides (so the judged rows'
    windows keep their places): the windows that cover (or, causally, end within a window of) its first
    row, and the rows a forecast step reads before it."""
    reach = detector.window + 2 * detector.window_length
    return -(-reach // detector.stride) * detector.stride


def scored_in_context(
    detector: AnomalyScoring,
    table: pd.DataFrame,
    context: pd.DataFrame,
    source: str = "table",
    causal: bool | None = None,
    time_col: str = "time",
) -> Scores:
    """`Scores` of `table`'s rows (in its order), each series scored after its last `context_reach` rows
    of `context` (the same series' earlier rows, e.g. the normal rows before the judged ones): its
    first rows are covered by as many windows, each as long, as the rows inside it, where on their own
    they have fewer (and, causally or forecast, shorter history). The context rows are scored and
    dropped; a series' context is cut to whole strides; a series without context is scored as alone.
    Only rows before a series' first row are context: with times, a context row not before it is one
    line."""
    channels = detector.channels
    check_table(table, channels, max(detector.window, detector.window_length), source)
    check_table(context, channels, 1, f"{source}: context rows")
    step, reach = detector.stride, context_reach(detector)
    whole = {None: np.arange(len(context))}
    by_series = rows_by_key(context[SERIES_COL]) if SERIES_COL in context.columns else whole
    pieces, judged_at = [], []  # the rows scored, series by series; where `table`'s rows lie among them
    offset = 0
    for sid, rows in series_rows(table).items():
        earlier = by_series.get(sid, np.arange(0))
        kept = earlier[len(earlier) - min(len(earlier), reach) // step * step :]
        before = context.iloc[kept]
        _check_before(before, table.iloc[rows], time_col, sid, source)
        piece = pd.concat([before[channels], table.iloc[rows][channels]], ignore_index=True)
        piece[SERIES_COL] = offset  # one series per piece, whatever the ids' type
        pieces.append(piece)
        judged_at.append((rows, offset + len(kept) + np.arange(len(rows))))
        offset += len(piece)
    scored = detector.score(pd.concat(pieces, ignore_index=True), source, causal)
    out = Scores(np.zeros(len(table)), np.zeros((len(table), len(channels))), scored.channels,
                 {name: np.zeros(len(table)) for name in scored.parts})  # fmt: skip
    for rows, at in judged_at:
        out.score[rows] = scored.score[at]
        out.contributions[rows] = scored.contributions[at]
        for name, part in scored.parts.items():
            out.parts[name][rows] = part[at]
    return out


def _check_before(context: pd.DataFrame, rows: pd.DataFrame, time_col: str, sid, source: str) -> None:
    """One line when a series' context rows do not all lie before its first row (by the time column)."""
    if len(context) == 0 or time_col not in context.columns or time_col not in rows.columns:
        return
    last, first = context[time_col].max(), rows[time_col].min()
    if not last < first:
        name = f"series {sid!r}" if sid is not None else "the table"
        raise DataValidationError(
            f"{source}: context rows of {name} reach {last}, not before its first row ({first}): "
            "context rows are the series' earlier rows only"
        )


EVENT_COLUMNS = ["event_id", "series_id", "start", "end", "n_rows", "page_time", "page_delay_rows", "page_delay",
                 "peak_score", "peak_time", "top_channels"]  # fmt: skip


def elapsed(start, end) -> str | None:
    """`end - start` as a duration (`duration_text`) when the rows have times, else None."""
    if isinstance(start, int | float | np.integer | np.floating):  # a row number, not a time
        return None
    try:
        return duration_text(pd.Timestamp(end) - pd.Timestamp(start))
    except (TypeError, ValueError):
        return None


def duration_text(delta: pd.Timedelta) -> str:
    """A duration as an operator reads it: `1 h 29 min`, `2 days 3 h`, `45 s` (its two largest units)."""
    seconds = round(pd.Timedelta(delta).total_seconds())
    if seconds == 0:
        return "0 s"
    units = [("day", 86_400), ("h", 3_600), ("min", 60), ("s", 1)]
    parts = []
    for name, size in units:
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {name}{'s' if name == 'day' and count > 1 else ''}")
    return " ".join(parts[:2])


def _value_rows(config: dict) -> dict:
    """An issue-34 folder scored as it was: each value's error over its covering windows, no state."""
    return {**config, "hparams": {**config["hparams"], "row_score": "value", "state_channels": []}}


def _no_memory(state: dict, config: dict) -> dict:
    """An issue-34 folder's weights with the buffers it did not have: no memory, the hybrid's medians 1."""
    hp = config["hparams"]
    added = {"part_median": torch.ones(1, dtype=torch.float64)}
    if config["task_class"].endswith("MaskedAnomalyDetector"):
        dim = hp["context_len"] * hp["net"]["d_model"]
        added |= {"memory.keys": torch.zeros(0, dim), "memory.rows": torch.zeros(0, hp["d_target"]),
                  "memory.starts": torch.zeros(0, dtype=torch.long)}  # fmt: skip
    return {**state, **added}


FOLDER = FolderKind(
    name="anomaly",
    version=3,  # 3: scores from windows, states, the memory (issue 41); 2: the kinds' one header
    describes="anomaly model",
    contract=AnomalyContract,
    tasks=(AnomalyScoring,),
    load=AnomalyModel.load,
    check_contract=_check_contract,
    upgrades={1: Upgrade(), 2: Upgrade(_value_rows, _no_memory)},  # 1 holds what 2 holds
)
