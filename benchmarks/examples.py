"""The documents' worked examples, measured: one markdown table of test errors beside the baselines
(every forecasting run's persistence and linear forecaster among them), the linear baseline beside each
model (its MAE and the model's as a multiple of it), and for each model the baselines it loses to; a
model that loses to the linear baseline is named in a line under the table.

    python benchmarks/examples.py                       # every example whose data is found, 3 seeds
    python benchmarks/examples.py --only sensor_30_70   # one example
    python benchmarks/examples.py --quick               # tiny settings, one seed: checks the script runs

Every run is an ordinary `train.py` run (same configs, logged to MLflow in ./mlflow.db, experiment
"examples"); this script only composes the configs, repeats them over seeds and tabulates.

Examples:
- plant (`make train`: train.py's defaults, the encoder-decoder on the simulated plant), against
  persistence and the linear forecaster;
- gas_turbine (encoder-only state reconstruction on the UCI gas turbine, test year 2014), against
  per-row scikit-learn baselines (linear, gradient boosting, MLP);
- wind_scada (decoder-only wind power on T1, horizon 18), with the measured future wind and with a
  forecast error growing with lead time, against persistence and the manufacturer's power curve;
- sensor_30_70: the documents' claim that an encoder-decoder beats an encoder-only model whose outputs
  are mapped to 70 steps by a linear layer, and that autoregressive decoding keeps trajectories
  coherent. Encoder-decoder, encoder-only + forecast head and decoder-only are trained with the same
  parameter budget (within 10% of the encoder-decoder's, sizes found by search), the same data and
  the same training budget (epochs x batches, no early stopping), over the same seeds.

Coherence (sensor_30_70), computed on the test forecasts in original units, per window over its 70
steps and averaged: `diff_corr`, the correlation between the predicted and the actual step-to-step
changes (1: the forecast moves when and how the truth moves); `roughness`, the mean absolute
step-to-step change of the forecast divided by that of the truth (1: as wiggly as reality, < 1
smoother, > 1 jumpier). Persistence is flat: roughness 0, diff_corr undefined (nan).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from mlflow import MlflowClient
from omegaconf import open_dict

from tsformer.train import compose_config, run

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
QUICK = [
    "model.net.d_model=16",
    "model.net.n_layers=1",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=1",
    "data.eval_stride=50",
]
COMMON = [
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "logger.mlflow.experiment_name=examples",
]


def loses_to(metrics: list[dict], baselines: list[str]) -> list[str]:
    """The baselines (persistence `baseline`, the linear forecaster `linear`, ...) whose test MAE in
    original units, averaged over the seeds, is below the model's."""
    model = np.mean([m["test/mae_orig"] for m in metrics])
    return [b for b in baselines if np.mean([m[f"test/{b}_mae_orig"] for m in metrics]) < model]


def linear_figures(metrics: list[dict], linear: str) -> dict[str, str]:
    """The linear baseline (`test/<linear>_mae_orig`: the linear forecaster of every forecasting run, the
    per-row linear regression of reconstruction) beside the model, over the seeds: its MAE and the
    model's MAE as a multiple of it (> 1: the model loses to it)."""
    if f"test/{linear}_mae_orig" not in metrics[0]:
        return {"linear MAE (orig)": "not measured", "model / linear": ""}
    model = np.mean([m["test/mae_orig"] for m in metrics])
    lin = np.mean([m[f"test/{linear}_mae_orig"] for m in metrics])
    return {
        "linear MAE (orig)": mean_sd([m[f"test/{linear}_mae_orig"] for m in metrics]),
        "model / linear": f"{model / lin:.3f}",
    }


def loses_to_linear(who: str, row: dict, metrics: list[dict], baselines: list[str], spec: dict) -> list[str]:
    """One line where the model loses to the example's linear baseline, else none."""
    if spec.get("linear", "linear") not in loses_to(metrics, baselines):
        return []
    line = f"{who}: the Transformer loses to the linear baseline (mean test MAE in original units "
    return [line + f"{row['MAE (orig)']} against {row['linear MAE (orig)']})"]


def data_sizes(overrides: list[str]) -> dict[str, int]:
    """Channel counts of the data (the model's input/output sizes), read without simulating it."""
    cfg = compose_config(overrides, Path(tempfile.mkdtemp()))
    with open_dict(cfg):
        cfg.data.source = "unused"  # names and sizes come from the column lists alone
    dm = instantiate(cfg.data)
    return {"d_target": dm.d_target, "d_known": dm.d_known, "d_observed": dm.d_observed}


def count_params(overrides: list[str], sizes: dict[str, int]) -> int:
    cfg = compose_config(overrides, Path(tempfile.mkdtemp()))
    task = instantiate(cfg.model, _convert_="all", **sizes)
    return sum(p.numel() for p in task.net.parameters())


