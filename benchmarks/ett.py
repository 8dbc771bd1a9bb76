"""ETT side by side (issue 6): our families and neuralforecast's models on the same test windows.

    python benchmarks/ett.py                                  # ETTh1, L=336, H=96, our families, peers if importable
    python benchmarks/ett.py --datasets ETTh1,ETTm1 --lookbacks 96,336,512 --horizons 96,192,336,720
    python benchmarks/ett.py --models tsformer-patchtst,nf-PatchTST --epochs 2 --max-train-batches 100
    python benchmarks/ett.py --quick --models tsformer-enc_only_forecast --lookbacks 96 --horizons 96 \
        --results /tmp/RESULTS.md                             # tiny settings: checks the script runs
    python benchmarks/ett.py --throughput                     # training windows/s and memory, as ratios
    python benchmarks/ett.py --throughput --throughput-profile 8   # and where each network step's time goes
    python benchmarks/ett.py --models tsformer-recipe --epochs 2 --datasets Exchange --lookbacks 96 \
        --horizons 96,192,336,720                             # the forecast pool's sets (issue 56): Exchange, ILI

Protocol (conf/data/ett.yaml, README "ETT benchmark data"): all 7 channels in and out, StandardScaler
fitted on the train rows [0, 8640) (ETTm x4), every test window (stride 1: 2880 - H + 1 rolling origins
over the test period for ETTh, 11520 - H + 1 for ETTm), MSE/MAE on the scaled values.

Rows `tsformer-<name>` are ordinary `train.run` runs (the same configs as `python train.py
experiment=ett ...`, logged to MLflow in ./mlflow.db, experiment "ett-benchmark"):

- tsformer-patchtst: `model=patchtst` (PatchTST/64-like: RevIN, channel independence, patches
  16/8, d_model 128, 3 layers, 16 heads, FFN 256, dropout 0.2, BatchNorm post-norm blocks with
  residual attention, the paper's training: Adam, lr 1e-4, per-epoch decay);
- tsformer-patchtst-small: the same at the sizes of the paper's ETTh1 scripts (d_model 16, 4 heads,
  FFN 128, dropout 0.3);
- tsformer-recipe: issue 48's forecasting recipe (the small one, one head, on the closed-form linear
  path): `experiment=forecast_recipe` (conf/experiment/; benchmarks/RESULTS_forecasting.md);
- tsformer-enc_only_forecast: encoder-only + flatten head, one token per step, channels mixed in
  each token, RevIN on (d_model 64, 2 layers, 4 heads: the `_common` sizes);
- tsformer-enc_dec: encoder-decoder, RevIN + channel independence + encoder patches 16/8, one
  decoder layer (d_model 64, 2 encoder layers); the forecast is generated step by step at test time;
- tsformer-dec_only: decoder-only, RevIN + channel independence, one token per step (d_model 64,
  2 layers); generated step by step at test time;
- tsformer-dec_only-patch16: the same with patch tokens of 16 steps side by side (TimesFM's design),
  generated 16 steps (one token) at a time;
- tsformer-enc_dec-linear, tsformer-dec_only-patch16-linear: those two rows on the closed-form linear
  path (`model.linear_path=true`: the linear forecaster's forecast plus the network's);
- tsformer-enc_dec-direct-linear: tsformer-enc_dec-linear with a decoder that feeds nothing back
  (`model.net.feed_back=false`: every decoder token carries the last observed value; one pass);
- tsformer-enc_dec-direct-linear-dpatch16: tsformer-enc_dec-direct-linear with a decoder token per 16 future
  steps (`model.net.decoder_patch_len=16`);
- tsformer-linear: `model=linear`, the closed-form channel-shared ridge (models/linear.py): solved on
  the train windows, its penalty chosen on the validation windows, no optimiser step. Every row of
  ours also reports the same forecaster fitted inside its own run (`linear_mse_same_run`, the run's
  `test/linear_mse`): the same windows, the same train rows.

Rows `nf-<name>` (when `neuralforecast` is importable) are neuralforecast's PatchTST, iTransformer,
VanillaTransformer, DLinear and NLinear (the linear peers of "Are Transformers Effective for Time Series
Forecasting?", 2023, trained by gradient descent as there), trained by `NeuralForecast.cross_validation(step_size=1, refit=False,
val_size=test_size=the protocol's 2880 (x4))` on the SAME scaled values (our datamodule's
train-fitted StandardScaler applied to the table first; neuralforecast's own scaler is `identity`),
so they train on rows [0, 8640) and forecast exactly the same rolling origins. Before any peer is
scored the script checks that its forecast origins are our test windows' origins, and computes the
persistence baseline (last value repeated) both from our windows and from neuralforecast's output:
both are recorded and must agree.

Budget: our rows train `--epochs` epochs of batches of 32 windows (`--max-train-batches` caps the
batches per epoch; validation every epoch, the best epoch's checkpoint is tested); the peers train
the same number of optimizer steps with the same windows per step (univariate models: 32 x 7
channel windows per step; iTransformer, multivariate: 32 windows of 7 channels), loss MSE, validated
after each epoch's worth of steps and stopped, as our rows, after `--peer-patience` (3) validations
without improvement (neuralforecast then keeps its last weights; ours test the best epoch's).
Without that, a peer given many epochs overfits: nf-PatchTST at ETTh1 L=512 with 10 epochs' steps and
no early stopping scored 0.417 / 0.558 / 0.542 / 0.610 (H = 96 / 192 / 336 / 720; H100, 2026-11-22).

`--throughput` times training steps on one fixed batch (data loading excluded) for our families and
neuralforecast's VanillaTransformer at the same width, depth and batch, each in its own subprocess,
and prints the ratios, twice: "step", each library's own `training_step` on its own batch (ours:
RevIN, the channel split, the loss; neuralforecast's: cutting and sampling the windows from the whole
series, its checks), what training costs a user; "network", the network and an MSE on a batch already
in its layout. Both with backward and an AdamW step. With them, the aten ops of a forward and
backward that do work (views excluded), the measure a launch-bound GPU step follows. Memory: on a GPU
the peak of `torch.cuda.max_memory_allocated`, on the CPU the growth of the subprocess's peak resident
set size (ru_maxrss) from before the first training step to after the last (activations, gradients
and optimizer state; allocator caching included: a coarse figure). `--throughput-profile N` adds,
per model, the N aten ops that take the most time in a "network" step (torch.profiler's self time,
ms per step): where a ratio comes from.

RESULTS.md (`--results`, default benchmarks/RESULTS.md) is written by every non-quick invocation
from what that invocation measured, beside the published PatchTST/64 rows; nothing measured is
typed in by hand.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from tsformer.data.ett import STEPS_PER_HOUR
from tsformer.data.forecast_pool import protocol_split_rows

# the forecast pool's sets (conf/data/exchange.yaml, ili.yaml; issue 56) as datasets of this script: their
# data config and their rows (the split: forecast_pool.protocol_split_rows); ETT files are data.name=...
POOL = {"Exchange": ("data=exchange", 7588), "ILI": ("data=ili", 966)}


def data_overrides(dataset: str) -> list[str]:
    """The train.py overrides that read `dataset` (after experiment=ett or one built on it)."""
    return [POOL[dataset][0]] if dataset in POOL else [f"data.name={dataset}"]


EXPERIMENT = "ett-benchmark"
BATCH = 32  # the literature's batch (conf/experiment/ett.yaml)
# the two other families' rows: RevIN, channel independence, patches of 16 (the linear-path rows add to them)
ENC_DEC = [
    "model=enc_dec",
    "model.revin=true",
    "model.channel_independent=true",
    "model.patch_len=16",
    "model.patch_stride=8",
    "model.net.n_decoder_layers=1",
]
DEC_ONLY_PATCH16 = [
    "model=dec_only",
    "model.revin=true",
    "model.channel_independent=true",
    "model.patch_len=16",
]
OURS = {
    "tsformer-patchtst": ["model=patchtst"],
    # the paper's ETTh1/ETTh2 scripts use a much smaller PatchTST (d_model 16, 4 heads, d_ff 128,
    # dropout 0.3) than PatchTST/64's default sizes: the hourly sets have 4x fewer windows
    "tsformer-patchtst-small": [
        "model=patchtst",
        "model.net.d_model=16",
        "model.net.n_heads=4",
        "model.net.ffn_expansion=8",
        "model.net.dropout=0.3",
        "model.net.attention_output_dropout=0.51",  # the preset's two dropouts in a row, at 0.3: 1 - 0.7^2
    ],
    # issue 48's recipe (benchmarks/RESULTS_forecasting.md), the experiment users run: the small
    # PatchTST with one head of 16 on the closed-form linear path; run with --epochs 2 (the experiment's)
    "tsformer-recipe": ["experiment=forecast_recipe"],
    "tsformer-enc_only_forecast": ["model=enc_only_forecast", "model.revin=true"],
    "tsformer-enc_dec": ENC_DEC,
    "tsformer-dec_only": ["model=dec_only", "model.revin=true", "model.channel_independent=true"],
    "tsformer-dec_only-patch16": DEC_ONLY_PATCH16,
    # the same two on the closed-form linear path (issue 56, point 5): the linear forecaster's forecast
    # plus the network's, the network's output layer starting at zero
    "tsformer-enc_dec-linear": [*ENC_DEC, "model.linear_path=true"],
    # and with a decoder that feeds nothing back (model.net.feed_back=false: one pass, no teacher forcing)
    "tsformer-enc_dec-direct-linear": [*ENC_DEC, "model.net.feed_back=false", "model.linear_path=true"],
    # and with decoder tokens of 16 future steps (model.net.decoder_patch_len: self-attention over M / 16 tokens)
    "tsformer-enc_dec-direct-linear-dpatch16": [
        *ENC_DEC,
        "model.net.feed_back=false",
        "model.net.decoder_patch_len=16",
        "model.linear_path=true",
    ],
    "tsformer-dec_only-patch16-linear": [*DEC_ONLY_PATCH16, "model.linear_path=true"],
    # the closed-form channel-shared ridge (models/linear.py): fitted, not trained (one epoch, no step)
    "tsformer-linear": ["model=linear"],
}


def row_overrides(name: str) -> list[str]:
    """Our row `name`'s experiment and settings: experiment=ett's with the row's, or the row's own
    experiment where it names one (the recipe: its settings live in conf/, where users run it)."""
    settings = OURS[name]
    return settings if settings[0].startswith("experiment=") else ["experiment=ett", *settings]


PEERS = ("nf-PatchTST", "nf-iTransformer", "nf-VanillaTransformer", "nf-DLinear", "nf-NLinear")
QUICK = [
    "model.net.d_model=16",
    "model.net.n_heads=2",
    "model.net.n_layers=1",
    "model.warmup_steps=2",
    "trainer.limit_val_batches=1",
    "n_plot_windows=1",
]
# No forecasts CSV for benchmark rows: the metrics cover every test window, and at H=720 the CSV of
# one row would be 0.6 GB (ETTh1) to 3 GB (ETTm1).
COMMON = [
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    f"logger.mlflow.experiment_name={EXPERIMENT}",
    "forecasts_file=null",
]

# Nie et al., "A Time Series is Worth 64 Words", ICLR 2023, Table 3, PatchTST/64 (L = 512), MSE.
PUBLISHED = {
    "ETTh1": {96: 0.370, 192: 0.413, 336: 0.422, 720: 0.447},
    "ETTm1": {96: 0.293, 192: 0.333, 336: 0.369, 720: 0.416},
}
PUBLISHED_SOURCE = "Nie et al. ICLR 2023, Table 3 (PatchTST/64)"
COLUMNS = ["model", "dataset", "L", "H", "mse", "mae", "train_s", "params", "source"]
DETAIL_COLUMNS = [
    "model",
    "dataset",
    "L",
    "H",
    "test_windows",
    "expected_windows",
    "steps",
    "persistence_mse_ours",
    "persistence_mse_peer_side",
    "linear_mse_same_run",
    "best_val_mse",
    "mse_drop_last_128",
    "mlflow_run_id",
    # with model.linear_gate (the recipe, issue 56): the validation MSE of the same-run linear forecaster,
    # of the model ungated and gated, the mean share kept, and what each gate form would have given
    "gate_val_linear",
    "gate_val_model",
    "gate_val_gated",
    "gate_share",
    "gate_val_global",
    "gate_val_step",
    "gate_val_channel",
    # and on the test windows (reported beside the form the validation figures choose, never choosing)
    "gate_test_ungated",
    "gate_test_global",
    "gate_test_step",
    "gate_test_channel",
]
# PatchTST's public code (PatchTST_supervised/data_provider/data_factory.py, inherited from Informer and
# Autoformer) builds its TEST loader with drop_last=True and the script's batch size, 128 in its ETT
# scripts: the last W mod 128 windows of the test period are never scored (97 of 2785 at ETTh1 H=96).
# `mse_drop_last_128` is the row's MSE over the windows such a loader keeps, to show how much of a gap to
# the published figures that protocol difference makes; `mse` (every window) is the row's result.
PAPER_TEST_BATCH = 128


def drop_last_mse(window_mse: np.ndarray, batch: int = PAPER_TEST_BATCH) -> float:
    """Mean of the per-window MSEs `(W,)` (chronological, equal weights: every window has H x 7 values)
    over the first floor(W / batch) * batch windows, those a drop_last test loader scores."""
    kept = len(window_mse) // batch * batch
    return float(np.mean(window_mse[:kept])) if kept else float("nan")


def protocol_test_windows(dataset: str, horizon: int) -> int:
    """Rolling origins over the test period: 2880 - H + 1 for ETTh, 11520 - H + 1 for ETTm, the last
    int(0.2 n) rows - H + 1 for the pool's sets."""
    if dataset in POOL:
        n_rows = POOL[dataset][1]
        return n_rows - protocol_split_rows(n_rows)[1] - horizon + 1
    return 2880 * STEPS_PER_HOUR[dataset[3]] - horizon + 1


