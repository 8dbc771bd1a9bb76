"""Forecasting (model=enc_dec, dec_only, enc_only_forecast, patchtst, linear): the windows' sizes, the forecasts
CSV (original units) and sampled paths, the model folder checked by a round trip, the figures and each
test window's error in MLflow, the metric table, and predict.py's forecasts of a new table.

Reconstruction (`jobs/reconstruction.py`) and masked fill-in (`jobs/imputation.py`) run on the same
windows and write the same files: they reuse these functions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from tsformer import tracking
from tsformer.data.datamodule import TimeSeriesDataModule
from tsformer.data.fetch import simulate_command
from tsformer.jobs.base import (
    ORIGIN,
    TIME_FORMAT,
    Prediction,
    RunOutputs,
    csv_file,
    job_of_module,
    made_by,
    metric_table,
    predict_usage,
)
from tsformer.jobs.forecasting.export import (
    SplitView,
    forecasts_frame,
    mae_by_step,
    paths_frame,
    select_levels,
)
from tsformer.jobs.forecasting.forecaster import (
    FOLDER,
    Forecaster,
    ModelInfo,
    example_table,
    save_model_folder,
)
from tsformer.jobs.forecasting.plots import (
    attention_figure,
    error_by_step_figure,
    fan_chart_figure,
    forecast_windows_figure,
)
from tsformer.jobs.forecasting.streaming import answer_stream
from tsformer.serving.writers import write_csv, write_json, write_parquet
from tsformer.settings import SettingError
from tsformer.tasks.forecasting import (
    DecoderOnlyForecaster,
    EncoderDecoderForecaster,
    EncoderForecaster,
    LinearForecaster,
)
from tsformer.tasks.probabilistic import BAND_LEVELS

FORECASTS_FILE = "forecasts.csv"  # the run's CSV of the test windows' forecasts (`forecasts_file`'s default)
WINDOW_MSE = "test/window_mse.csv"  # artifact: each test window's MSE (scaled units), in window order
DATA = "a forecasting or reconstruction data config (data=plant, csv, ett, ...) with a model such as enc_dec"


def task_sizes(datamodule) -> dict:
    """What a window task takes from its data."""
    return {
        "d_target": datamodule.d_target,
        "d_known": datamodule.d_known,
        "d_observed": datamodule.d_observed,
        "d_static_num": datamodule.d_static_num,
        "static_vocab_sizes": datamodule.static_vocab_sizes,
        "target_names": datamodule.target_names,
    }


def prepare_task(task, datamodule) -> None:
    """The target scaling of the metrics in original units; a task that would learn from empty target
    cells is refused."""
    if datamodule.allow_empty_targets and not task.learns_around_missing_targets:
        raise SettingError(
            f"data.allow_empty_targets=true: {type(task).__name__} would learn from empty target cells; only "
            "model=enc_only_masked trains on them (fill the table with it first: predict.py --impute)"
        )
    task.set_target_scaling(datamodule.features.target_scaler)


# -- after the test -------------------------------------------------------------------------------


def write_outputs(cfg: DictConfig, task, datamodule, run_id: str | None) -> RunOutputs:
    """The forecasts CSV, sampled paths (Parquet), the model folder and a table from the data for it."""
    output_dir = Path(cfg.paths.output_dir)
    tested = task.test_outputs
    forecasts = csv_path = paths_path = None
    name = csv_file(cfg, FORECASTS_FILE)
    if name:
        quantiles = _quantiles(task, task.head.levels)
        forecasts = forecasts_frame(
            SplitView.of(datamodule, "test"), tested["pred"], tested["true"], tested["valid"], *quantiles
        )
        csv_path = write_csv(forecasts, output_dir / name)
    if cfg.get("paths_file"):
        paths_path = write_parquet(
            paths_frame(SplitView.of(datamodule, "test"), tested["paths"]), output_dir / cfg.paths_file
        )
    info = ModelInfo(
        family=task.family, dataset=datamodule.name, run_id=run_id, git_commit=tracking.git_commit()
    )
    model_folder = save_model_folder(output_dir / "model", task, datamodule, info)
    example = example_table(datamodule, task.reconstructs)
    # a new table for it, when it trained on a simulated data set: as many future rows as it forecasts
    future_steps = 0 if task.reconstructs else datamodule.horizon
    data = OmegaConf.to_container(cfg.data, resolve=True)
    new_data = simulate_command(data, future_steps, datamodule.context_len + datamodule.horizon)
    return RunOutputs(model_folder, csv_path, forecasts, paths_path, example, details={"new_data": new_data})


def _quantiles(task, levels: list[float]) -> tuple:
    """(quantiles `(W, T, Dy, K)` of the test windows at `levels`, scaled; levels), or (None, None)
    for a point head: the extra arguments of `forecasts_frame`."""
    if not task.head.probabilistic:
        return None, None
    return select_levels(task.test_outputs["quantiles"], task.report_levels, levels), levels


def log_outputs(logger, cfg: DictConfig, task, datamodule, outputs: RunOutputs) -> None:
    """The fitted feature pipeline, the number of test windows and each one's MSE."""
    tested = task.test_outputs  # pred, true, valid, baseline arrays in window order
    scalers = write_json(
        datamodule.features.to_dict(), Path(cfg.paths.output_dir) / "scalers" / "features.json"
    )
    tracking.log_files(logger, [("scalers", scalers)])
    client, run_id = logger.experiment, logger.run_id
    client.log_metric(run_id, "test/n_windows", len(tested["pred"]))
    window_mse = datamodule.window_info("test").assign(mse=_window_mse(tested))
    client.log_text(run_id, window_mse.to_csv(index=False), WINDOW_MSE)


