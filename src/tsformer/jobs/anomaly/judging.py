"""A trained anomaly detector with its calibrated threshold and event rule (`AnomalyModel`): how a table
is judged (per row `series_id, time, score, threshold, alarm, event_id, top_channel_1..3`, and the label
when the table has one; per event `event_id, series_id, start, end, n_rows, peak_score, peak_time,
top_channels`), and its model folder (what an engineer reads of it, its evaluation and figures: `report.py`).

The model folder (`model_folder.py`): `tsformer.json` (format `anomaly-2`, the detector task's class and
hyperparameters: its score, the channels read as states, the memory's size; the table's columns) and
`weights.pt` (the task's state dict: the network, the train rows' mean and sd per channel, the channels'
usual errors, the memory of normal windows and the threshold). Loading it runs no code. A folder of
format `anomaly-1` (scored row by row, before issue 41) is refused in one line: train it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tsformer import model_folder
from tsformer.data.anomaly import SERIES_COL, check_labels, series_rows
from tsformer.jobs.anomaly.alarms import EventRule, events_of
from tsformer.model_folder import RESTORE, FolderKind, ModelFolderError, ModelInfo
from tsformer.tasks.anomaly import AnomalyScoring, Scores

FORMAT = "anomaly-2"
N_TOP = 3  # top contributing channels per row and event


@dataclass
class AnomalyContract:
    """What a table must hold for the detector (its channels are the task's `target_names`)."""

    time_col: str = "time"
    label_col: str | None = None
    csv: dict = field(default_factory=dict)  # the training CSV's read options


@dataclass
class AnomalyConfig:
    """An anomaly model's `tsformer.json`: every key written, and required when read."""

    format: str
    task_class: str  # module.qualname of a detector task (tsformer.tasks.anomaly)
    hparams: dict
    data: AnomalyContract
    info: ModelInfo


def _check_format(config: dict, path: Path) -> None:
    if config.get("format") == "anomaly-1":
        raise ModelFolderError(
            f"{path}: format 'anomaly-1', an anomaly model of an earlier tsformer whose scores were made row by "
            f"row; this tsformer scores windows ({FORMAT!r}): train it again (python train.py ...)"
        )
    if config.get("format") != FORMAT:
        raise ModelFolderError(
            f"{path}: format {config.get('format')!r}, this tsformer reads anomaly model folders of format "
            f"{FORMAT!r}: {RESTORE}"
        )


def _check_contract(contract: AnomalyContract, hparams: dict, path: Path) -> None:
    if len(hparams.get("target_names") or []) != hparams.get("d_target"):
        raise ModelFolderError(f"{path}: hparams.target_names must name the d_target channels: {RESTORE}")


FOLDER = FolderKind(
    name="anomaly model",
    schema=AnomalyConfig,
    tasks=(AnomalyScoring,),
    header=lambda: {"format": FORMAT},
    check_header=_check_format,
    contract_of=lambda data: AnomalyContract(**data),
    check_contract=_check_contract,
)


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

    def predict(
        self, table: pd.DataFrame, origin=None, source: str = "table", time_format=None
    ) -> pd.DataFrame:
        """The per-row table of `table` (`judge`); `origin` does not apply (every row is judged)."""
        if origin is not None:
            raise ValueError(f"origin={origin}: an anomaly model judges every row; give no origin")
        return self.judge(table, source)[0]

    # -- judging a table --------------------------------------------------------------------------

    def judge(self, table: pd.DataFrame, source: str = "table") -> tuple[pd.DataFrame, pd.DataFrame, Scores]:
        """(per-row table, events table, scores) of `table` (the rows in its order)."""
        check_labels(table, self.label_col)
        scores = self.detector.score(table, source)
        alarm = scores.score > self.threshold
        event = np.full(len(table), -1)
        n_events = 0
        for rows in series_rows(table).values():  # events never cross series
            local = events_of(alarm[rows], self.rule)
            event[rows] = np.where(local >= 0, local + n_events, -1)
            n_events += int(local.max()) + 1 if (local >= 0).any() else 0
        series = table[SERIES_COL].to_numpy() if SERIES_COL in table.columns else np.zeros(len(table), int)
        times = table[self.time_col].to_numpy() if self.time_col in table.columns else np.arange(len(table))
        top = np.asarray(scores.top_channels(N_TOP))  # (T, N_TOP)
        rows = pd.DataFrame(
            {
                "series_id": series,
                "time": times,
                "score": scores.score,
                "threshold": self.threshold,
                "alarm": alarm.astype(int),
                "event_id": pd.array(np.where(event >= 0, event, None), dtype="Int64"),
            }
            | {f"top_channel_{i + 1}": top[:, i] for i in range(top.shape[1])}
        )
        if self.label_col is not None and self.label_col in table.columns:
            rows["label"] = pd.to_numeric(table[self.label_col]).astype(int).to_numpy()
        return rows, self.events_table(rows, event, scores), scores

    def events_table(self, rows: pd.DataFrame, event: np.ndarray, scores: Scores) -> pd.DataFrame:
        records = []
        names = np.asarray(scores.channels)
        for e in range(int(event.max()) + 1 if len(event) else 0):
            at = np.flatnonzero(event == e)
            peak = at[np.argmax(scores.score[at])]
            summed = scores.contributions[at].sum(axis=0)
            records.append(
                {
                    "event_id": e,
                    "series_id": rows["series_id"].iloc[at[0]],
                    "start": rows["time"].iloc[at[0]],
                    "end": rows["time"].iloc[at[-1]],
                    "n_rows": len(at),
                    "peak_score": float(scores.score[peak]),
                    "peak_time": rows["time"].iloc[peak],
                    "top_channels": ";".join(names[np.argsort(-summed)[:N_TOP]]),
                }
            )
        columns = [
            "event_id",
            "series_id",
            "start",
            "end",
            "n_rows",
            "peak_score",
            "peak_time",
            "top_channels",
        ]
        return pd.DataFrame(records, columns=columns)