def machine() -> str:
    import torch

    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    device = (
        torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else f"CPU {platform.machine()}, {os.cpu_count()} cores"
    )
    return f"{device}, OMP_NUM_THREADS={threads}, torch {torch.__version__}"


def nf_available() -> bool:
    try:
        import neuralforecast  # noqa: F401
    except ImportError:
        return False
    return True


def datamodule(dataset: str, L: int, H: int):
    from hydra.utils import instantiate

    from tsformer.train import compose_config

    cfg = compose_config(
        ["experiment=ett", *data_overrides(dataset), f"model.context_len={L}", f"model.horizon={H}"],
        Path(tempfile.mkdtemp()),
    )
    dm = instantiate(cfg.data)
    dm.setup()
    return dm


def persistence_ours(dm) -> tuple[float, float, int]:
    """Last observed value repeated, on our test windows (scaled): (mse, mae, windows)."""
    ds = dm.datasets["test"]
    target = ds.target.numpy().astype(np.float64)
    starts = ds.starts
    last = target[starts + ds.context_len - 1]  # (W, Dy)
    fut_rows = starts[:, None] + ds.context_len + np.arange(ds.horizon)[None, :]  # (W, H)
    err = target[fut_rows] - last[:, None, :]  # (W, H, Dy)
    return float((err**2).mean()), float(np.abs(err).mean()), len(starts)


