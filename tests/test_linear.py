"""The closed-form linear forecaster (`models/linear.py`): as `model=linear` and as the `linear` baseline of
every forecasting run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from conftest import TINY, TINY_LINEAR
from tsformer.data.windows import WindowDataset
from tsformer.jobs.forecasting.job import loses_to
from tsformer.models.linear import PENALTIES, ChannelSharedLinear, LinearConfig
from tsformer.tasks.baselines import LinearForecast, Persistence, window_batches
from tsformer.train import build_task, compose_config, run

N, M = 12, 4


def dataset(rows: np.ndarray, target: np.ndarray, known: np.ndarray, valid: np.ndarray) -> WindowDataset:
    starts = np.arange(rows[0], rows[1] - N - M + 1)
    return WindowDataset(target, known, np.zeros((len(target), 0)), starts, N, M, valid=valid)


def numpy_rows(ds: WindowDataset, subtract: str) -> tuple[np.ndarray, np.ndarray]:
    """X (rows, N + M * Dk + 1) and Y (rows, M), written out window by window and channel by channel,
    leaving out the windows with a filled target step."""
    target, known, valid = ds.target.numpy().astype(np.float64), ds.known.numpy().astype(np.float64), ds.valid
    xs, ys = [], []
    for s in ds.starts:
        if not bool(valid[s + N : s + N + M].all()):
            continue
        for c in range(target.shape[1]):
            hist, fut = target[s : s + N, c], target[s + N : s + N + M, c]
            ref = hist[-1] if subtract == "last" else hist.mean()
            xs.append(np.concatenate([hist - ref, known[s + N : s + N + M].ravel(), [1.0]]))
            ys.append(fut - ref)
    return np.array(xs), np.array(ys)


@pytest.mark.parametrize("subtract", ["last", "mean"])
def test_the_fit_is_numpy_s_solution_of_the_same_normal_equations(subtract):
    rng = np.random.default_rng(0)
    rows = 400
    known = rng.normal(size=(rows, 2)).astype(np.float32)
    target = np.cumsum(rng.normal(size=(rows, 3)), axis=0).astype(np.float32) + known[:, :1]
    valid = np.ones(rows, dtype=bool)
    valid[[100, 330]] = False  # filled rows: the windows that would learn from them are left out
    train, val = dataset((0, 280), target, known, valid), dataset((280, rows), target, known, valid)

    model = ChannelSharedLinear(LinearConfig(N, M, d_known=2, subtract=subtract))
    scores = model.fit(window_batches(train, batch_size=50), window_batches(val, batch_size=50))

    x, y = numpy_rows(train, subtract)
    xv, yv = numpy_rows(val, subtract)
    assert len(x) < 3 * len(train.starts)  # some windows were left out
    xtx = x.T @ x
    expected = {}
    for penalty in PENALTIES:
        ridge = np.diag(np.r_[np.full(len(xtx) - 1, penalty * xtx.diagonal()[:-1].mean()), 0.0])
        weight = np.linalg.solve(xtx + ridge, x.T @ y)
        expected[penalty] = (weight, float(((xv @ weight - yv) ** 2).mean()))
    assert scores == pytest.approx({p: mse for p, (_, mse) in expected.items()}, rel=1e-6)
    best = min(expected, key=lambda p: expected[p][1])
    assert float(model.penalty) == best
    np.testing.assert_allclose(model.weight.numpy(), expected[best][0], rtol=1e-4, atol=1e-5)

    # and the forecast is the reference plus X W, per channel
    batch = next(iter(window_batches(val, batch_size=len(val))))
    pred = model(batch["hist_target"], batch["fut_known"]).double().numpy()  # (B, M, C)
    hist = batch["hist_target"].double().numpy()
    ref = hist[:, -1:] if subtract == "last" else hist.mean(axis=1, keepdims=True)
    x_all = np.concatenate(
        [
            (hist - ref).transpose(0, 2, 1),  # (B, C, N)
            np.repeat(batch["fut_known"].double().numpy().reshape(len(hist), 1, -1), 3, axis=1),
            np.ones((len(hist), 3, 1)),
        ],
        axis=2,
    )  # (B, C, P)
    np.testing.assert_allclose(pred, (x_all @ expected[best][0]).transpose(0, 2, 1) + ref, atol=1e-4)


def test_a_bad_setting_is_one_line_naming_it(tmp_path):
    from hydra.utils import instantiate

    cfg = compose_config(["model=linear", *TINY_LINEAR, "+model.net.d_model=16"], tmp_path)
    dm = instantiate(cfg.data)
    dm.setup()
    with pytest.raises(
        Exception, match=r"model\.net: the linear forecaster has no network settings, got \['d_model'\]"
    ):
        build_task(cfg.model, dm)
    with pytest.raises(ValueError, match=r"model\.subtract: 'first' is not one of last, mean"):
        LinearConfig(N, M, subtract="first")
    with pytest.raises(ValueError, match=r"model\.penalties"):
        LinearConfig(N, M, penalties=(-1.0,))


def test_every_forecasting_task_measures_persistence_and_the_linear_forecaster(tmp_path):
    from hydra.utils import instantiate

    for model in ("enc_dec", "dec_only", "enc_only_forecast", "linear"):
        cfg = compose_config(
            [f"model={model}", *(TINY_LINEAR if model == "linear" else TINY)], tmp_path / model
        )
        dm = instantiate(cfg.data)
        dm.setup()
        task = build_task(cfg.model, dm)
        assert [b.name for b in task.baselines] == ["baseline", "linear"], model


def test_a_model_that_loses_says_so_in_one_line():
    baselines = [Persistence(), LinearForecast()]
    metrics = {"test/mse": 0.5, "test/baseline_mse": 0.6, "test/linear_mse": 0.4}
    (line,) = loses_to(metrics, baselines)
    assert "linear 0.4000 (1.25x)" in line and "baseline" not in line.split("against")[1]
    (line,) = loses_to(metrics | {"test/mse": 7.2}, baselines)
    assert "2 baseline(s)" in line and "baseline 0.6000 (12.00x)" in line
    assert loses_to(metrics | {"test/mse": 0.3}, baselines) == []


@pytest.mark.slow
def test_model_linear_trains_in_one_epoch_and_equals_its_linear_baseline(in_tmp, capsys):
    cfg = compose_config(
        ["model=linear", *TINY_LINEAR, "trainer.max_epochs=5", "figures=true"], in_tmp / "out"
    )
    result = run(cfg)
    printed = capsys.readouterr().out
    metrics = result.metrics
    # the model is the closed-form solution the baseline also is: the same fit, the same windows
    for name in ("mse", "mae", "mae_orig", "rmse_orig"):
        assert metrics[f"test/{name}"] == pytest.approx(metrics[f"test/linear_{name}"], rel=1e-5), name
    assert metrics["test/mse"] < metrics["test/baseline_mse"]  # the plant's dynamics are nearly linear
    client = MlflowClient(f"sqlite:///{in_tmp}/mlflow.db")
    logged = client.get_run(result.run_id).data
    assert logged.tags["family"] == "linear"
    assert {"train/loss", "val/mse", "test/linear_mae_orig"} <= set(logged.metrics)
    history = client.get_metric_history(result.run_id, "val/mse")
    assert len(history) == 1  # one epoch, though trainer.max_epochs=5
    plots = {a.path for a in client.list_artifacts(result.run_id, "plots")}
    assert "plots/error_by_step.png" in plots and "plots/attention.png" not in plots
    assert "linear: ridge regression" in printed and "loses to" not in printed
    # the model folder holds the solved weights and the chosen penalty, as a state_dict (no pickle)
    weights = torch.load(result.model_folder / "weights.pt", weights_only=True)
    assert float(weights["net.penalty"]) in PENALTIES and weights["net.weight"].abs().sum() > 0


def test_a_linear_path_starts_the_transformer_from_the_linear_forecast(tmp_path):
    from hydra.utils import instantiate

    # RevIN and channel independence included: the linear forecast enters the network's view as a target
    options = ["model.revin=true", "model.channel_independent=true", "model.linear_path=true"]
    cfg_overrides = ["model=enc_only_forecast", *TINY, *options]
    cfg = compose_config(cfg_overrides, tmp_path)
    dm = instantiate(cfg.data)
    dm.setup()
    task = build_task(cfg.model, dm)
    task.fit_linear_path(dm)
    baseline = LinearForecast()
    baseline.fit(dm.datasets["train"], dm.features, dm.frame, val=dm.datasets["val"])
    batch = next(iter(dm.test_dataloader()))
    with torch.no_grad():
        torch.testing.assert_close(task.eval().forecast(batch), baseline.predict(batch), rtol=1e-4, atol=1e-4)
    assert task.linear_path.weight.requires_grad  # trained on with the Transformer
    frozen = build_task(compose_config([*cfg_overrides, "model.linear_path_frozen=true"], tmp_path).model, dm)
    assert not frozen.linear_path.weight.requires_grad
    with pytest.raises(Exception, match="model.linear_path takes the point head"):
        build_task(
            compose_config(
                ["model=enc_only_forecast", *TINY, "model.linear_path=true", "head=gaussian"], tmp_path
            ).model,
            dm,
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(["model=enc_only_forecast", *TINY, "model.linear_path=true"], id="linear_path"),
        pytest.param(["model=enc_only_forecast", *TINY, "model.linear_gate=step"], id="gate_reference"),
        pytest.param(["model=linear", *TINY_LINEAR], id="model_linear"),
    ],
)
def test_the_linear_baseline_takes_the_tasks_own_solve_with_test_linear_mse_unchanged(
    overrides, tmp_path, monkeypatch
):
    """Where the task solved the same linear forecaster on the same windows at the fit's start (its linear
    path, its gate's reference, model=linear's network), the `linear` baseline takes that solve instead of
    solving the same equations again; test/linear_mse is that of a baseline solved on its own, to the bit."""
    import lightning as L
    from hydra.utils import instantiate

    cfg = compose_config(overrides, tmp_path)
    dm = instantiate(cfg.data)
    dm.setup()
    task = build_task(cfg.model, dm)
    task.set_target_scaling(dm.features.target_scaler)
    solves = []
    fit = ChannelSharedLinear.fit
    monkeypatch.setattr(ChannelSharedLinear, "fit", lambda self, *a: solves.append(1) or fit(self, *a))
    trainer = L.Trainer(
        max_steps=3, limit_val_batches=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(task, datamodule=dm)
    reused = trainer.test(task, datamodule=dm, verbose=False)[0]
    assert len(solves) == 1  # the task's own solve only: the baseline took it
    (linear,) = [b for b in task.baselines if isinstance(b, LinearForecast)]
    linear.solved = None  # the baseline solved on its own, on the same windows
    alone = trainer.test(task, datamodule=dm, verbose=False)[0]
    assert len(solves) == 2
    for name in ("mse", "mae", "mae_orig", "rmse_orig"):
        assert reused[f"test/linear_{name}"] == alone[f"test/linear_{name}"], name
