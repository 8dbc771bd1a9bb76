"""The event rule's defaults (issue 49 point 5), chosen on normal rows only: the rule, then the choice.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_anomaly.py --seeds 0 1 2 --keep /tmp/plant_models
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_event_rule.py /tmp/plant_models

The selection rule, fixed before any candidate was counted:

- Rows: each seed's model (`experiment=plant_anomaly seed=S data.source.seed=S`, kept by
  `plant_anomaly.py --keep`) judges its own plant's normal period, the rows before `data.train_end`
  (every series' first 70 %: the training and the held-out validation rows), as predict.py judges a
  table, with the model's calibrated threshold. No judged row, no fault and no label is read (the script
  stops if a row it reads is labelled).
- Candidates: `min_duration` in 1, 2, 3, 5, 8 rows; `k` of `n` in 1/1, 2/3, 3/5, 4/8; `release` in 1.0,
  0.9, 0.7, 0.5; `merge_gap` (the cool-down) in 32, 64, 128 rows (one to four windows).
- The price of a rule, stated without faults: its page delay, the rows an alarm that stays on waits
  before it is paged, (k - 1) + (min_duration - 1); at most 5 rows (5 minutes of 1-minute rows), the
  operator's budget, fixed here. A longer cool-down may join two incidents into one page: at most four
  windows (128 rows).
- The choice: the fewest events on those normal rows (every one false) summed over the seeds; ties go to
  the smaller page delay, then the shorter cool-down, then the release nearer 1 (the least change),
  then the smaller min_duration. Each seed's model judges only its own plant.

`--drift`: the drifting threshold's setting for the far-from-faults attempt, chosen on the same normal
rows by a rule fixed before its count: `delay` 500 rows (the guard: longer than the plant's 400-row
drift fault) and `max_factor` 4 kept; `level` median or tail, `span` 100 or 300; the lowest alarm rate
on the normal-period rows summed over the seeds, ties to the median, then to span 300 (the default).

`--threshold-rows`: whether the threshold is read from the validation rows (the default) or from every
normal row (`model.threshold_rows=normal`, issue 49's third attempt at the plant's far-from-faults rate),
chosen on the same normal rows by a rule fixed before its count (commit before the measured plant run):

- A forward check, as the threshold is used (read from earlier rows, judging later ones): at each cut c
  of 1,400, 2,100 and 2,800 rows into every series' 3,500 normal rows, each seed's model's scores (the
  normal period scored whole, as above) give a threshold at the model's rate (0.001) from the rows
  before c of the plant's four series, `validation`: the last 20 % of them (rows 0.8c to c, as
  `data.val_fraction` holds out the last 20 %), `normal`: all of them (rows 0 to c); each judges the
  next 700 rows of every series (c to c + 700: the length of the validation stretch). No judged row,
  fault or label is read.
- The figure: the judged rows' alarm rate pooled over the 3 seeds and 3 cuts (25,200 rows), scored as
  its distance from the target, |log(((alarms + 0.5) / rows) / 0.001)|: too many alarms and too few
  (a threshold set so high that faint faults pass) both count.
- The choice: `normal` is preferred when its distance is smaller than `validation`'s; a tie keeps
  `validation`. It becomes `experiment=plant_anomaly`'s setting only if, beside that, the measured plant
  run (3 seeds) finds no fewer faults with it than without (a veto, never a choice between settings).

The tuning data's normal rows too (`--tuning DATA`; this part of the rule committed before its count):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_event_rule.py /tmp/plant_models --tuning ../shared/data/anomaly

- Sources: the plant's normal period (above) and the two tuning collections of benchmarks/anomaly.py,
  `msl_tuning` (TSB-AD's 2 MSL tuning files) and `skab_tuning` (SKAB's anomaly-free run cut into 8 runs,
  one plant fault injected in each). Never MSL-14 or SKAB-34.
- Models: each tuning file's detector trained as benchmarks/anomaly.py trains it (its `Detector`:
  `experiment=anomaly_benchmark seed=S`, the file's train rows, validation their last 20 %), seeds
  `--tuning-seeds` (0 1); it scores every row of its file, against its own calibrated threshold.
- Normal rows: these are tuning sets, so their labels may pick the normal rows: the rows labelled 0 whose
  every covering window holds no labelled row (more than `context_len` - 1 = 31 rows from any labelled
  row: no fault's window score reaches them), train and scored rows alike. Each maximal stretch of such
  rows is a series of its own (an event never spans an incident).
- The count: per source, events per 1,000 normal rows (events and rows summed over its seeds and
  series); a candidate's figure is the sum of the three sources' rates, so each source weighs the same
  whatever its length (a plant-day is no unit for SKAB's 1-second rows). The candidates, the page-delay
  budget (5 rows) and the tie-breaks are the plant's, above.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from tsformer.data.anomaly import series_rows
from tsformer.data.plant_anomaly import simulate_plant_anomaly
from tsformer.jobs.anomaly.judging import AnomalyModel
from tsformer.tasks.alarms import (
    DriftRule,
    EventRule,
    calibrate_threshold,
    drifting_threshold,
    events_of,
    true_runs,
)

MIN_DURATION = (1, 2, 3, 5, 8)
K_OF_N = ((1, 1), (2, 3), (3, 5), (4, 8))
RELEASE = (1.0, 0.9, 0.7, 0.5)
MERGE_GAP = (32, 64, 128)
PAGE_DELAY_BUDGET = 5  # rows
TRAIN_END = 0.7  # conf/data/plant_anomaly.yaml
MODEL_CONFIG = Path(__file__).resolve().parents[1] / "conf" / "model" / "enc_only_anomaly.yaml"


def page_delay(rule: EventRule) -> int:
    return (rule.k - 1) + (rule.min_duration - 1)


def normal_period(seed: int):
    """Every series' rows before `TRAIN_END` of the plant of `seed` (labels checked to be 0, then dropped)."""
    table = simulate_plant_anomaly(n_steps=5000, test_fraction=0.3, seed=seed)
    keep = np.concatenate([rows[: round(TRAIN_END * len(rows))] for rows in series_rows(table).values()])
    normal = table.iloc[np.sort(keep)].reset_index(drop=True)
    if normal["label"].any():
        raise SystemExit("a labelled row lies in the normal period: the rule reads normal rows only")
    return normal.drop(columns="label")