# -- our families -----------------------------------------------------------------------------------


def run_ours(name, dataset, L, H, args, out_root: Path) -> dict:
    from mlflow.tracking import MlflowClient

    from tsformer.jobs.forecasting.job import WINDOW_MSE
    from tsformer.train import compose_config, run

    overrides = [
        *row_overrides(name),
        *data_overrides(dataset),
        f"model.context_len={L}",
        f"model.horizon={H}",
        f"trainer.max_epochs={args.epochs}",
        f"seed={args.seed}",
        *COMMON,
        f"logger.mlflow.run_name={name}-{dataset}-{L}-{H}",
    ]
    if args.max_train_batches:
        overrides.append(f"trainer.limit_train_batches={args.max_train_batches}")
    if args.quick:
        overrides += QUICK
    overrides += args.override  # after the row's own settings: --override wins
    cfg = compose_config(overrides, out_root / f"{name}-{dataset}-{L}-{H}")
    result = run(cfg)
    client = MlflowClient(tracking_uri=cfg.logger.mlflow.tracking_uri)
    client.set_tag(result.run_id, "benchmark_row", name)
    logged = client.get_run(result.run_id).data
    window_mse = pd.read_csv(client.download_artifacts(result.run_id, WINDOW_MSE, tempfile.mkdtemp())).mse
    return {
        "mse": result.metrics["test/mse"],
        "mae": result.metrics["test/mae"],
        "train_s": logged.metrics["fit/seconds"],
        "steps": int(logged.metrics["fit/steps"]),
        "params": int(logged.params["n_params"]),
        "test_windows": int(logged.metrics["test/n_windows"]),
        "persistence_mse_ours": result.metrics["test/baseline_mse"],
        "linear_mse_same_run": result.metrics["test/linear_mse"],  # every forecasting run measures it
        "best_val_mse": result.best_val,  # what chose the checkpoint: the figure a recipe is chosen on
        "mse_drop_last_128": drop_last_mse(window_mse.to_numpy()),
        "mlflow_run_id": result.run_id,
        "batch_size": int(cfg.data.batch_size),  # as composed: the experiment's, or an --override's
        **{
            f"gate_{k.removeprefix('gate/').replace('val_mse', 'val').replace('mean_share', 'share')}": v
            for k, v in result.metrics.items()
            if k.startswith("gate/") and k != "gate/kept_groups"
        },
        **{
            f"gate_test_{k.removeprefix('test/gate_').removesuffix('_mse')}": v
            for k, v in result.metrics.items()
            if k.startswith("test/gate_")
        },
    }