def match_budget(base: list[str], target: int, sizes: dict[str, int], tolerance: float = 0.10) -> list[str]:
    """The (d_model, n_layers) whose parameter count is closest to `target`; refuses beyond tolerance."""
    best = None
    for n_layers in (1, 2, 3, 4):
        for d_model in range(16, 257, 8):
            overrides = [*base, f"model.net.d_model={d_model}", f"model.net.n_layers={n_layers}"]
            n = count_params(overrides, sizes)
            if best is None or abs(n - target) < abs(best[0] - target):
                best = (n, overrides)
            if n > target * 1.5:
                break
    n, overrides = best
    if abs(n - target) > tolerance * target:
        raise RuntimeError(f"no size within {tolerance:.0%} of {target} parameters for {base} (closest {n})")
    return overrides


def coherence(forecasts: pd.DataFrame) -> dict[str, float]:
    """diff_corr and roughness (see the module docstring), averaged over windows and variables."""
    corrs, rough = [], []
    for _, w in forecasts.sort_values("step").groupby(["series_id", "origin_time", "variable"], sort=False):
        dp, dt = np.diff(w.y_pred.to_numpy()), np.diff(w.y_true.to_numpy())
        if dp.std() > 0 and dt.std() > 0:
            corrs.append(np.corrcoef(dp, dt)[0, 1])
        if np.abs(dt).mean() > 0:
            rough.append(np.abs(dp).mean() / np.abs(dt).mean())
    return {"diff_corr": float(np.mean(corrs)), "roughness": float(np.mean(rough))}


def persistence(forecasts: pd.DataFrame, overrides: list[str]) -> pd.DataFrame:
    """The naive baseline's forecasts in the layout of `forecasts`: each window's last observed value
    (at its origin_time, original units) repeated over the horizon."""
    dm = instantiate(compose_config(overrides, Path(tempfile.mkdtemp())).data)
    dm.setup()
    history = dm.frame.rename(columns={dm.schema.time_col: "origin_time"})
    history = (
        history.rename(columns={dm.schema.series_col: "series_id"})
        if dm.schema.series_col
        else history.assign(series_id=0)
    )
    last = history.melt(
        ["series_id", "origin_time"], list(dm.target_names), var_name="variable", value_name="last"
    )
    naive = forecasts.merge(
        last, on=["series_id", "origin_time", "variable"], how="left", validate="many_to_one"
    )
    return naive.assign(y_pred=naive.pop("last"))


def error_by_step(forecasts: pd.DataFrame, steps: list[int]) -> dict[str, float]:
    err = forecasts.y_pred - forecasts.y_true
    by_step = pd.DataFrame({"step": forecasts.step, "ae": err.abs(), "se": err**2}).groupby("step").mean()
    out = {}
    for s in steps:
        out[f"mae@{s}"] = float(by_step.ae.loc[s])
        out[f"rmse@{s}"] = float(np.sqrt(by_step.se.loc[s]))
    return out


def examples(quick: bool) -> dict[str, dict]:
    """name -> {requires: path or None, runs: {label: overrides}}; sizes matched where asked."""
    sensor = ["experiment=sensor_30_70", "~callbacks.early_stopping"]
    sensor_budget = (
        []
        if quick
        else ["trainer.max_epochs=6", "trainer.limit_train_batches=150", "trainer.limit_val_batches=6"]
    )
    sensor_runs = {
        "enc_dec": [*sensor, *sensor_budget],
        "enc_only_forecast": [*sensor, "model=enc_only_forecast", *sensor_budget],
        "dec_only": [*sensor, "model=dec_only", "model.context_len=30", "model.horizon=70", *sensor_budget],
    }
    return {
        "plant": {  # `make train`: train.py's defaults, the encoder-decoder on the simulated plant
            "requires": None,
            "runs": {"enc_dec (make train)": []},
        },
        "gas_turbine": {
            "requires": SHARED / "gas_turbine",
            "runs": {"enc_only": ["experiment=gas_turbine"]},
            # reconstruction's naive baseline is its linear one: the per-row linear regression
            "linear": "baseline",
        },
        "wind_scada": {
            "requires": SHARED / "wind_turbine_scada" / "T1.csv",
            "runs": {
                "dec_only, measured future wind": ["experiment=wind_scada"],
                "dec_only, forecast error": ["experiment=wind_scada_forecast_error"],
            },
        },
        "sensor_30_70": {
            "requires": None,
            "runs": sensor_runs,
            "match_params_to": "enc_dec",
            "coherence": True,
        },
    }


