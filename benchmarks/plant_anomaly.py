"""Anomaly detection on the simulated plant with injected faults: the acceptance figures of
`experiment=plant_anomaly` per seed (docs/anomaly.md, benchmarks/RESULTS_anomaly.md).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_anomaly.py                      # masked, seeds 0 1 2
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_anomaly.py --method forecast --seeds 0
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_anomaly.py --set steps=30       # a quick check that it runs
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_anomaly.py --confidence 0.9     # and the threshold's bound

Per seed (the detector's seed and the plant's, so the faults move too) and threshold: the normal test
rows' alarm rate against the target, on all of them and on those more than a window from every fault
(a window covering a fault raises the errors of the normal rows beside it), and per fault whether an
event overlaps it, its top channel and whether that is the faulty sensor (or the pair), the largest
score inside the fault over the threshold. The threshold is the job's (`calibrate_threshold`: the
validation scores' Pareto tail) and, with `--confidence`, its upper bound over a moving-block
bootstrap of the validation scores, blocks of one window. `--dump` keeps each seed's raw errors.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from tsformer.data.plant_anomaly import CHANNELS, FAULTS, normal_split, simulate_plant_anomaly
from tsformer.jobs.anomaly.detector import DetectorSettings, fit_detector
from tsformer.jobs.anomaly.judging import AnomalyModel, evaluate, labelled_incidents
from tsformer.tasks.alarms import EventRule, calibrate_threshold

RATE = 0.001


def far_from_faults(rows, reach: int) -> np.ndarray:
    """Rows more than `reach` rows from every labelled row of their series (a window covering a fault
    raises the errors of the rows beside it; these rows are out of its reach)."""
    far = np.ones(len(rows), dtype=bool)
    for at in labelled_incidents(rows):
        series = rows["series_id"].to_numpy() == rows["series_id"].iloc[at[0]]
        position = np.arange(len(rows))
        far &= ~(series & (position >= at[0] - reach) & (position <= at[-1] + reach))
    return far


def at_table_edges(rows, reach: int) -> np.ndarray:
    """Rows within `reach` rows of their series' first or last row in the table: covered by fewer
    windows than the rest, and at a window's end."""
    edge = np.zeros(len(rows), dtype=bool)
    for at in rows.groupby("series_id", sort=False).indices.values():
        edge[at[:reach]] = edge[at[-reach:]] = True
    return edge


def alarm_rate(rows, where: np.ndarray) -> str:
    """`alarms/rows = rate (2-sd binomial upper end of the target on that many rows)` of the rows `where`."""
    n, alarms = int(where.sum()), int(rows.loc[where, "alarm"].sum())
    upper = RATE + 2 * np.sqrt(RATE * (1 - RATE) / n)
    return f"{alarms}/{n} = {alarms / n:.4f} (target {RATE}, 2 sd {upper:.4f})"


class ScoredOnce:
    """The detector's scores of a table computed once, whatever threshold judges them."""

    def __init__(self, detector):
        self.detector, self.cache = detector, {}

    def score(self, table, source: str = "table"):
        if id(table) not in self.cache:
            self.cache[id(table)] = self.detector.score(table, source)
        return self.cache[id(table)]


def thresholds(val_scores: np.ndarray, confidence: float | None, block: int) -> dict[str, float]:
    """name -> threshold: the tail estimate (the job's calibration) and, with `confidence`, its upper
    bound over a block bootstrap of the validation scores (blocks of one window)."""
    out = {"estimate": calibrate_threshold(val_scores, RATE)}
    if confidence is not None:
        out[f"upper {confidence:.0%} bound"] = calibrate_threshold(val_scores, RATE, confidence, block=block)
    return out