# -- neuralforecast peers ---------------------------------------------------------------------------


def nf_model(
    name: str,
    L: int,
    H: int,
    steps: int,
    per_epoch: int,
    patience: int,
    quick: bool,
    seed: int,
    d_model: int = 64,
    dropout: float | None = None,
):
    """neuralforecast's model `name` for a budget of `steps` optimizer steps; validated every `per_epoch`
    steps (our rows: every epoch) and stopped after `patience` validations without improvement (our
    rows' early stopping; neuralforecast then keeps its last weights, ours the best epoch's).
    d_model, dropout: VanillaTransformer's width (FFN 4 x d_model) and dropout (None: its default),
    for the throughput rows."""
    from neuralforecast.losses.pytorch import MSE
    from neuralforecast.models import DLinear, NLinear, PatchTST, VanillaTransformer, iTransformer

    common = {
        "h": H,
        "input_size": L,
        "loss": MSE(),
        "max_steps": steps,
        "val_check_steps": min(per_epoch, steps),
        "early_stop_patience_steps": patience if patience > 0 and steps > per_epoch else -1,
        "scaler_type": "identity",  # the inputs are already scaled with the train-fitted StandardScaler
        "random_seed": seed,
        "inference_windows_batch_size": 1024,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": False,
        "accelerator": "auto",  # the GPU when there is one, as our rows (trainer.accelerator=auto)
    }
    small = quick
    if name == "nf-PatchTST":  # PatchTST/64 sizes, as our preset
        return PatchTST(
            **common,
            batch_size=7,
            windows_batch_size=BATCH * 7,
            hidden_size=16 if small else 128,
            n_heads=2 if small else 16,
            encoder_layers=1 if small else 3,
            linear_hidden_size=32 if small else 256,
            patch_len=16,
            stride=8,
            revin=True,
            dropout=0.2,
            learning_rate=1e-4,
        ), "univariate: d 128, 3 layers, 16 heads, FFN 256, patches 16/8, RevIN"
    if name == "nf-iTransformer":
        return iTransformer(
            **common,
            n_series=7,
            batch_size=7,
            windows_batch_size=BATCH,
            hidden_size=16 if small else 128,
            n_heads=2 if small else 8,
            e_layers=1 if small else 2,
            d_ff=32 if small else 256,
            learning_rate=1e-3,
        ), "multivariate: d 128, 2 layers, 8 heads, FFN 256, its own instance norm"
    if name == "nf-VanillaTransformer":
        d = 16 if small else d_model
        return VanillaTransformer(
            **common,
            batch_size=7,
            windows_batch_size=BATCH * 7,
            hidden_size=d,
            n_head=2 if small else 4,
            encoder_layers=1 if small else 2,
            decoder_layers=1,
            conv_hidden_size=2 * d if small else 4 * d,
            learning_rate=1e-4,
            **({} if dropout is None else {"dropout": dropout}),
        ), f"univariate: d {d}, 2 encoder + 1 decoder layers, 4 heads, FFN {4 * d}, no RevIN"
    if name == "nf-DLinear":  # one linear map per component, channels sharing it (its "individual" off)
        return DLinear(
            **common, batch_size=7, windows_batch_size=BATCH * 7, moving_avg_window=25, learning_rate=1e-3
        ), "univariate: trend (moving average 25) + remainder, one linear map each"
    if name == "nf-NLinear":  # one linear map of the window minus its last value
        return NLinear(
            **common, batch_size=7, windows_batch_size=BATCH * 7, learning_rate=1e-3
        ), "univariate: one linear map of the window minus its last value"
    raise ValueError(name)


def peer_frame(dm) -> pd.DataFrame:
    """The data set's target channels as neuralforecast's long frame (unique_id = the channel, ds, y),
    scaled with our datamodule's train-fitted StandardScaler."""
    frame = dm.frame
    scaled = dm.features.transform_target(frame[dm.target_names].to_numpy())
    times = frame[dm.schema.time_col].to_numpy()
    return pd.concat(
        [
            pd.DataFrame({"unique_id": col, "ds": times, "y": scaled[:, j]})
            for j, col in enumerate(dm.target_names)
        ],
        ignore_index=True,
    )


