"""Anomaly detection on the simulated plant with injected faults: the acceptance figures of
`experiment=plant_anomaly` per seed (docs/anomaly.md, benchmarks/RESULTS_anomaly.md).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_anomaly.py                      # seeds 0 1 2
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_anomaly.py --set model.score=memory --seeds 0
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plant_anomaly.py --set model=dec_only_anomaly

Each seed runs `python train.py experiment=plant_anomaly seed=S data.source.seed=S` (and the `--set`
overrides) as the application runs it (`train.run`: the job's training, calibration, judging and
summary; no MLflow run), so the plant, its faults and the detector all move with the seed. Per seed:
the normal judged rows' alarm rate against the target (`model.false_alarm_rate`), on all of them and
on those more than a window from every fault (a window covering a fault raises the scores of the
normal rows beside it), and per fault whether an event overlaps it, its top channel and whether that
is the faulty sensor (or one of the pair), its detection delay, and the fault's largest score over the
threshold; the false events per plant-day (days of judged rows, summed over the plants) and the median
delay beside the row rates.

`--judge-models DIR` trains nothing: each seed's kept model folder (`--keep DIR` of an earlier run)
judges the seed's rows again as the job would with the `--set` overrides (what changes only how a
table is judged, `data.judge_context`, on the same networks).

`--new-plant A:B` also judges the README's new plant (`tsformer-data simulate plant_anomaly --seed 1`:
every row of its table, as predict.py judges it) with each seed's model folder, as it is and recalibrated
on rows A:B of each of its series declared normal (`predict.py --normal-rows A:B`).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate

from tsformer.data.anomaly import series_rows
from tsformer.data.plant_anomaly import FAULTS, simulate_plant_anomaly
from tsformer.jobs.anomaly.job import JOB, judge_context, normal_stretch, recalibrated
from tsformer.jobs.anomaly.judging import AnomalyModel
from tsformer.jobs.anomaly.report import (
    evaluate,
    incidents_table,
    labelled_incidents,
    plant_days,
    report_lines,
)
from tsformer.tasks.alarms import DriftRule, EventRule, drifting_threshold, event_spans
from tsformer.train import compose_config, run


def far_from_faults(rows, reach: int) -> np.ndarray:
    """Rows more than `reach` rows from every labelled row of their series (a window covering a fault
    raises the scores of the rows beside it; these rows are out of its reach)."""
    far = np.ones(len(rows), dtype=bool)
    for at in labelled_incidents(rows):
        series = rows["series_id"].to_numpy() == rows["series_id"].iloc[at[0]]
        position = np.arange(len(rows))
        far &= ~(series & (position >= at[0] - reach) & (position <= at[-1] + reach))
    return far


def alarm_rate(rows, where: np.ndarray, rate: float) -> str:
    """`alarms/rows = rate (2-sd binomial upper end of the target on that many rows)` of the rows `where`."""
    n, alarms = int(where.sum()), int(rows.loc[where, "alarm"].sum())
    upper = rate + 2 * np.sqrt(rate * (1 - rate) / n)
    return f"{alarms}/{n} = {alarms / n:.4f} (target {rate}, 2 sd {upper:.4f})"


def under_rule(rows, rule: EventRule, threshold: np.ndarray | None = None, from_page: bool = False) -> dict:
    """False events, faults found and the normal rows' alarm rates of `rows`' scores grouped by another
    event `rule` (and with another `threshold (T,)`): the same scores, what the rule alone changes.
    `from_page`: each event from its page, as events started before issue 57 (not from its first alarm)."""
    threshold = rows["threshold"].to_numpy() if threshold is None else threshold
    over = rows["score"].to_numpy() / threshold
    event, pages = np.full(len(rows), -1), []
    for at in series_rows(rows).values():
        for span in event_spans(over[at] > 1.0, rule, over[at]):
            start = span.page if from_page else span.start
            event[at[start : span.end]] = len(pages)
            pages.append(span.page - start)
    regrouped = rows.assign(event_id=pd.array(np.where(event >= 0, event, None), dtype="Int64"),
                            alarm=(over > 1.0).astype(int))  # fmt: skip
    events = pd.DataFrame({"event_id": range(len(pages)), "page_delay_rows": pages, "top_channels": ""})
    metrics = evaluate(regrouped, events)
    normal = rows["label"].to_numpy() == 0
    far = normal & far_from_faults(rows, 32)
    return {"false_events": metrics["false_events"], "found": metrics["event_recall"] * metrics["n_incidents"],
            "normal_rate": float((over > 1.0)[normal].mean()), "far_rate": float((over > 1.0)[far].mean())}  # fmt: skip


def drift_thresholds(rows, model: AnomalyModel, rule: DriftRule | None) -> np.ndarray:
    """`(T,)` the thresholds `model.threshold_drift=rule` gives `rows`' scores (the same run's scores);
    `rule` None: the one calibrated threshold."""
    out = np.full(len(rows), model.threshold)
    if rule is None:
        return out
    level = model.detector.hparams[f"val_score_{rule.level}"]
    for at in series_rows(rows).values():
        out[at] = drifting_threshold(rows["score"].to_numpy()[at], model.threshold, level, rule)
    return out


def other_threshold(cfg) -> tuple[DriftRule | None, str]:
    """The threshold the same scores are judged with beside the run's: the drifting one (its default
    rule) when the run has one threshold, the one calibrated threshold when the run's drifts."""
    if cfg.model.get("threshold_drift"):
        return None, "one threshold (no drift)"
    return DriftRule(), f"model.threshold_drift={DriftRule()}"