def mean_sd(values: list[float]) -> str:
    values = [v for v in values if v is not None and np.isfinite(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.4g}"
    return f"{np.mean(values):.4g} ± {np.std(values, ddof=1):.2g}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", help="example names to run")
    parser.add_argument("--runs", nargs="+", help="run labels to keep within the examples (e.g. enc_dec)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="tiny settings and one seed (a smoke run)")
    args = parser.parse_args()
    seeds = args.seeds[:1] if args.quick else args.seeds
    rows, step_rows, shown, remarks = [], [], set(), []
    out_root = Path(tempfile.mkdtemp(prefix="tsformer-examples-"))
    for name, spec in examples(args.quick).items():
        if args.only and name not in args.only:
            continue
        if spec["requires"] is not None and not Path(spec["requires"]).exists():
            print(f"skipping {name}: {spec['requires']} not found", file=sys.stderr)
            continue
        runs = {label: [*ov, *COMMON, *(QUICK if args.quick else [])] for label, ov in spec["runs"].items()}
        if "match_params_to" in spec and not args.quick:  # tiny models cannot match a flatten head's size
            reference = runs[spec["match_params_to"]]
            sizes = data_sizes(reference)
            target = count_params(reference, sizes)
            runs = {
                label: ov if ov is reference else match_budget(ov, target, sizes)
                for label, ov in runs.items()
            }
        for label, overrides in runs.items():
            if args.runs and label not in args.runs:
                continue
            results, logged = [], []
            for seed in seeds:
                out = out_root / name / label.replace(" ", "_").replace(",", "") / f"seed{seed}"
                cfg = compose_config([*overrides, f"seed={seed}"], out)
                results.append(run(cfg))
                logged.append(MlflowClient(cfg.logger.mlflow.tracking_uri).get_run(results[-1].run_id).data)
            metrics = [r.metrics for r in results]
            variables = sorted(
                k.removeprefix("test/mae_orig/") for k in metrics[0] if k.startswith("test/mae_orig/")
            )
            baselines = sorted(
                {
                    k.removeprefix("test/").removesuffix("_mae_orig")
                    for k in metrics[0]
                    if k.endswith("_mae_orig")
                }
                - {"mae_orig"}
            )
            # a baseline measured identically for several models (same windows, same inputs) is shown once
            key = {b: (name, b, round(metrics[0][f"test/{b}_mae_orig"], 6)) for b in baselines}
            new_baselines = [b for b in baselines if key[b] not in shown]
            shown.update(key.values())
            for who, prefix in [(label, "test/"), *[(f"  {b}", f"test/{b}_") for b in new_baselines]]:
                row = {
                    "example": name,
                    "model / baseline": who,
                    "MAE (orig)": mean_sd([m.get(f"{prefix}mae_orig") for m in metrics]),
                    "RMSE (orig)": mean_sd([m.get(f"{prefix}rmse_orig") for m in metrics]),
                }
                for var in variables:
                    row[f"MAE {var}"] = mean_sd([m.get(f"{prefix}mae_orig/{var}") for m in metrics])
                if who == label:
                    row["params"] = f"{int(logged[0].params['n_params']):,}"
                    row["train s"] = mean_sd([d.metrics["fit/seconds"] for d in logged])
                    row |= linear_figures(metrics, spec.get("linear", "linear"))
                    row["loses to (mean MAE orig)"] = ", ".join(loses_to(metrics, baselines)) or "none"
                    remarks += loses_to_linear(f"{name}, {label}", row, metrics, baselines, spec)
                rows.append(row)
            if spec.get("coherence"):
                per_seed = [
                    coherence(r.forecasts) | error_by_step(r.forecasts, [1, 10, 35, 70]) for r in results
                ]
                naive = persistence(results[0].forecasts, overrides)
                base = coherence(naive)
                step_rows.append(
                    {"model": label, **{k: mean_sd([p[k] for p in per_seed]) for k in per_seed[0]}}
                )
                if label == "enc_dec":
                    truth = {k: v for k, v in error_by_step(naive, [1, 10, 35, 70]).items()}
                    step_rows.append(
                        {"model": "  persistence", **{k: f"{v:.4g}" for k, v in (base | truth).items()}}
                    )

    print(
        f"\nseeds: {seeds}; every figure is a test-set figure measured in this run (mean ± sd over seeds)\n"
    )
    if rows:
        print(pd.DataFrame(rows).fillna("").to_markdown(index=False))
    print("\n".join(["", *remarks]))  # the models that lose to their linear baseline, one line each
    if step_rows:
        print("\nsensor_30_70 by horizon step (original units) and coherence:\n")
        print(pd.DataFrame(step_rows).to_markdown(index=False))


if __name__ == "__main__":
    main()