def run_peer(name, dataset, L, H, dm, steps: int, per_epoch: int, args) -> dict:
    import mlflow
    from neuralforecast import NeuralForecast

    from tsformer import tracking

    k = STEPS_PER_HOUR[dataset[3]]
    df = peer_frame(dm)
    model, sizes = nf_model(name, L, H, steps, per_epoch, args.peer_patience, args.quick, args.seed)
    nf = NeuralForecast(models=[model], freq="h" if k == 1 else "15min")
    start = time.perf_counter()
    cv = nf.cross_validation(
        df=df, n_windows=None, val_size=2880 * k, test_size=2880 * k, step_size=1, refit=False
    )
    seconds = (
        time.perf_counter() - start
    )  # fit and forecast of every origin (the peers' fit alone is not exposed)
    pred_col = next(c for c in cv.columns if c not in ("unique_id", "ds", "cutoff", "y"))

    # the same origins as our test windows, each with H steps for each of the 7 channels
    ours = np.sort(dm.window_info("test").origin_time.to_numpy().astype("datetime64[ns]"))
    theirs = np.sort(cv.cutoff.unique().astype("datetime64[ns]"))
    if len(ours) != len(theirs) or not (ours == theirs).all():
        raise RuntimeError(f"{name}: {len(theirs)} forecast origins, not our {len(ours)} test windows")
    if len(cv) != len(ours) * H * 7:
        raise RuntimeError(f"{name}: {len(cv)} forecast rows, expected {len(ours) * H * 7}")
    # persistence from neuralforecast's side: the value at each cutoff, repeated, against its `y`
    at_cutoff = df.rename(columns={"ds": "cutoff", "y": "y_last"})
    merged = cv.merge(at_cutoff, on=["unique_id", "cutoff"], how="left")
    persistence_mse = float(((merged.y - merged.y_last) ** 2).mean())
    err = cv.y - cv[pred_col]  # (W * H * 7,): up to 57 million rows (ETTm1, H = 720)
    window_mse = err.pow(2).groupby(cv.cutoff).mean().sort_index().to_numpy(np.float64)  # (W,)
    err = err.to_numpy(np.float64)
    n_params = sum(p.numel() for p in nf.models[0].parameters())
    trajectory = nf.models[0].train_trajectories  # (global_step, loss) of every training step made
    row = {
        "steps": trajectory[-1][0] + 1 if trajectory else steps,  # fewer than the budget after early stopping
        "mse": float((err**2).mean()),
        "mae": float(np.abs(err).mean()),
        "train_s": seconds,
        "params": n_params,
        "test_windows": len(theirs),
        "persistence_mse_peer_side": persistence_mse,
        "mse_drop_last_128": drop_last_mse(window_mse),
        "sizes": sizes,
    }
    uri = tracking.absolute_sqlite_uri("sqlite:///mlflow.db")
    tracking.prepare_sqlite_store(uri, EXPERIMENT)  # other benchmark processes may be creating it too
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(EXPERIMENT)
    with mlflow.start_run(run_name=f"{name}-{dataset}-{L}-{H}") as active:
        mlflow.set_tags({"benchmark_row": name, "dataset": dataset, "family": name, "sizes": sizes})
        mlflow.log_params(
            {"L": L, "H": H, "max_steps": steps, "windows_per_step": BATCH * 7, "quick": args.quick}
        )
        mlflow.log_metrics(
            {
                "test/mse": row["mse"],
                "test/mae": row["mae"],
                "fit_and_cv_seconds": seconds,
                "n_params": n_params,
                "test/n_windows": len(theirs),
                "test/baseline_mse_peer_side": persistence_mse,
            }
        )
        row["mlflow_run_id"] = active.info.run_id
    return row


# -- the table --------------------------------------------------------------------------------------


def fmt(v, column: str = ""):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if column == "params" or (isinstance(v, int) and column in ("steps",)):
        return f"{int(v):,}"
    if column == "train_s":
        return f"{v:.1f}"
    if isinstance(v, float):
        return (
            f"{v:.4f}"
            if column.startswith(("mse", "mae", "persistence", "linear", "best_val", "gate_val", "gate_test"))
            else f"{v:.4g}"
        )
    return str(v)


def markdown(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c), c) for c in columns) + " |")
    return "\n".join(lines)


def published_rows(datasets, horizons) -> list[dict]:
    return [
        {
            "model": "PatchTST/64 (paper)",
            "dataset": d,
            "L": 512,
            "H": h,
            "mse": PUBLISHED[d][h],
            "mae": None,
            "train_s": None,
            "params": None,
            "source": PUBLISHED_SOURCE,
        }
        for d in datasets
        if d in PUBLISHED
        for h in horizons
        if h in PUBLISHED[d]
    ]


def write_results(path: Path, measured: list[dict], grid: list[tuple], args, stamp: str) -> None:
    done = {(r["model"], r["dataset"], r["L"], r["H"]) for r in measured}
    pending = [g for g in grid if g not in done]
    budget = f"{args.epochs} epoch(s)" + (
        f", at most {args.max_train_batches} batches (optimizer steps) per epoch"
        if args.max_train_batches
        else ""
    )
    ours_batches = sorted({r["batch_size"] for r in measured if "batch_size" in r}) or [BATCH]
    batch = " / ".join(map(str, ours_batches))
    peers = (
        "the same number of steps and windows per step for the peers (see the script's docstring). "
        if ours_batches == [BATCH]
        else f"the peers, {budget} of {BATCH}-window steps (--override reaches our rows only). "
    )
    text = [
        "# ETT side by side",
        "",
        "Written by `benchmarks/ett.py` (do not edit by hand); command of this run:",
        "",
        f"    {' '.join(['python', 'benchmarks/ett.py', *sys.argv[1:]])}",
        "",
        f"Measured rows: {stamp}, on {machine()}; budget for our rows {budget}, {batch} windows per batch; "
        + peers
        + "`train_s`: our rows, `trainer.fit` (validation included); peers, neuralforecast's "
        "`cross_validation` (fit plus forecasting every test origin). MSE/MAE on the scaled values, "
        "every test window. The published rows are the paper's own figures (L = 512, its own training "
        "budget), MSE only: their MAE is not quoted here.",
        "",
        markdown(
            measured
            + published_rows(
                sorted({g[1] for g in grid} | {r["dataset"] for r in measured}),
                sorted({g[3] for g in grid} | {r["H"] for r in measured}),
            ),
            COLUMNS,
        ),
        "",
        (
            "Per measured row: evaluated test windows (and the protocol's count), optimizer steps, the "
            "persistence baseline's MSE computed from our windows and from the peer's own output (equal: "
            "same windows, same scaling), the row's MSE over only the first floor(W / 128) x 128 test windows "
            "(`mse_drop_last_128`: what the published figures' code scores, its test loader dropping the last "
            "partial batch of 128; not our result, a measure of that protocol difference), and the MLflow run "
            "(./mlflow.db, experiment `ett-benchmark`)."
        ),
        "",
        markdown(measured, DETAIL_COLUMNS),
        "",
        f"Pending (requested, not measured in this run): {len(pending)} of {len(grid)} rows"
        + (": " + "; ".join(f"{m} {d} L={L} H={H}" for m, d, L, H in pending) if pending else "."),
        "",
    ]
    path.write_text("\n".join(text))
    print(f"wrote {path}")