def judged(rows, events, rate: float, reach: int, rule: EventRule) -> dict:
    """The acceptance figures of one run's judged rows (events by `rule`), printed."""
    metrics = evaluate(rows, events)
    normal = rows["label"].to_numpy() == 0
    far = normal & far_from_faults(rows, reach)
    threshold = float(rows["threshold"].iloc[0])
    days = plant_days(rows)
    print(
        f"  threshold {threshold:.3g}: alarms on the normal rows {alarm_rate(rows, normal, rate)}; on those more "
        f"than a window ({reach} rows) from every fault {alarm_rate(rows, far, rate)}; events {len(events)}, of "
        f"them false {int(metrics['false_events'])} in {days:.1f} plant-days"
    )
    event = rows["event_id"].to_numpy(dtype=float, na_value=-1)
    found, right = 0, 0
    delays = incidents_table(rows, events)
    for (fault, _, sensors), at, delay in zip(FAULTS.values(), labelled_incidents(rows), delays.itertuples(),
                                              strict=True):  # fmt: skip
        hit = np.unique(event[at][event[at] >= 0]).astype(int)
        top = events.loc[events["event_id"].isin(hit), "top_channels"].str.split(";").str[0].tolist()
        ok = bool(top) and top[0] in sensors
        found += bool(len(hit))
        right += ok
        peak = rows["score"].to_numpy()[at].max() / threshold
        late = f"late by {delay.delay} ({delay.delay_rows} rows)" if delay.status == "late" else delay.status
        paged = f"  paged {delay.page_delay_rows} rows after its start" if len(hit) else ""
        print(
            f"    {fault:9s} events {len(hit)}  top channel {top[:1]}  right {ok}  {late}{paged}  "
            f"peak/threshold {peak:.2f}"
        )
    old = under_rule(rows, EventRule(merge_gap=10))
    print(f"  under issue 41's event rule (merge_gap 10, the same alarms): false events {old['false_events']:.0f}, "
          f"faults found {old['found']:.0f}")  # fmt: skip
    at_page = under_rule(rows, rule, from_page=True)
    print(f"  events from their page, as before issue 57 (the same alarms and rule): false events "
          f"{at_page['false_events']:.0f}, faults found {at_page['found']:.0f}")  # fmt: skip
    return {"normal_rate": float(rows.loc[normal, "alarm"].mean()), "far_rate": float(rows.loc[far, "alarm"].mean()),
            "old_rule_false_events": old["false_events"],
            "found": found, "right": right, "false_events": metrics["false_events"], "days": days,
            "at_page_false_events": at_page["false_events"], "at_page_found": at_page["found"],
            "delays": [d for d in delays["delay_rows"] if d is not pd.NA],
            "page_delays": [d for d in delays["page_delay_rows"] if d is not pd.NA], "auc_pr": metrics["auc_pr"]}  # fmt: skip