def figures(cfg: DictConfig, task, datamodule, outputs: RunOutputs) -> dict:
    """Test windows, error by step, attention and (distribution heads) the fan chart, drawn from
    the test arrays without the CSV-sized frame."""
    tested = task.test_outputs
    n_plot = cfg.n_plot_windows
    shown = _plot_windows(len(tested["pred"]), n_plot)
    view = SplitView.of(datamodule, "test")
    windows = forecasts_frame(view, tested["pred"], tested["true"], tested["valid"], windows=shown)
    reconstruction = task.reconstructs  # the figures say "reconstruction", not "forecast"
    history = _history(datamodule)
    units = view.units
    figures = {
        "plots/test_windows.png": forecast_windows_figure(windows, history, n_plot, reconstruction, units)
    }
    model_mae = mae_by_step(view, tested["pred"], tested["true"], tested["valid"])
    baseline_mae = mae_by_step(view, tested["baseline"], tested["true"], tested["valid"])
    others = {  # the other baselines' (forecasting: the linear forecaster)
        b.name: mae_by_step(view, tested[f"pred_{b.name}"], tested["true"], tested["valid"])
        for b in task.baselines[1:]
        if f"pred_{b.name}" in tested
    }
    figures["plots/error_by_step.png"] = error_by_step_figure(
        model_mae, baseline_mae, reconstruction, view.freq, units, others=others
    )
    if getattr(task.net, "attends", True):  # the linear forecaster has no attention to show
        figures["plots/attention.png"] = attention_figure(task, view, datamodule.datasets["test"])
    if task.head.probabilistic:
        quantiles = select_levels(tested["quantiles"], task.report_levels, BAND_LEVELS)
        args = (tested["pred"], tested["true"], tested["valid"], quantiles, BAND_LEVELS)
        bands = forecasts_frame(view, *args, windows=shown)
        figures["plots/fan_chart.png"] = fan_chart_figure(bands, history, n_plot, units)
    return figures


def _window_mse(outputs: dict[str, np.ndarray]) -> np.ndarray:
    """`(W,)`: the squared error of each test window averaged over its valid steps and variables (a
    masked fill-in run predicts its hidden values only: its other y_pred are NaN and not counted)."""
    sq = (outputs["pred"] - outputs["true"]) ** 2  # (W, T, Dy)
    scored = outputs["valid"][..., None] & ~np.isnan(sq)
    return np.where(scored, sq, 0.0).sum(axis=(1, 2)) / np.maximum(scored.sum(axis=(1, 2)), 1)


def _plot_windows(n_windows: int, n_plot: int) -> np.ndarray:
    """Indices of the test windows the figures show: `n_plot` spread evenly over the test period."""
    return np.linspace(0, n_windows - 1, min(n_plot, n_windows)).round().astype(int)


def _history(datamodule) -> pd.DataFrame:
    """The validated data with the columns `series_id`, `time` and the targets, for the figures."""
    history = datamodule.frame.rename(columns={datamodule.schema.time_col: "time"})
    if datamodule.schema.series_col:
        return history.rename(columns={datamodule.schema.series_col: "series_id"})
    return history.assign(series_id=0)


