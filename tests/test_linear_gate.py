"""The linear gate (`model.linear_gate`, `tasks/linear_gate.py`): the Transformer's share of the forecast
is chosen on validation windows, and where its correction does not help the forecast is exactly the
run's own linear forecaster's."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import TINY
from tsformer.jobs import load_model
from tsformer.jobs.forecasting.forecaster import ModelInfo, save_model_folder
from tsformer.tasks.baselines import window_batches
from tsformer.tasks.linear_gate import GATES, GateSums, fit_gate
from tsformer.train import compose_config, fit_task, run


def sums_of(r: torch.Tensor, c: torch.Tensor) -> GateSums:
    """GateSums of residuals `r` and corrections `c` (W, M, Dy), y = r and linear = 0."""
    sums = GateSums(len(r), r.shape[1], r.shape[2])
    for part in torch.split(torch.arange(len(r)), 100):  # in time order, batch by batch
        sums.add(
            r[part], torch.zeros_like(r[part]), c[part], torch.ones(len(part), r.shape[1], dtype=torch.bool)
        )
    return sums


@pytest.mark.parametrize("form", GATES[1:])
def test_a_correction_of_pure_noise_gets_no_share_and_a_real_one_keeps_it(form):
    g = torch.Generator().manual_seed(0)
    r = torch.randn(2000, 6, 3, generator=g, dtype=torch.float64)  # what the linear forecaster misses
    noise = torch.randn(2000, 6, 3, generator=g, dtype=torch.float64)
    share, report = fit_gate(sums_of(r, noise), form)
    assert share.shape == (6, 3) and torch.equal(share, torch.zeros(6, 3))
    assert report["gate/val_mse_gated"] == report["gate/val_mse_linear"]
    assert report["gate/val_mse_model"] > report["gate/val_mse_linear"]  # the ungated model is worse
    # a correction that is what is missed plus as much noise: kept, at the least-squares share <r, c> / <c, c>
    share, report = fit_gate(sums_of(r, r + noise), form)
    assert torch.all((share > 0.4) & (share < 0.6))  # about 1 / 2
    assert report["gate/val_mse_gated"] < 0.6 * report["gate/val_mse_linear"]  # about half
    assert report["gate/kept_groups"] == 1.0


def test_the_share_is_per_group_of_its_form():
    g = torch.Generator().manual_seed(1)
    r = torch.randn(2000, 4, 2, generator=g, dtype=torch.float64)
    c = torch.randn(2000, 4, 2, generator=g, dtype=torch.float64)
    c[..., 0] = r[..., 0]  # channel 0: the exact residual; channel 1: noise
    share, _ = fit_gate(sums_of(r, c), "channel")
    assert torch.allclose(share[:, 0], torch.ones(4)) and torch.equal(share[:, 1], torch.zeros(4))
    c = torch.randn(2000, 4, 2, generator=g, dtype=torch.float64)
    c[:, :2] = r[:, :2]  # the first two steps only
    share, _ = fit_gate(sums_of(r, c), "step")
    assert torch.allclose(share[:2], torch.ones(2, 2)) and torch.equal(share[2:], torch.zeros(2, 2))


def table(values: np.ndarray) -> pd.DataFrame:
    times = pd.date_range("2020-01-01", periods=len(values), freq="h")
    return pd.DataFrame({"time": times, **{f"x{i}": values[:, i] for i in range(values.shape[1])}})


def gate_overrides(
    path, gate: str, n_channels: int, *extra: str, model: str = "enc_only_forecast"
) -> list[str]:
    return [
        f"model={model}",
        *[o for o in TINY if not o.startswith("data.source")],
        "data=csv",
        f"data.source={path}",
        "data.series_col=null",
        f"data.target_cols=[{','.join(f'x{i}' for i in range(n_channels))}]",
        "model.context_len=16",
        "model.horizon=4",
        "model.linear_path=true",
        f"model.linear_gate={gate}",
        "model.lr=1e-2",
        "model.warmup_steps=0",
        "trainer.limit_val_batches=null",
        *extra,
    ]


def random_walks(rows: int, seed: int = 0) -> np.ndarray:
    """Two random walks: the last value (the linear forecaster's, which subtracts it) is the best forecast
    there is, so whatever the Transformer adds is noise."""
    return np.random.default_rng(seed).normal(size=(rows, 2)).cumsum(axis=0)


def test_on_noise_the_gated_forecast_is_the_linear_forecaster_s(in_tmp):
    path = in_tmp / "walks.csv"
    table(random_walks(1200)).to_csv(path, index=False)
    result = run(
        compose_config(gate_overrides(path, "channel", 2, "trainer.limit_train_batches=20"), in_tmp / "run")
    )
    m = result.metrics
    assert m["gate/mean_share"] == 0.0 and m["gate/val_mse_gated"] == m["gate/val_mse_linear"]
    assert m["test/mse"] == m["test/linear_mse"]  # exactly the same-run linear forecaster
    # the model folder keeps the share: predict.py, serve and pyfunc forecast as the run's test did
    task = load_model(result.model_folder).task
    assert task.gated and torch.equal(task.linear_gate_share, torch.zeros(4, 2))
    # a folder written before the gate (no setting, no gate weights) loads as it did: not gated
    older = in_tmp / "older"
    shutil.copytree(result.model_folder, older)
    config = json.loads((older / "tsformer.json").read_text())
    del config["hparams"]["linear_gate"], config["hparams"]["channel_mixing"]
    (older / "tsformer.json").write_text(json.dumps(config))
    weights = torch.load(older / "weights.pt", weights_only=True)
    kept = {k: v for k, v in weights.items() if not k.startswith(("linear_gate", "linear_reference"))}
    assert len(kept) < len(weights)
    torch.save(kept, older / "weights.pt")
    old_task = load_model(older).task
    assert old_task.linear_reference is None and not old_task.gated
    # switched off, the same training gives the model's own forecast, not the linear one
    ungated = fit_task(
        compose_config(gate_overrides(path, "none", 2, "trainer.limit_train_batches=20"), in_tmp / "u")
    )
    assert ungated.metrics["test/mse"] != ungated.metrics["test/linear_mse"]
    assert not any(k.startswith("gate/") for k in ungated.metrics)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model,extra",
    [
        pytest.param("enc_dec", [], id="enc_dec"),  # fed back step by step, no linear path
        pytest.param(
            "enc_dec", ["model.net.feed_back=false", "model.net.decoder_patch_len=2"], id="enc_dec-direct"
        ),
        pytest.param("dec_only", [], id="dec_only"),
    ],
)
def test_the_gate_weighs_every_family_s_forecast(model, extra, in_tmp):
    """The gate is declared once for every Transformer family: it weighs the finished (generated)
    forecast, so on noise an autoregressive family's forecast is exactly the linear forecaster's too."""
    path = in_tmp / "walks.csv"
    table(random_walks(1200)).to_csv(path, index=False)
    overrides = gate_overrides(path, "channel", 2, "trainer.limit_train_batches=20", *extra, model=model)
    trained = fit_task(
        compose_config([o for o in overrides if o != "model.linear_path=true"], in_tmp / "run")
    )
    m, task = trained.metrics, trained.task
    assert task.family == model and task.linear_path is None  # gated without the linear path
    assert m["gate/mean_share"] == 0.0 and m["test/mse"] == m["test/linear_mse"]
    assert m["test/gate_ungated_mse"] != m["test/mse"]  # the family's own forecast differs
    batch = next(iter(window_batches(trained.datamodule.datasets["test"])))
    with torch.no_grad():
        linear = task.linear_reference(batch["hist_target"], batch["fut_known"])
        torch.testing.assert_close(task.forecast(batch), linear, rtol=0, atol=0)
    # the model folder keeps the family's share: predict.py, serve and pyfunc forecast as the test did
    save_model_folder(in_tmp / "model", task, trained.datamodule, ModelInfo(family=model, dataset="walks"))
    loaded = load_model(in_tmp / "model").task
    assert loaded.gated and torch.equal(loaded.linear_gate_share, task.linear_gate_share)
    with torch.no_grad():
        torch.testing.assert_close(loaded.forecast(batch), linear, rtol=0, atol=0)


def logistic_map(rows: int) -> np.ndarray:
    """x[t + 1] = 3.9 x[t] (1 - x[t]): a nonlinear map a window's linear function cannot follow."""
    x = np.empty((rows, 1))
    x[0] = 0.3
    for t in range(1, rows):
        x[t] = 3.9 * x[t - 1] * (1 - x[t - 1])
    return x


def test_with_a_nonlinear_component_the_gate_keeps_the_correction(tmp_path):
    path = tmp_path / "logistic.csv"
    table(logistic_map(1200)).to_csv(path, index=False)
    overrides = gate_overrides(path, "global", 1, "trainer.limit_train_batches=null", "trainer.max_epochs=8")
    trained = fit_task(compose_config(overrides, tmp_path / "run"))
    m, task = trained.metrics, trained.task
    assert 0.0 < m["gate/mean_share"] <= 1.0
    assert m["gate/val_mse_gated"] < 0.9 * m["gate/val_mse_linear"]
    assert m["test/mse"] < m["test/linear_mse"]
    # every form scored on the test windows beside the configured one (global), and the model ungated
    assert m["test/gate_global_mse"] == pytest.approx(m["test/mse"], rel=1e-5)
    assert {"test/gate_step_mse", "test/gate_channel_mse", "test/gate_ungated_mse"} <= set(m)
    # the gated forecast is linear + share x (model - linear), the linear forecaster's solved weights
    batch = next(iter(window_batches(trained.datamodule.datasets["val"])))
    with torch.no_grad():
        gated = task.forecast(batch)
        task.linear_gate_fitted.fill_(False)
        model, linear = task.forecast(batch), task.linear_reference(batch["hist_target"], batch["fut_known"])
    torch.testing.assert_close(gated, linear + task.linear_gate_share * (model - linear))
