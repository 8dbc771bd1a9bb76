"""A trained anomaly detector with its calibrated threshold and event rule (`AnomalyModel`): how a table
is judged (per row `series_id, time, score, threshold, alarm, event_id, top_channel_1..3`, and the label
when the table has one; per event `event_id, series_id, start, end, n_rows, peak_score, peak_time,
top_channels`), its model folder, its evaluation against labels and its figures.

The model folder (`model_folder.py`): `tsformer.json` (format `anomaly-2`: `FOLDER`, the detector task's class and
hyperparameters, the table's columns) and `weights.pt` (the task's state dict: the network, the train
rows' mean and sd per channel, the channels' usual errors and the threshold). Loading it runs no code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tsformer import model_folder
from tsformer.data.anomaly import SERIES_COL, check_labels, series_rows
from tsformer.model_folder import RESTORE, FolderKind, ModelFolderError, ModelInfo, Upgrade
from tsformer.tasks.alarms import EventRule, events_of
from tsformer.tasks.anomaly import AnomalyScoring, Scores

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


FOLDER = FolderKind(
    name="anomaly",
    version=2,  # 2: the kinds' one header; the keys of 1
    describes="anomaly model",
    contract=AnomalyContract,
    tasks=(AnomalyScoring,),
    load=AnomalyModel.load,
    check_contract=_check_contract,
    upgrades={1: Upgrade()},  # 1 holds what 2 holds
)


# -- evaluation when labels exist ---------------------------------------------------------------------


def labelled_incidents(rows: pd.DataFrame) -> list[np.ndarray]:
    """Row positions of each labelled incident (a run of label 1 within a series)."""
    incidents = []
    for at in series_rows(rows).values():
        label = rows["label"].to_numpy()[at].astype(bool)
        padded = np.concatenate([[False], label, [False]])
        edges = np.flatnonzero(np.diff(padded.astype(int)))
        incidents += [at[a:b] for a, b in zip(edges[::2], edges[1::2], strict=True)]
    return incidents


def evaluate(rows: pd.DataFrame, events: pd.DataFrame) -> dict[str, float]:
    """Alarm figures against the labels: false alarms per 1,000 normal rows, event recall, AUC-PR."""
    from sklearn.metrics import average_precision_score

    label = rows["label"].to_numpy().astype(bool)
    alarm = rows["alarm"].to_numpy().astype(bool)
    event = rows["event_id"].to_numpy(dtype=float, na_value=-1)
    incidents = labelled_incidents(rows)
    found = [bool((event[at] >= 0).any()) for at in incidents]
    false_events = [e for e in range(len(events)) if not label[event == e].any()]
    metrics = {
        "normal_alarm_rate": float(alarm[~label].mean()) if (~label).any() else float("nan"),
        "false_alarms_per_1000": 1000.0 * float(alarm[~label].mean()) if (~label).any() else float("nan"),
        "event_recall": float(np.mean(found)) if found else float("nan"),
        "n_incidents": float(len(incidents)),
        "n_events": float(len(events)),
        "false_events": float(len(false_events)),
    }
    if label.any() and (~label).any():
        metrics["auc_pr"] = float(average_precision_score(label, rows["score"].to_numpy()))
    return metrics


# -- figures ----------------------------------------------------------------------------------------


def figures(rows: pd.DataFrame, scores: Scores, max_series: int = 4) -> dict[str, object]:
    """`plots/anomaly_scores.png` (score over time, threshold, event bands, labels) and
    `plots/anomaly_contributions.png` (channel-by-time heat map of contributions), per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(series_rows(rows).items())[:max_series]
    fig_s, axes_s = plt.subplots(len(groups), 1, figsize=(11, 2.4 * len(groups)), squeeze=False)
    fig_c, axes_c = plt.subplots(len(groups), 1, figsize=(11, 0.5 + 0.35 * len(scores.channels) * len(groups)),
                                 squeeze=False)  # fmt: skip
    for (sid, at), ax, axc in zip(groups, axes_s[:, 0], axes_c[:, 0], strict=True):
        x = np.arange(len(at))
        ax.plot(x, rows["score"].to_numpy()[at], lw=0.8, label="score")
        ax.axhline(rows["threshold"].iloc[0], color="k", ls="--", lw=0.8, label="threshold")
        event = rows["event_id"].to_numpy(dtype=float, na_value=-1)[at]
        for e in np.unique(event[event >= 0]):
            inside = np.flatnonzero(event == e)
            ax.axvspan(inside[0], inside[-1] + 1, color="orange", alpha=0.3, lw=0)
        if "label" in rows.columns:
            label = rows["label"].to_numpy()[at]
            ax.fill_between(x, 0, 1, where=label == 1, transform=ax.get_xaxis_transform(), color="red",
                            alpha=0.15, lw=0, label="labelled anomaly")  # fmt: skip
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_title(f"series {sid}: score (events orange)", fontsize=9)
        ax.legend(loc="upper left", fontsize=7)
        image = axc.imshow(np.log1p(scores.contributions[at].T), aspect="auto", interpolation="nearest",
                           cmap="magma")  # fmt: skip
        axc.set_yticks(range(len(scores.channels)), scores.channels, fontsize=7)
        axc.set_title(f"series {sid}: log(1 + contribution) per channel", fontsize=9)
        fig_c.colorbar(image, ax=axc)
    for fig in (fig_s, fig_c):
        fig.supxlabel("row of the judged table")
        fig.tight_layout()
    return {"plots/anomaly_scores.png": fig_s, "plots/anomaly_contributions.png": fig_c}