# -- throughput -------------------------------------------------------------------------------------

THROUGHPUT_MODELS = [
    "tsformer-enc_only_forecast",
    "tsformer-enc_dec",
    "tsformer-dec_only",
    "tsformer-dec_only-patch16",
    "nf-VanillaTransformer",
]


def count_ops(fn) -> int:
    """aten ops of one call of `fn` that do work (views excluded). Not GPU kernels exactly (one op may
    launch several), but the same measure for every row, and what a launch-bound GPU step pays per op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    n = 0

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            nonlocal n
            # views (a new shape or strides over the same memory) launch no kernel; `_unsafe_view` is
            # one too, though its schema does not say so
            n += not (func.is_view or func.__name__.startswith("_unsafe_view"))
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return n


def op_times(step, n_top: int, cuda: bool, n_steps: int = 3) -> tuple[list[list], float]:
    """Where a training step's time goes: the `n_top` aten ops with the most self time (an op's own,
    not its callees'), milliseconds per step over `n_steps` profiled steps, as `[[op, ms], ...]`, and
    the self time of everything profiled, ms per step: CPU time on the CPU, the kernels' device time
    on a GPU."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(n_steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    time_of = (
        (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    )  # microseconds
    events = prof.key_averages()
    ops = sorted((e for e in events if e.key.startswith("aten::")), key=time_of, reverse=True)
    top = [[e.key.removeprefix("aten::"), round(time_of(e) / 1e3 / n_steps, 1)] for e in ops[:n_top]]
    return top, round(sum(time_of(e) for e in events) / 1e3 / n_steps, 1)


def nf_training_batch(dm):
    """neuralforecast's own training batch for ETTh1's 7 channels (7 univariate series, the scaled
    values, as `run_peer` gives them): a model's `training_step` cuts the windows from it and samples
    `windows_batch_size` (32 x 7) of them, as `fit` does."""
    from neuralforecast.tsdataset import TimeSeriesDataModule, TimeSeriesDataset

    dataset, *_ = TimeSeriesDataset.from_df(peer_frame(dm))
    return next(iter(TimeSeriesDataModule(dataset=dataset, batch_size=7).train_dataloader()))


def throughput_child(
    name: str, L: int, H: int, steps: int, d_model: int, mode: str, profile_ops: int = 0
) -> dict:
    """One model's training steps/s on one fixed batch of 32 windows x 7 channels (run in a subprocess).

    mode "step": each library's own training step on its own batch: ours `training_step` on a batch of
    our DataLoader (RevIN, the channel split, the loss over valid steps, its finiteness check), the
    peer's `training_step` on its DataLoader's batch (the 7 whole series: it cuts and samples 32 x 7
    windows, scales, checks the loss); "network": the network and an MSE only, on a batch already in
    its layout (32 x 7 one-channel windows; ours already through RevIN and the channel split).
    Both then backward and one AdamW step. profile_ops > 0: also the ops that take the most time
    (`op_times`), after the timed steps."""
    import warnings

    import torch

    # training_step's self.log without a Trainer: a no-op, with a warning at every call
    warnings.filterwarnings("ignore", message=".*self.trainer. reference is not registered")
    torch.manual_seed(0)
    dm = datamodule("ETTh1", L, H)
    batch = next(iter(dm.train_dataloader()))
    sizes = {"d_target": 7, "d_known": 0, "d_observed": 0}
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")

    def on_device(tree: dict) -> dict:
        return {k: v.to(device) if torch.is_tensor(v) else v for k, v in tree.items()}

    if name.startswith("tsformer-"):
        from hydra.utils import instantiate

        from tsformer.train import compose_config

        # the row's own model and options (patches, decoder layers), then the common size and batch layout
        overrides = [
            *row_overrides(name),
            f"model.context_len={L}",
            f"model.horizon={H}",
            "model.revin=true",
            "model.channel_independent=true",
            f"model.net.d_model={d_model}",
            "model.net.n_heads=4",
            "model.net.n_layers=2",
            "model.net.ffn_expansion=4",
            "model.net.dropout=0.0",
        ]
        cfg = compose_config(overrides, Path(tempfile.mkdtemp()))
        net = task = instantiate(cfg.model, _convert_="all", **sizes).to(device)
        batch = on_device(batch)
        if mode == "step":

            def loss_fn():
                return task.training_step(batch, 0)
        else:
            net_batch, _ = task.options.enter(task.static.append_to_known(batch))  # (B * 7, T, 1) targets

            def loss_fn():
                out, labels, _ = task.teacher_forced(net_batch)
                return torch.nn.functional.mse_loss(out, labels)
    else:
        model, _ = nf_model(
            "nf-VanillaTransformer",
            L,
            H,
            steps=steps,
            per_epoch=steps,
            patience=0,
            quick=False,
            seed=0,
            d_model=d_model,
            dropout=0.0,
        )
        net = model.to(device)
        if mode == "step":
            model.val_size = model.test_size = (
                2880  # train on rows [0, 8640) as the peers' cross-validation does
            )
            nf_batch = on_device(nf_training_batch(dm))

            def loss_fn():
                return model.training_step(nf_batch, 0)
        else:
            # channel independence, as neuralforecast's univariate models see the data: (B*7, L, 1)
            x = batch["hist_target"].permute(0, 2, 1).reshape(-1, L, 1)
            y = batch["fut_target"].permute(0, 2, 1).reshape(-1, H).to(device)
            windows = on_device(
                {
                    "insample_y": x,
                    "insample_mask": torch.ones_like(x),
                    "futr_exog": torch.empty(0),
                    "hist_exog": torch.empty(0),
                    "stat_exog": torch.empty(0),
                }
            )

            def loss_fn():
                out = model(windows)
                return torch.nn.functional.mse_loss(out.reshape(len(y), H), y)

    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=True)  # multi-tensor ops, the default on a GPU

    def step():
        opt.zero_grad()
        loss_fn().backward()
        opt.step()

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # model, batch and data built, no step yet
    step()  # warm-up (allocations, first-call overheads): its memory counts, its time does not
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize()  # kernels are queued asynchronously: wait for the last step's
    seconds = time.perf_counter() - start
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_mem_mb = torch.cuda.max_memory_allocated() / 2**20 if cuda else (rss1 - rss0) / 1024
    top_ops, profiled_ms = op_times(step, profile_ops, cuda) if profile_ops else ([], None)
    return {
        "model": name,
        "mode": mode,
        "params": sum(p.numel() for p in net.parameters()),
        "channel_windows_per_s": steps * BATCH * 7 / seconds,
        "ops_per_step": count_ops(
            lambda: (opt.zero_grad(), loss_fn().backward())
        ),  # no optimizer step: alike for all
        "peak_mem_mb": peak_mem_mb,
        "top_ops_ms_per_step": top_ops,
        "profiled_ms_per_step": profiled_ms,
        "memory_measure": "cuda max_memory_allocated"
        if cuda
        else "CPU: growth of the process's peak RSS (ru_maxrss) from before the first step to after the last",
    }