def judged(scored: ScoredOnce, test, threshold: float, reach: int, name: str) -> dict:
    """The acceptance figures of one threshold on the test rows, printed."""
    model = AnomalyModel(scored, threshold, RATE, EventRule(), label_col="label")
    rows, events, scores = model.judge(test)
    metrics = evaluate(rows, events)
    normal = rows["label"].to_numpy() == 0
    far = normal & far_from_faults(rows, reach)
    far_alarms = far & (rows["alarm"].to_numpy() == 1)
    print(
        f"  threshold ({name}) {threshold:.3g}: alarms on the normal rows {alarm_rate(rows, normal)}; on those "
        f"more than a window ({reach} rows) from every fault {alarm_rate(rows, far)}, of them "
        f"{int((far_alarms & at_table_edges(rows, reach)).sum())} within a window of the table's first or last "
        f"row; events {len(events)}, of them false {int(metrics['false_events'])}; alarmed far rows per series "
        f"{rows[far_alarms].groupby('series_id').size().to_dict()}"
    )
    event = rows["event_id"].to_numpy(dtype=float, na_value=-1)
    found, right = 0, 0
    for (fault, _, sensors), at in zip(FAULTS.values(), labelled_incidents(rows), strict=True):
        hit = np.unique(event[at][event[at] >= 0]).astype(int)
        top = events.loc[events["event_id"].isin(hit), "top_channels"].str.split(";").str[0].tolist()
        ok = bool(top) and all(t in sensors for t in top[:1])
        found += bool(len(hit))
        right += ok
        peak = scores.score[at].max() / threshold
        print(
            f"    {fault:9s} events {len(hit)}  top channel {top[:1]}  right {ok}  peak/threshold {peak:.2f}"
        )
    return {"normal_rate": rows.loc[normal, "alarm"].mean(), "far_rate": rows.loc[far, "alarm"].mean(), "found": found, "right": right,
            "false_events": metrics["false_events"], "auc_pr": metrics["auc_pr"]}  # fmt: skip


def one_seed(seed: int, method: str, settings: dict, confidence: float | None, dump: Path | None) -> dict:
    """name of the threshold -> its figures on one seed's plant."""
    table = simulate_plant_anomaly(seed=seed)
    train, val, test = normal_split(table)
    test = test.reset_index(drop=True)
    start = time.perf_counter()
    detector = fit_detector(train, val, CHANNELS, method=method, seed=seed, **settings)
    fit_s = time.perf_counter() - start
    reach = detector.window
    scored = ScoredOnce(detector)
    scores = scored.score(test)
    # does the validation rows' calibration hold on the normal test rows at a rate that they show well?
    far = (test["label"].to_numpy() == 0) & far_from_faults(test, reach)
    q99 = np.quantile(detector.val_scores, 0.99)
    print(
        f"seed {seed}: fit {fit_s:.0f} s, val loss {detector.val_loss:.4f}; normal rows more than a window from "
        f"every fault above the validation rows' 99th percentile: {(scores.score[far] > q99).mean():.4f} "
        "(0.01 if they are like the validation rows)"
    )
    out = {
        name: judged(scored, test, threshold, reach, name)
        for name, threshold in thresholds(detector.val_scores, confidence, reach).items()
    }
    if dump is not None:  # what the alarms' analysis needs, without training again
        np.savez_compressed(
            dump / f"plant_{method}_seed{seed}.npz", val_raw=detector.raw_errors(val),
            val_series=val["series_id"].astype(str).to_numpy(), test_raw=detector.raw_errors(test),
            test_series=test["series_id"].astype(str).to_numpy(), label=test["label"].to_numpy(),
            error_scale=detector.error_scale.cpu().numpy(), val_scores=detector.val_scores, test_score=scores.score,
            context_len=reach,
        )  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--method", default="masked")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--confidence",
        type=float,
        help="also judge with the upper CONFIDENCE bound of the threshold (a block bootstrap of the validation scores)",
    )
    parser.add_argument("--dump", type=Path, help="a folder for each seed's raw errors and scores (.npz)")
    parser.add_argument(
        "--set", nargs="*", default=[], help="detector settings, e.g. steps=3000 context_len=96"
    )
    args = parser.parse_args()
    defaults = DetectorSettings()
    settings = {}
    for item in args.set:  # key=value, typed like the default
        key, value = item.split("=", 1)
        kind = type(getattr(defaults, key))
        settings[key] = value == "true" if kind is bool else kind(value)
    print(f"method {args.method}, settings {settings or 'defaults'}, false-alarm rate {RATE}")
    results = [one_seed(seed, args.method, settings, args.confidence, args.dump) for seed in args.seeds]
    for name in results[0]:
        r = [seed[name] for seed in results]
        print(
            f"mean over seeds, threshold ({name}): faults found {np.mean([x['found'] for x in r]):.2f}/{len(FAULTS)}, "
            f"top channel right {np.mean([x['right'] for x in r]):.2f}/{len(FAULTS)}, normal rows' alarm rate "
            f"{np.mean([x['normal_rate'] for x in r]):.4f} (more than a window from every fault "
            f"{np.mean([x['far_rate'] for x in r]):.4f}), false events {np.mean([x['false_events'] for x in r]):.1f}, "
            f"AUC-PR {np.mean([x['auc_pr'] for x in r]):.3f}"
        )


if __name__ == "__main__":
    main()
