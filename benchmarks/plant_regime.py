"""The plant demo generalises (issue 42): `experiment=plant_regime` trained on one simulated plant, scored on
NEW plants, as a user does with `tsformer-data simulate plant_regime --seed <k>` and predict.py.

    OMP_NUM_THREADS=1 python benchmarks/plant_regime.py                       # seeds 0, 1, 2; plants 1, 2, 3
    OMP_NUM_THREADS=1 python benchmarks/plant_regime.py --seeds 0 --plants 1 --set trainer.max_epochs=1

For each training seed s, one `train.run` of `experiment=plant_regime seed=s` (the training plant is the
config's, simulator seed 0; no logger); then for each new plant k (the table `tsformer-data simulate
plant_regime --seed k` writes: the same simulator settings, its own series, coefficients and regimes),
every window of every series is scored by
- the model folder (`Classifier.predict`, the calibrated probabilities: what predict.py writes);
- the majority class: the training windows' class shares as probabilities (what predict.py prints beside);
- the logistic regression on per-channel summaries (`tasks.classification.SummaryLogistic`, the run's own
  baseline) fitted on the run's training windows, scaled as the model scales them.
Printed: accuracy and log loss of each per (seed, plant), and the mean and the smallest margin of the
model over the two baselines across all pairs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from hydra.utils import instantiate

from tsformer.data.fetch import simulated_data_configs, simulator_settings
from tsformer.data.simulators import simulate_plant_regimes
from tsformer.jobs.classification.classifier import Classifier
from tsformer.tasks.classification import MajorityClass, SummaryLogistic, score
from tsformer.train import compose_config, run


def new_plant(seed: int):
    """The plant `tsformer-data simulate plant_regime --seed <seed>` writes (every column the simulator
    gives: the model reads the channels it was trained on)."""
    config = simulated_data_configs()["plant_regime"]
    return simulate_plant_regimes(**(simulator_settings(config) | {"seed": seed}))


def scores_on_plant(model: Classifier, baselines: list, table) -> dict[str, dict[str, float]]:
    """Accuracy and log loss on every window of `table` of the model and of the fitted `baselines`."""
    c = model.contract
    _, windows, labels, _ = model.stream_windows(table, "new plant", c.time_format)
    known = np.isin(labels.astype(str), model.classes)
    truth = np.array([model.classes.index(str(y)) for y in labels[known]])
    scaled = [
        c.channel_scaler.transform(w).astype(np.float32) for w, k in zip(windows, known, strict=True) if k
    ]
    x, valid = np.stack(scaled), np.ones((len(scaled), len(scaled[0])), dtype=bool)  # (S, N, D), (S, N)
    found = {"model": score(model.predict_proba(scaled), truth, len(model.classes))}
    for baseline in baselines:
        found[baseline.name] = score(baseline.predict_proba(x, valid), truth, len(model.classes))
    return found | {"n_windows": {"all": len(labels), "scored": int(known.sum())}}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0,1,2", help="training seeds")
    parser.add_argument("--plants", default="1,2,3", help="simulator seeds of the new plants")
    parser.add_argument("--set", nargs="*", default=[], help="Hydra overrides for every run")
    args = parser.parse_args()
    plants = {k: new_plant(k) for k in (int(p) for p in args.plants.split(","))}
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        overrides = [
            "experiment=plant_regime",
            f"seed={seed}",
            "logger=none",
            "forecasts_file=null",
            *args.set,
        ]
        overrides += ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]
        with tempfile.TemporaryDirectory() as tmp:
            cfg = compose_config(overrides, Path(tmp) / "out")
            start = time.perf_counter()
            result = run(cfg)
            seconds = time.perf_counter() - start
            model = Classifier.load(result.model_folder)
        datamodule = instantiate(
            cfg.data
        )  # the run's data again (the simulation is seeded): its train windows
        datamodule.setup()
        x, valid = datamodule.datasets["train"].padded()
        labels = datamodule.labels("train")
        baselines = [
            b.fit(x, valid, labels, datamodule.n_classes) for b in (MajorityClass(), SummaryLogistic())
        ]
        own = result.metrics
        print(
            f"seed {seed}: trained in {seconds:.0f} s; its own test windows: accuracy {own['test/accuracy']:.4f} "
            f"(logistic {own['test/logistic_accuracy']:.4f}, majority {own['test/baseline_accuracy']:.4f})",
            flush=True,
        )
        for plant, table in plants.items():
            found = scores_on_plant(model, baselines, table)
            rows.append({"seed": seed, "plant": plant, **found})
            print(
                f"  plant {plant}: accuracy {found['model']['accuracy']:.4f} (logistic "
                f"{found['logistic']['accuracy']:.4f}, majority {found['baseline']['accuracy']:.4f}), log loss "
                f"{found['model']['log_loss']:.4f} (logistic {found['logistic']['log_loss']:.4f}, majority "
                f"{found['baseline']['log_loss']:.4f}), {found['n_windows']['scored']} windows",
                flush=True,
            )
    print(f"\n`python benchmarks/plant_regime.py --seeds {args.seeds} --plants {args.plants}"
          + (f" --set {' '.join(args.set)}" if args.set else "") + "`\n")  # fmt: skip
    print(
        "| seed | new plant | windows | model accuracy | logistic | majority | model log loss | logistic | majority |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        m, lo, ma = r["model"], r["logistic"], r["baseline"]
        print(
            f"| {r['seed']} | {r['plant']} | {r['n_windows']['scored']} | {m['accuracy']:.4f} | {lo['accuracy']:.4f} | "
            f"{ma['accuracy']:.4f} | {m['log_loss']:.4f} | {lo['log_loss']:.4f} | {ma['log_loss']:.4f} |"
        )
    for who in ("logistic", "baseline"):
        acc = [r["model"]["accuracy"] - r[who]["accuracy"] for r in rows]
        loss = [r[who]["log_loss"] - r["model"]["log_loss"] for r in rows]
        name = "majority" if who == "baseline" else who
        print(
            f"\nmodel - {name}: accuracy {statistics.fmean(acc):+.4f} on average (smallest {min(acc):+.4f}); "
            f"log loss lower by {statistics.fmean(loss):+.4f} on average (smallest {min(loss):+.4f})"
        )


if __name__ == "__main__":
    main()
