"""Anomaly detection on the simulated plant with injected faults: the acceptance figures of
`experiment=plant_anomaly` per seed (docs/anomaly.md, benchmarks/RESULTS_anomaly.md).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_anomaly.py                      # masked, seeds 0 1 2
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_anomaly.py --method forecast --seeds 0
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_anomaly.py --set steps=30       # a quick check that it runs

Per seed (the detector's seed and the plant's, so the faults move too): the normal test rows' alarm
rate against the target, and per fault whether an event overlaps it, its top channel and whether that
is the faulty sensor (or the pair), the largest score inside the fault over the threshold.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from tsformer.anomaly import EventRule, calibrate_threshold, fit_detector
from tsformer.anomaly.detector import DetectorSettings
from tsformer.anomaly.job import AnomalyModel, evaluate, labelled_incidents
from tsformer.anomaly.plant import CHANNELS, FAULTS, normal_split, simulate_plant_anomaly

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


def alarm_rate(rows, where: np.ndarray) -> str:
    """`alarms/rows = rate (2-sd binomial upper end of the target on that many rows)` of the rows `where`."""
    n, alarms = int(where.sum()), int(rows.loc[where, "alarm"].sum())
    upper = RATE + 2 * np.sqrt(RATE * (1 - RATE) / n)
    return f"{alarms}/{n} = {alarms / n:.4f} (target {RATE}, 2 sd {upper:.4f})"


def one_seed(seed: int, method: str, settings: dict, dump: Path | None) -> dict:
    table = simulate_plant_anomaly(seed=seed)
    train, val, test = normal_split(table)
    start = time.perf_counter()
    detector = fit_detector(train, val, CHANNELS, method=method, seed=seed, **settings)
    fit_s = time.perf_counter() - start
    threshold = calibrate_threshold(detector.val_scores, RATE)
    model = AnomalyModel(detector, threshold, RATE, EventRule(), label_col="label")
    rows, events, scores = model.judge(test.reset_index(drop=True))
    metrics = evaluate(rows, events)
    normal = rows["label"].to_numpy() == 0
    far = normal & far_from_faults(rows, detector.settings.context_len)
    print(
        f"seed {seed}: fit {fit_s:.0f} s, val loss {detector.val_loss:.4f}, threshold {threshold:.3g}; alarms on "
        f"the normal rows {alarm_rate(rows, normal)}; on those more than a window "
        f"({detector.settings.context_len} rows) from every fault {alarm_rate(rows, far)}; events {len(events)}, "
        f"of them false {int(metrics['false_events'])}"
    )
    # does the validation rows' calibration hold on the far rows at a rate that 700 rows per series show?
    q99 = np.quantile(detector.val_scores, 0.99)
    print(
        f"  far normal rows above the validation rows' 99th percentile: {(scores.score[far] > q99).mean():.4f} "
        f"(0.01 if the validation rows are like them); alarmed far rows per series "
        f"{rows[far & (rows['alarm'] == 1)].groupby('series_id').size().to_dict()}"
    )
    if dump is not None:  # what the alarms' analysis needs, without training again
        np.savez_compressed(
            dump / f"plant_{method}_seed{seed}.npz", val_raw=detector.raw_errors(val),
            val_series=val["series_id"].astype(str).to_numpy(), test_raw=detector.raw_errors(test),
            test_series=test["series_id"].astype(str).to_numpy(), label=rows["label"].to_numpy(),
            error_scale=detector.error_scale, val_scores=detector.val_scores, test_score=scores.score,
            threshold=threshold, context_len=detector.settings.context_len,
        )  # fmt: skip
    event = rows["event_id"].to_numpy(dtype=float, na_value=-1)
    found, right = 0, 0
    for (fault, _, sensors), at in zip(FAULTS.values(), labelled_incidents(rows), strict=True):
        hit = np.unique(event[at][event[at] >= 0]).astype(int)
        top = events.loc[events["event_id"].isin(hit), "top_channels"].str.split(";").str[0].tolist()
        ok = bool(top) and all(t in sensors for t in top[:1])
        found += bool(len(hit))
        right += ok
        peak = scores.score[at].max() / threshold
        print(f"  {fault:9s} events {len(hit)}  top channel {top[:1]}  right {ok}  peak/threshold {peak:.2f}")
    return {"normal_rate": rows.loc[normal, "alarm"].mean(), "far_rate": rows.loc[far, "alarm"].mean(), "found": found, "right": right,
            "false_events": metrics["false_events"], "auc_pr": metrics["auc_pr"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--method", default="masked")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
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
    results = [one_seed(seed, args.method, settings, args.dump) for seed in args.seeds]
    print(
        f"mean over seeds: faults found {np.mean([r['found'] for r in results]):.2f}/{len(FAULTS)}, top channel "
        f"right {np.mean([r['right'] for r in results]):.2f}/{len(FAULTS)}, normal rows' alarm rate "
        f"{np.mean([r['normal_rate'] for r in results]):.4f} (far from faults "
        f"{np.mean([r['far_rate'] for r in results]):.4f}), false events "
        f"{np.mean([r['false_events'] for r in results]):.1f}, AUC-PR {np.mean([r['auc_pr'] for r in results]):.3f}"
    )


if __name__ == "__main__":
    main()
