"""Look at what a user sees after training: the figures of each kind of run and `mlflow ui`.

    .venv/bin/python tools/look_at_runs.py OUT [--screenshots-only] [--chromium PATH]

Trains three tiny runs into `OUT/mlflow.db` (a forecast: enc_dec on the simulated plant; a
probabilistic forecast: head=quantile; a state reconstruction: experiment=state_reconstruction),
copies each run's logged figures to `OUT/figures/<run>/`, then serves `mlflow ui` on 127.0.0.1 (a
free port) and takes headless Chromium screenshots of the experiment page and of each run's page
(`OUT/screenshots/`). `--screenshots-only` reuses the runs already in `OUT/mlflow.db`.

Not a test: what a figure or a page looks like is judged by eye (the tests check what can be
counted: labels, colour bars, legend texts, overlapping tick labels). Chromium: `apt-get install
chromium` (Debian).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# a few steps of a small model on a little data: each run takes seconds
TINY = [
    "model.net.d_model=16",
    "model.net.n_heads=2",
    "model.net.n_layers=1",
    "model.warmup_steps=2",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=2",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "data.source.n_series=2",
    "data.source.n_steps=800",
    "n_plot_windows=2",
]
RUNS = {
    "forecast": ["model=enc_dec"],
    "probabilistic": ["model=enc_dec", "head=quantile"],
    "reconstruction": ["experiment=state_reconstruction"],
}


def train(out: Path) -> dict[str, str]:
    """Train the RUNS from `out` (so that `out/mlflow.db` holds them): name -> run id."""
    from tsformer.train import compose_config, run

    os.chdir(out)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    run_ids = {}
    for name, overrides in RUNS.items():
        cfg = compose_config([*overrides, *TINY, f"logger.mlflow.run_name={name}"], out / "outputs" / name)
        run_ids[name] = run(cfg).run_id
    return run_ids


def runs_in_store(uri: str) -> tuple[str, dict[str, str]]:
    """(experiment id, run name -> run id) of the `tsformer` experiment, newest run of each name."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("tsformer")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    return experiment.experiment_id, {r.info.run_name: r.info.run_id for r in runs}


def copy_figures(uri: str, run_ids: dict[str, str], folder: Path) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    for name, run_id in run_ids.items():
        target = folder / name
        shutil.rmtree(target, ignore_errors=True)
        client.download_artifacts(run_id, "plots", str(folder))
        (folder / "plots").rename(target)
        print(f"{name}: {', '.join(sorted(p.name for p in target.iterdir()))} in {target}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def screenshots(uri: str, experiment_id: str, run_ids: dict[str, str], folder: Path, chromium: str) -> None:
    """`mlflow ui` on 127.0.0.1 only, the experiment page and each run page through headless Chromium."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen(
        [str(mlflow_cli), "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):  # the server takes seconds to start
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            raise RuntimeError(f"mlflow ui did not answer on {base}")
        # as a fresh browser opens it (the UI's "GenAI" side), then with the "Model training" switch
        # (remembered by the browser once clicked; here given in the URL)
        training = "?workflowType=machine_learning"
        pages = {
            "experiment": f"{base}/#/experiments/{experiment_id}",
            "experiment_model_training": f"{base}/#/experiments/{experiment_id}{training}",
        }
        for name, run_id in run_ids.items():
            pages[f"run_{name}"] = f"{base}/#/experiments/{experiment_id}/runs/{run_id}{training}"
        for name, url in pages.items():
            path = folder / f"{name}.png"
            height = 2600 if name.startswith("run") else 1100  # a run page is long: all of it
            subprocess.run(
                [
                    chromium,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--hide-scrollbars",
                    f"--window-size=1600,{height}",
                    "--virtual-time-budget=20000",
                    f"--screenshot={path}",
                    url,
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
            print(f"{url} -> {path}")
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help="folder for mlflow.db, run outputs, figures, screenshots")
    parser.add_argument("--screenshots-only", action="store_true", help="reuse the runs in OUT/mlflow.db")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args()
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{out / 'mlflow.db'}"
    if not args.screenshots_only:
        train(out)
    experiment_id, run_ids = runs_in_store(uri)
    run_ids = {name: run_ids[name] for name in RUNS if name in run_ids}
    copy_figures(uri, run_ids, out / "figures")
    if args.chromium is None:
        print("no Chromium found (--chromium PATH): no screenshots")
        return
    screenshots(uri, experiment_id, run_ids, out / "screenshots", args.chromium)


if __name__ == "__main__":
    main()
