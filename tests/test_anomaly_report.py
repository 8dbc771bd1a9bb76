"""What an engineer reads of a judged table (tsformer.jobs.anomaly.report): events, labelled incidents
found / late / missed with the delay, the normal rows' alarm rate beside its target, the figures."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tsformer.jobs.anomaly.report import duration_text, evaluate, incidents_table, report_lines, score_figures
from tsformer.tasks.anomaly import Scores, ranked_channels


def judged() -> tuple[pd.DataFrame, pd.DataFrame, Scores]:
    """100 one-minute rows of one series: incidents at 10-19 (an event from row 8: found), 40-59 (its
    event from row 45: late by 5 rows) and 80-82 (no event: missed); a one-row false event at row 70."""
    n = 100
    label = np.zeros(n, dtype=int)
    label[10:20] = label[40:60] = label[80:83] = 1
    event = np.full(n, -1)
    event[8:15], event[45:50], event[70] = 0, 1, 2
    score = np.where(event >= 0, 5.0, 0.5)
    score[81] = 0.8
    rows = pd.DataFrame(
        {"series_id": "pump", "time": pd.date_range("2024-01-01", periods=n, freq="min"), "score": score,
         "threshold": 1.0, "alarm": (event >= 0).astype(int),
         "event_id": pd.array(np.where(event >= 0, event, None), dtype="Int64"), "label": label}
    )  # fmt: skip
    events = pd.DataFrame(
        {"event_id": [0, 1, 2], "series_id": "pump", "start": rows["time"].iloc[[8, 45, 70]].to_numpy(),
         "end": rows["time"].iloc[[14, 49, 70]].to_numpy(), "n_rows": [7, 5, 1],
         "page_time": rows["time"].iloc[[10, 47, 70]].to_numpy(), "page_delay_rows": [2, 2, 0],
         "page_delay": ["2 min", "2 min", "0 s"], "peak_score": 5.0,
         "peak_time": rows["time"].iloc[[8, 45, 70]].to_numpy(), "top_channels": ["flow;pressure", "pressure", "flow"]}
    )  # fmt: skip
    contributions = np.c_[score * 0.75, score * 0.25]
    return rows, events, Scores(score, contributions, ["flow", "pressure"])


def test_each_incident_is_found_late_or_missed_with_its_delay():
    rows, events, _ = judged()
    table = incidents_table(rows, events)
    assert table["status"].tolist() == ["found", "late", "missed"]
    assert table["delay_rows"].tolist()[:2] == [0, 5] and table["delay"].iloc[1] == "5 min"
    # paged at rows 10 and 47: the first incident at its first row, the second 7 rows after it began
    assert table["page_delay_rows"].tolist()[:2] == [0, 7] and table["page_delay"].iloc[1] == "7 min"
    assert table["top_channels"].tolist() == ["flow;pressure", "pressure", ""]
    assert table["peak_over_threshold"].iloc[2] == 0.8
    metrics = evaluate(rows, events)
    assert (
        metrics["event_recall"] == 2 / 3
        and metrics["incidents_late"] == 1
        and metrics["mean_delay_rows"] == 2.5
    )
    assert metrics["false_events"] == 1 and metrics["normal_alarm_rate"] == 3 / 67  # rows 8, 9 and 70
    assert metrics["false_events_per_day"] == 1 / (100 / 1440)  # 100 one-minute rows judged
    assert metrics["median_delay_rows"] == 2.5 and metrics["median_page_delay_rows"] == 3.5


def test_delays_read_as_durations():
    assert duration_text(pd.Timedelta(minutes=89)) == "1 h 29 min"
    assert duration_text(pd.Timedelta(days=2, hours=3, minutes=4)) == "2 days 3 h"
    assert duration_text(pd.Timedelta(seconds=45)) == "45 s" and duration_text(pd.Timedelta(0)) == "0 s"


def test_the_report_lists_events_incidents_and_the_alarm_rate_beside_its_target():
    rows, events, _ = judged()
    lines = report_lines(rows, events, 0.001, ["valve"])
    text = "\n".join(lines)
    assert lines[0].startswith("anomaly: 100 rows judged, 13 alarms in 3 events (threshold 1:")
    assert lines[0].endswith("of the held-out normal rows score above it)")
    normal = report_lines(rows, events, 0.001, ["valve"], threshold_rows="normal")[0]
    assert normal.endswith("0.001 of the normal rows (the training rows too) score above it)")
    assert "state channels (0/1 in the train rows" in lines[1] and lines[1].endswith("valve")
    assert (
        "  #0 series pump: 2024-01-01 00:08:00 - 2024-01-01 00:14:00 (7 rows), paged 2 rows (2 min) after its "
        "first alarm, flow, pressure; peak 5x" in text
    )
    false = [line for line in lines if line.endswith(": FALSE EVENT (overlaps no labelled incident)")]
    assert len(false) == 1 and false[0].startswith("  #2 series pump: 2024-01-01 01:10:00")
    assert "labelled incidents: 3: 1 found, 1 late, 1 missed" in text
    assert (
        "2024-01-01 00:40:00 - 2024-01-01 00:59:00 (20 rows): late by 5 min (5 rows), event #1 (paged 7 rows "
        "(7 min) after its start)" in text
    )
    assert "(3 rows): missed (its peak score 0.8x the threshold)" in text
    assert lines[-2] == "normal rows alarmed: 3 of 67 = 0.0448 (target 0.001, model.false_alarm_rate)"
    assert (
        lines[-1]
        == "false events: 1 = 14.40 per day over 0.1 days judged; median detection delay 2.5 rows (2 min 30 s), "
        "to the page 3.5 rows (3 min 30 s)"
    )
    assert "loss" not in text
    unlabelled = report_lines(rows.drop(columns="label"), events, 0.001, [])
    assert unlabelled[-2] == "rows alarmed: 13 of 100 = 0.1300 (normal rows' target 0.001)"
    # 130 times the target: the table is unlike the rows the threshold came from, said in one line
    assert unlabelled[-1].startswith(
        "unlike the normal rows the threshold came from: 0.1300 of the rows alarmed against the target 0.001 "
        "(130x), a new asset or a changed sensor? Recalibrate"
    )
    recalibrated = report_lines(rows.drop(columns="label"), events, 0.001, [], recalibrated_on="0:50")
    assert "threshold recalibrated on the rows declared normal (normal_rows=0:50)" in recalibrated[2]
    assert recalibrated[-1].startswith("still unlike its declared normal rows: 0.1300")
    assert not any(line.startswith("unlike") for line in report_lines(rows, events, 0.01, []))  # 4.5x


def test_the_figures_put_time_on_x_name_the_events_and_keep_incidents_above_them():
    rows, _, scores = judged()
    fig = score_figures(rows, scores)["plots/anomaly_scores.png"]
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time" and ax.get_ylabel() == "anomaly score"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"score", "threshold", "event #0", "event #1", "event #2", "labelled incident"} <= set(legend)
    bands = {p.get_label(): p for p in ax.patches}
    incident, one_row = bands["labelled incident"], bands["event #2"]
    assert incident.get_zorder() > one_row.get_zorder()  # incidents drawn over the event bands
    x0, x1 = (one_row.get_x(), one_row.get_x() + one_row.get_width())
    assert x1 - x0 > 0  # the one-row event keeps a visible width
    import matplotlib.pyplot as plt

    plt.close("all")


def test_a_channel_adding_nothing_to_the_score_is_never_named_a_top_sensor():
    # a known input conditions the detector and is never scored: ranked after the two scored channels, it
    # used to fill the third place of every event's top sensors
    score = np.array([2.0, 1.0])
    contributions = np.array([[1.5, 0.5, 0.0], [0.0, 1.0, 0.0]])
    scores = Scores(score, contributions, ["flow", "pressure", "ambient_temperature"])
    assert scores.top_channels(3) == [["flow", "pressure", ""], ["pressure", "", ""]]
    assert ranked_channels(contributions.sum(axis=0), scores.channels, 3).tolist() == ["flow", "pressure", ""]