def judged_again(cfg, folder: Path) -> tuple:
    """(rows, events) of the seed's judged rows as `cfg`'s job judges them, by the model folder `folder`
    kept from an earlier run of the same seed (no training: what changes only how a table is judged,
    `data.judge_context`, measured on the same networks)."""
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    model = AnomalyModel.load(folder)
    rows, events, _ = model.judge(datamodule.tables["test"], "judged rows", context=judge_context(datamodule))
    return rows, events, model


def one_seed(seed: int, overrides: list[str], new_plant: str | None, keep: str | None = None,
             models: str | None = None) -> dict:  # fmt: skip
    """The figures of one seed's run of `experiment=plant_anomaly` (and of the new plant judged by its model);
    with `models`, of its kept model folder `models/seed<S>` judging the seed's rows again (no training)."""
    with tempfile.TemporaryDirectory() as folder:
        cfg = compose_config(["experiment=plant_anomaly", "logger=none", f"seed={seed}", f"data.source.seed={seed}",
                              "trainer.enable_progress_bar=false", *overrides], folder)  # fmt: skip
        start = time.perf_counter()
        if models:
            rows, events, model = judged_again(cfg, Path(models) / f"seed{seed}")
        else:
            result = run(cfg)
            model = AnomalyModel.load(result.model_folder)
            rows, events = result.forecasts, result.outputs.details["events"]
        seconds = time.perf_counter() - start
        if keep and not models:  # the model folder kept for later work (benchmarks/plant_event_rule.py)
            shutil.copytree(result.model_folder, Path(keep) / f"seed{seed}", dirs_exist_ok=True)
    print(f"seed {seed}: {'judge' if models else 'train, calibrate and judge'} {seconds:.0f} s")
    reach = int(cfg.model.context_len)
    figures = judged(rows, events, float(cfg.model.false_alarm_rate), reach, model.rule)
    other, other_name = other_threshold(cfg)  # the same scores with the other threshold
    drift = under_rule(rows, EventRule(**model.detector.event_rule), drift_thresholds(rows, model, other))
    print(f"  with {other_name} (the same scores): normal rows' alarm rate "
          f"{drift['normal_rate']:.4f}, far from faults {drift['far_rate']:.4f}, false events "
          f"{drift['false_events']:.0f}, faults found {drift['found']:.0f}")  # fmt: skip
    figures |= {f"drift_{k}": v for k, v in drift.items()}
    if new_plant:
        table = simulate_plant_anomaly(
            **{k: v for k, v in cfg.data.source.items() if k != "_target_"} | {"seed": 1}
        )
        for stretch in ("", new_plant):
            params = {"time_format": "", "normal_rows": stretch}
            answered = JOB.prediction.answer(model, table, params, "new plant")  # what predict.py does
            print(
                f"  the README's new plant (seed 1), {'recalibrated on rows ' + stretch if stretch else 'as it is'}:"
            )
            lines = report_lines(answered, answered.attrs["beside"]["events"], model.false_alarm_rate, [],
                                 recalibrated_on=stretch or None)  # fmt: skip
            print(
                "\n".join(
                    "    " + line for line in lines if line.startswith(("normal rows", "unlike", "false"))
                )
            )
            which = "recalibrated" if stretch else "as_is"
            figures[f"new_plant_{which}"] = judged(
                answered,
                answered.attrs["beside"]["events"],
                float(cfg.model.false_alarm_rate),
                reach,
                model.rule,
            )
            judge = (
                recalibrated(model, table.iloc[normal_stretch(table, stretch, "time", "")])
                if stretch
                else model
            )
            drift = under_rule(
                answered,
                EventRule(**model.detector.event_rule),
                drift_thresholds(answered, judge, other),
            )
            print(f"    with {other_name} (the same scores): normal rows' alarm rate {drift['normal_rate']:.4f}, "
                  f"false events {drift['false_events']:.0f}, faults found {drift['found']:.0f}")  # fmt: skip
            figures[f"new_plant_{which}"] |= {f"drift_{k}": v for k, v in drift.items()}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", nargs="*", default=[], help="Hydra overrides, e.g. model.score=memory")
    parser.add_argument(
        "--new-plant", metavar="A:B", help="also judge the README's new plant, recalibrated on rows A:B"
    )
    parser.add_argument("--keep", metavar="DIR", help="copy each seed's model folder to DIR/seed<S>")
    parser.add_argument(
        "--judge-models",
        metavar="DIR",
        help="no training: judge each seed's rows with DIR/seed<S> (a --keep folder)",
    )
    args = parser.parse_args()
    results = [one_seed(seed, args.set, args.new_plant, args.keep, args.judge_models) for seed in args.seeds]
    scalar = [k for k, v in results[0].items() if isinstance(v, int | float | np.floating)]
    mean = {k: np.mean([r[k] for r in results]) for k in scalar}
    delays = [d for r in results for d in r["delays"]]
    pages = [d for r in results for d in r["page_delays"]]
    days = sum(r["days"] for r in results)
    false = sum(r["false_events"] for r in results)
    print(
        f"overrides {args.set or 'none'}; sum over seeds: faults found {sum(r['found'] for r in results)}/"
        f"{len(FAULTS) * len(results)}, top channel right {sum(r['right'] for r in results)}/"
        f"{len(FAULTS) * len(results)}; mean over seeds: normal rows' alarm rate {mean['normal_rate']:.4f} (more "
        f"than a window from every fault {mean['far_rate']:.4f}), false events {mean['false_events']:.1f}, "
        f"AUC-PR {mean['auc_pr']:.3f}; false events {false:.0f} in {days:.1f} plant-days = {false / days:.2f} per "
        f"plant-day; median detection delay {np.median(delays) if delays else float('nan'):g} rows (1-minute rows), "
        f"to the page {np.median(pages) if pages else float('nan'):g} rows; "
        f"under issue 41's event rule (merge_gap 10) false events {sum(r['old_rule_false_events'] for r in results):.0f}; "
        f"events from their page (before issue 57): false events {sum(r['at_page_false_events'] for r in results):.0f}, "
        f"faults found {sum(r['at_page_found'] for r in results):.0f}"
    )
    if "drift_normal_rate" in results[0]:
        print(
            f"with {other_threshold(compose_config(['experiment=plant_anomaly', *args.set], tempfile.gettempdir()))[1]} "
            f"(the same scores): normal rows' alarm rate {mean['drift_normal_rate']:.4f} "
            f"(far from faults {mean['drift_far_rate']:.4f}), false events "
            f"{sum(r['drift_false_events'] for r in results):.0f}, faults found {sum(r['drift_found'] for r in results):.0f}"
        )
    for which in ("as_is", "recalibrated"):
        key = f"new_plant_{which}"
        if key in results[0]:
            new = [r[key] for r in results]
            print(
                f"the new plant, {which}: normal rows' alarm rate "
                + " / ".join(f"{n['normal_rate']:.4f}" for n in new)
                + f" (seeds {' '.join(map(str, args.seeds))}); faults found {sum(n['found'] for n in new)}/"
                f"{len(FAULTS) * len(new)}; false events {sum(n['false_events'] for n in new):.0f}; with the other "
                "threshold: "
                + " / ".join(f"{n['drift_normal_rate']:.4f}" for n in new)
                + f", faults found {sum(n['drift_found'] for n in new):.0f}, false events "
                f"{sum(n['drift_false_events'] for n in new):.0f}"
            )


if __name__ == "__main__":
    main()
