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
from tsformer.data.anomaly import SERIES_COL, check_labels, series_rows
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
        self, table: pd.DataFrame, source: str = "table", causal: bool | None = None
    ) -> tuple[pd.DataFrame, pd.DataFrame, Scores]:
        """(per-row table, events table, scores) of `table` (the rows in its order); `causal` as the
        detector's `score` (default: the model's setting; a stream's rows are scored causally)."""
        check_labels(table, self.label_col)
        scores = self.detector.score(table, source, causal)
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
