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

import numpy as np

from tsformer.anomaly import EventRule, calibrate_threshold, fit_detector
from tsformer.anomaly.detector import DetectorSettings
from tsformer.anomaly.job import AnomalyModel, evaluate, labelled_incidents
from tsformer.anomaly.plant import CHANNELS, FAULTS, normal_split, simulate_plant_anomaly

RATE = 0.001


def one_seed(seed: int, method: str, settings: dict) -> dict:
    table = simulate_plant_anomaly(seed=seed)
    train, val, test = normal_split(table)
    start = time.perf_counter()
    detector = fit_detector(train, val, CHANNELS, method=method, seed=seed, **settings)
    fit_s = time.perf_counter() - start
    threshold = calibrate_threshold(detector.val_scores, RATE)
    model = AnomalyModel(detector, threshold, RATE, EventRule(), label_col="label")
    rows, events, scores = model.judge(test.reset_index(drop=True))
    metrics = evaluate(rows, events)
    n_normal = int((rows["label"] == 0).sum())
    alarms_normal = int(rows.loc[rows["label"] == 0, "alarm"].sum())
    print(
        f"seed {seed}: fit {fit_s:.0f} s, val loss {detector.val_loss:.4f}, threshold {threshold:.3g}; normal rows "
        f"{alarms_normal}/{n_normal} alarms = {alarms_normal / n_normal:.4f} (target {RATE}, binomial 2 sd "
        f"{RATE + 2 * np.sqrt(RATE * (1 - RATE) / n_normal):.4f}); events {len(events)}, of them false "
        f"{int(metrics['false_events'])}"
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
        print(f"  {fault:9s} events {len(hit)}  top channel {top[:1]}  right {ok}  peak/threshold {peak:.2f}")
    return {"normal_rate": alarms_normal / n_normal, "found": found, "right": right,
            "false_events": metrics["false_events"], "auc_pr": metrics["auc_pr"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--method", default="masked")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
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
    results = [one_seed(seed, args.method, settings) for seed in args.seeds]
    print(
        f"mean over seeds: faults found {np.mean([r['found'] for r in results]):.2f}/{len(FAULTS)}, top channel "
        f"right {np.mean([r['right'] for r in results]):.2f}/{len(FAULTS)}, normal alarm rate "
        f"{np.mean([r['normal_rate'] for r in results]):.4f}, false events "
        f"{np.mean([r['false_events'] for r in results]):.1f}, AUC-PR {np.mean([r['auc_pr'] for r in results]):.3f}"
    )


if __name__ == "__main__":
    main()