def throughput(args) -> None:
    L, H = args.throughput_window
    rows = {}
    for mode in ("step", "network"):
        for name in args.throughput_models:
            if name.startswith("nf-") and not nf_available():
                print(f"skipping {name}: neuralforecast is not importable", file=sys.stderr)
                continue
            cmd = [
                sys.executable,
                __file__,
                "--_throughput-child",
                name,
                "--_throughput-mode",
                mode,
                "--throughput-window",
                str(L),
                str(H),
                "--throughput-steps",
                str(args.throughput_steps),
                "--throughput-d-model",
                str(args.throughput_d_model),
                "--throughput-profile",
                str(args.throughput_profile if mode == "network" else 0),
            ]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True)
            rows[name, mode] = json.loads(out.stdout.strip().splitlines()[-1])
    table = []
    for name in args.throughput_models:
        if (name, "step") not in rows:
            continue
        row = {"model": name, "params": rows[name, "step"]["params"]}
        for mode in ("step", "network"):
            r, ref = rows[name, mode], rows.get(("nf-VanillaTransformer", mode))
            row[f"{mode}_windows_per_s"] = r["channel_windows_per_s"]
            row[f"{mode}_vs_nf"] = r["channel_windows_per_s"] / ref["channel_windows_per_s"] if ref else None
            row[f"{mode}_ops"] = r["ops_per_step"]
            row[f"{mode}_ops_vs_nf"] = r["ops_per_step"] / ref["ops_per_step"] if ref else None
        ref = rows.get(("nf-VanillaTransformer", "step"))
        row["peak_mem_mb"] = rows[name, "step"]["peak_mem_mb"]
        row["mem_vs_nf"] = row["peak_mem_mb"] / ref["peak_mem_mb"] if ref and ref["peak_mem_mb"] > 0 else None
        table.append(row)
    memory = next(iter(rows.values()))["memory_measure"] if rows else "-"
    print(
        f"\nthroughput, {dt.date.today()}, {machine()}: ETTh1 L={L} H={H}, batch {BATCH} windows x 7 channels "
        f"(channel independence: {BATCH * 7} sequences), d_model {args.throughput_d_model}, 2 layers (+1 decoder layer "
        f"for enc_dec and VanillaTransformer), 4 heads, FFN 4 x d_model, {args.throughput_steps} timed steps after 1 warm-up.\n"
        "step: each library's own training step on its own batch (ours: training_step; neuralforecast: training_step, "
        "which cuts and samples the windows from whole series); network: the network + MSE on a batch already in "
        "its layout. Both + backward + AdamW. *_ops: aten ops of a forward and backward that do work (views "
        f"excluded; the optimizer's are the same for every row), what a launch-bound GPU pays per op. Memory (step): {memory}\n"
    )
    cols = [
        "model",
        "params",
        "step_windows_per_s",
        "step_vs_nf",
        "network_windows_per_s",
        "network_vs_nf",
        "step_ops",
        "step_ops_vs_nf",
        "network_ops",
        "network_ops_vs_nf",
        "peak_mem_mb",
        "mem_vs_nf",
    ]
    print(
        markdown(
            [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()} for r in table], cols
        )
    )
    if args.throughput_profile:
        print(
            f"\nnetwork: the {args.throughput_profile} aten ops with the most self time, ms per step (torch.profiler, "
            "3 steps after the timed ones; matmuls of linear layers: mm/addmm/bmm, and convolution for "
            "VanillaTransformer's 1x1-convolution FFN):\n"
        )
        for name in args.throughput_models:
            if (name, "network") in rows:
                r = rows[name, "network"]
                ops = ", ".join(f"{op} {ms:g}" for op, ms in r["top_ops_ms_per_step"])
                print(f"- {name} ({r['profiled_ms_per_step']:g} ms profiled a step): {ops}")