def drift_choice(seeds: list[int], over: dict) -> None:
    """The drifting threshold's level and span chosen on the normal rows (`over`: score over threshold;
    the validation rows' level read from the last 20 % of each series' normal rows, as judged here)."""
    counted = []
    for level, span in itertools.product(("median", "tail"), (100, 300)):
        rule = DriftRule(span=span, delay=500, max_factor=4.0, level=level)
        alarms = rows = 0
        for seed in seeds:
            val = float(rule.of(np.concatenate([o[round(0.8 * len(o)) :] for o in over[seed]])))
            for o in over[seed]:  # score / threshold: the drift factor scales the threshold of 1
                alarms += int((o > drifting_threshold(o, 1.0, val, rule)).sum())
                rows += len(o)
        counted.append((alarms / rows, level != "median", span != 300, rule))
        print(f"  {rule}: normal-period alarm rate {alarms / rows:.4f}")
    print(f"chosen: {min(counted, key=lambda c: c[:3])[-1]}")


CUTS = (1400, 2100, 2800)  # rows into every series' normal period: the forward checks' cuts
JUDGED_AFTER_CUT = 700  # rows judged after each cut: the validation stretch's length


def threshold_rows_choice(seeds: list[int], over: dict, rate: float = 0.001) -> None:
    """`model.threshold_rows` chosen on the normal rows by the forward check (the docstring's rule)."""
    counted = {"validation": [0, 0], "normal": [0, 0]}  # alarms, judged rows
    for seed, cut in itertools.product(seeds, CUTS):
        read = {"validation": np.concatenate([o[round(0.8 * cut) : cut] for o in over[seed]]),
                "normal": np.concatenate([o[:cut] for o in over[seed]])}  # fmt: skip
        judged = np.concatenate([o[cut : cut + JUDGED_AFTER_CUT] for o in over[seed]])
        line = []
        for rows, scores in read.items():
            alarms = int((judged > calibrate_threshold(scores, rate)).sum())
            counted[rows][0] += alarms
            counted[rows][1] += len(judged)
            line.append(f"{rows} {alarms}/{len(judged)}")
        print(f"  seed {seed}, cut {cut}: the next {JUDGED_AFTER_CUT} rows alarmed: {', '.join(line)}")
    distance = {}
    for rows, (alarms, n) in counted.items():
        distance[rows] = abs(np.log((alarms + 0.5) / n / rate))
        print(f"  {rows}: {alarms}/{n} = {alarms / n:.4f} (target {rate}), distance {distance[rows]:.3f}")
    print(f"chosen: {'normal' if distance['normal'] < distance['validation'] else 'validation'}")