def summary_lines(metrics: dict[str, float], baselines: list, outputs: RunOutputs) -> list[str]:
    """Each test metric of the model beside the baselines' (the first is the naive one, `baseline`),
    the spread calibration, what the columns and units are, and where the CSV and paths are."""
    names = ["mse", "mae", "mae_orig", "rmse_orig"]
    names += sorted(k.removeprefix("test/") for k in metrics if k.startswith("test/mae_orig/"))
    probabilistic = ("crps", "crps_orig", "pinball", "coverage_80", "width_80", "width_80_orig")
    names += [n for n in probabilistic if f"test/{n}" in metrics]
    lines = metric_table(metrics, names, baselines)
    lines += loses_to(metrics, baselines)
    if "calibration/val_coverage_80_as_trained" in metrics:
        lines.append(
            "spread calibration (model.head.calibrate, calibration_window): the validation windows' 80% "
            f"interval covered {metrics['calibration/val_coverage_80_as_trained']:.3f} as trained; their "
            f"factor x{metrics['calibration/spread_scale_first_step']:.2f} at the first step, "
            f"x{metrics['calibration/spread_scale_last_step']:.2f} at the last"
        )
    if "gate/val_mse_linear" in metrics:
        lines.append(
            f"linear gate (model.linear_gate): the validation windows kept {metrics['gate/mean_share']:.3f} of the "
            f"Transformer's correction on average ({metrics['gate/kept_groups']:.0%} of the gate's groups); "
            f"validation MSE {metrics['gate/val_mse_gated']:.4f} gated, {metrics['gate/val_mse_linear']:.4f} "
            f"the linear forecaster, {metrics['gate/val_mse_model']:.4f} the model ungated"
        )
    lines.append("*_orig rows: in the targets' own units; the others: on the targets as scaled for training")
    csv_path = outputs.csv_path
    lines.append(
        f"forecasts CSV: {csv_path.resolve()}" if csv_path else "forecasts CSV: none (forecasts_file=null)"
    )
    if outputs.paths_path is not None:
        lines.append(f"sampled paths: {outputs.paths_path.resolve()}")
    if outputs.details.get("new_data"):
        lines.append(f"a new table for it: {outputs.details['new_data']}")
    return lines


def loses_to(metrics: dict[str, float], baselines: list) -> list[str]:
    """One line when the model's test MSE (scaled) is above a baseline's (persistence, the linear
    forecaster, ...): a user must not have to read the table to learn it; none otherwise."""
    model = metrics.get("test/mse")
    if model is None:
        return []
    beaten_by = [
        (b, metrics[f"test/{b.name}_mse"])
        for b in baselines
        if metrics.get(f"test/{b.name}_mse", float("inf")) < model
    ]
    if not beaten_by:
        return []
    which = "; ".join(f"{b.name} {mse:.4f} ({model / mse:.2f}x)" for b, mse in beaten_by)
    return [f"the model loses to {len(beaten_by)} baseline(s): test mse {model:.4f} against {which}"]


# -- predict.py, tsformer-serve, the pyfunc model ------------------------------------------------


def answer(model: Forecaster, table: pd.DataFrame, params: dict, source: str) -> pd.DataFrame:
    """The forecasts of `table` (a reconstruction model: its rebuilt targets)."""
    return model.predict(table, origin=params.get("origin"), source=source, time_format=params["time_format"])


def report(model: Forecaster, forecasts: pd.DataFrame, written: list[Path]) -> str:
    """What was predicted, in two lines."""
    origins = forecasts.groupby("series_id")["origin_time"].max()
    return (
        f"{made_by(model)}: {len(origins)} series, {forecasts['step'].max()} steps, origin(s) {origins.min()} "
        f".. {origins.max()}\nforecasts CSV: {written[0]} ({len(forecasts)} rows)"
    )


JOB = job_of_module(
    __name__,
    data_class=TimeSeriesDataModule,
    folders=(FOLDER,),
    name="forecasting",
    tasks=(EncoderDecoderForecaster, DecoderOnlyForecaster, EncoderForecaster, LinearForecaster),
    data=DATA,
    prediction=Prediction(
        answer, report, params=(ORIGIN, TIME_FORMAT), stream=answer_stream
    ),  # tsformer-serve's streams
    usage=predict_usage("forecast new data", "--output", FORECASTS_FILE),
)