# -- main -------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", default="ETTh1")
    parser.add_argument("--lookbacks", default="336")
    parser.add_argument("--horizons", default="96")
    parser.add_argument("--models", default=",".join([*OURS, *PEERS]))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument(
        "--max-train-batches",
        type=int,
        default=None,
        help="cap on batches per epoch (all: the protocol's epoch)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--peer-patience",
        type=int,
        default=3,
        help="the peers stop after this many epochs' validations without improvement, as our rows "
        "(experiment=ett: callbacks.early_stopping.patience=3); 0: they train every step",
    )
    parser.add_argument("--quick", action="store_true", help="tiny models, 3 batches: checks the script runs")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a train.py override for our rows (repeatable), e.g. --override data.batch_size=128; "
        "recorded in RESULTS.md's command line; our rows only (the peers keep the script's budget)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="where to write the table (default benchmarks/RESULTS.md; --quick: none)",
    )
    parser.add_argument("--throughput", action="store_true")
    parser.add_argument("--throughput-models", default=",".join(THROUGHPUT_MODELS))
    parser.add_argument("--throughput-window", type=int, nargs=2, default=[96, 96], metavar=("L", "H"))
    parser.add_argument("--throughput-steps", type=int, default=10)
    parser.add_argument("--throughput-d-model", type=int, default=64)
    parser.add_argument(
        "--throughput-profile",
        type=int,
        default=0,
        metavar="N",
        help="with --throughput: also print, per model, the N aten ops taking the most time in "
        "a network step (torch.profiler)",
    )
    parser.add_argument("--_throughput-child", dest="child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_throughput-mode", dest="child_mode", default="step", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        L, H = args.throughput_window
        print(
            json.dumps(
                throughput_child(
                    args.child,
                    L,
                    H,
                    args.throughput_steps,
                    args.throughput_d_model,
                    args.child_mode,
                    args.throughput_profile,
                )
            )
        )
        return
    if args.throughput:
        args.throughput_models = args.throughput_models.split(",")
        throughput(args)
        return
    if args.quick:
        args.max_train_batches = args.max_train_batches or 3
    datasets = args.datasets.split(",")
    lookbacks = [int(x) for x in args.lookbacks.split(",")]
    horizons = [int(x) for x in args.horizons.split(",")]
    models = args.models.split(",")
    unknown = [m for m in models if m not in OURS and m not in PEERS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {[*OURS, *PEERS]}")
    have_nf = nf_available()
    if not have_nf and any(m in PEERS for m in models):
        print("neuralforecast is not importable: the nf-* rows are skipped (pending)", file=sys.stderr)
    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    out_root = Path(tempfile.mkdtemp(prefix="tsformer-ett-"))
    grid = [(m, d, L, H) for d in datasets for L in lookbacks for H in horizons for m in models]
    measured = []
    results = args.results or (None if args.quick else REPO / "benchmarks" / "RESULTS.md")
    for d in datasets:
        for L in lookbacks:
            for H in horizons:
                dm = datamodule(d, L, H)
                p_mse, _, n_ours = persistence_ours(dm)
                n_train = dm.n_windows("train")
                per_epoch = math.ceil(n_train / BATCH)
                if args.max_train_batches:
                    per_epoch = min(per_epoch, args.max_train_batches)
                steps = args.epochs * per_epoch
                for m in models:
                    if m in PEERS and (
                        not have_nf or d in POOL
                    ):  # the peers' frame is ETT's (hourly / 15 min)
                        continue
                    row = (
                        run_ours(m, d, L, H, args, out_root)
                        if m in OURS
                        else run_peer(m, d, L, H, dm, steps, per_epoch, args)
                    )
                    # steps: our rows, the optimizer steps made (early stopping, --override data.batch_size);
                    # peers, those made of their budget (max_steps; --peer-patience may stop them earlier)
                    row.setdefault("steps", steps)
                    row.update(model=m, dataset=d, L=L, H=H, expected_windows=protocol_test_windows(d, H))
                    row.setdefault("persistence_mse_ours", p_mse)
                    if m in PEERS and not np.isclose(row["persistence_mse_peer_side"], p_mse, rtol=1e-5):
                        raise RuntimeError(
                            f"{m}: persistence MSE {row['persistence_mse_peer_side']} on the peer's side, {p_mse} on ours"
                        )
                    if m in OURS and not np.isclose(row["persistence_mse_ours"], p_mse, rtol=1e-4):
                        raise RuntimeError(
                            f"{m}: the run's naive baseline MSE {row['persistence_mse_ours']}, {p_mse} from the windows"
                        )
                    row["source"] = f"measured {stamp}" + (" (--quick)" if args.quick else "")
                    measured.append(row)
                    print(
                        f"\n{m} {d} L={L} H={H}: mse {row['mse']:.4f} mae {row['mae']:.4f}, "
                        f"{row['test_windows']} test windows (protocol {row['expected_windows']}, ours {n_ours}), "
                        f"{row['steps']} steps, {row['train_s']:.1f} s",
                        flush=True,
                    )
                    if (
                        results is not None
                    ):  # after every row: an interrupted run leaves its rows and the pending list
                        write_results(results, measured, grid, args, stamp)
    print(f"\n{stamp}, {machine()}\n")
    print(markdown(measured, COLUMNS))
    print()
    print(markdown(measured, DETAIL_COLUMNS))


if __name__ == "__main__":
    main()