def plant_normal(models: Path, seeds: list[int]) -> dict:
    """seed -> each series' score over threshold on its own plant's normal period, as judged."""
    over = {}
    for seed in seeds:
        model = AnomalyModel.load(models / f"seed{seed}")
        rows, events, _ = model.judge(normal_period(seed), "normal period")
        over[seed] = [(rows["score"].to_numpy() / rows["threshold"].to_numpy())[at]
                      for at in series_rows(rows).values()]  # fmt: skip
        val = np.concatenate([o[round(0.8 * len(o)) :] for o in over[seed]])
        print(f"seed {seed}: normal period {len(rows)} rows, alarm rate {float((rows['alarm'] > 0).mean()):.4f} "
              f"(the validation rows' {float((val > 1).mean()):.4f}), events under the model's rule {len(events)}")  # fmt: skip
    return over


def tuning_normal(data: Path, name: str, seeds: list[int]) -> list[np.ndarray]:
    """Score over threshold on each stretch of a tuning collection's normal rows (the docstring's rule),
    each file's detector trained as benchmarks/anomaly.py trains it."""
    import anomaly  # benchmarks/anomaly.py: its Detector, the recipe as the benchmark trains it

    stretches = []
    for run in anomaly.datasets.TUNING[name](data):
        for seed in seeds:
            detector = anomaly.Detector("masked", seed, [], val_fraction=0.2).fit_run(
                run.table, run.train_end
            )
            reach = int(detector.task.hparams["context_len"]) - 1  # a window's rows either side of a row
            near = np.convolve(run.label, np.ones(2 * reach + 1), mode="same") > 0
            over = np.asarray(detector.score(run.table).score, float) / float(detector.task.threshold)
            normal = [over[a:b] for a, b in true_runs(~near)]
            stretches += normal
            rows = sum(map(len, normal))
            print(f"{name} {run.name} seed {seed}: {rows} normal rows, alarm rate "
                  f"{sum(int((o > 1).sum()) for o in normal) / max(rows, 1):.4f}", flush=True)  # fmt: skip
    return stretches


def events(rule: EventRule, stretches: list[np.ndarray]) -> int:
    return sum(int(events_of(o > 1.0, rule, o).max()) + 1 for o in stretches)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", help="the folder of plant_anomaly.py --keep (seed<S> model folders)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--drift", action="store_true", help="choose the drifting threshold's level and span")
    parser.add_argument(
        "--threshold-rows", action="store_true", help="choose the rows the threshold is read from"
    )
    parser.add_argument("--tuning", type=Path, help="the anomaly data folder: msl_tuning, skab_tuning too")
    parser.add_argument("--tuning-seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    over = plant_normal(Path(args.models), args.seeds)
    if args.drift:
        drift_choice(args.seeds, over)
        return
    if args.threshold_rows:
        threshold_rows_choice(args.seeds, over)
        return
    sources = {"plant": [o for per in over.values() for o in per]}
    if args.tuning:
        if not args.tuning.is_dir():
            parser.exit(2, f"error: --tuning {args.tuning}: no such folder\n")
        for name in ("msl_tuning", "skab_tuning"):
            sources[name] = tuning_normal(args.tuning, name, args.tuning_seeds)
    per_1000 = {name: sum(map(len, s)) / 1000 for name, s in sources.items()}  # thousands of normal rows
    counted = []
    for md, (k, n), release, gap in itertools.product(MIN_DURATION, K_OF_N, RELEASE, MERGE_GAP):
        rule = EventRule(k=k, n=n, merge_gap=gap, min_duration=md, release=release)
        if page_delay(rule) > PAGE_DELAY_BUDGET:
            continue
        count = {name: events(rule, s) for name, s in sources.items()}
        figure = sum(count[name] / per_1000[name] for name in sources)
        counted.append((figure, page_delay(rule), gap, 1.0 - release, md, count, rule))
    counted.sort(key=lambda c: c[:5])
    print(f"{len(counted)} candidates within the page-delay budget; normal rows judged: "
          + ", ".join(f"{name} {1000 * k:.0f}" for name, k in per_1000.items())
          + f" ({1000 * per_1000['plant'] / 1440:.1f} plant-days)")  # fmt: skip

    def line(c) -> str:
        figure, delay, *_, count, rule = c
        return (f"events per 1,000 normal rows summed {figure:.3f} ("
                + ", ".join(f"{name} {n}" for name, n in count.items()) + f")  page delay {delay}  {rule}")  # fmt: skip

    for c in counted[:12]:
        print("  " + line(c))
    default = EventRule(**OmegaConf.load(MODEL_CONFIG).events)  # the masked detector's defaults now
    print(f"the current default: {line(next(c for c in counted if c[-1] == default))}")
    print(f"chosen: {counted[0][-1]}")


if __name__ == "__main__":
    main()
