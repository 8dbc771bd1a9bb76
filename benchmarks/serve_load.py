"""tsformer-serve under concurrent load: each job's typical request at 1, 4, 16 and 64 concurrent clients.

    OMP_NUM_THREADS=1 python benchmarks/serve_load.py --workdir /tmp/serve-bench
    OMP_NUM_THREADS=1 python benchmarks/serve_load.py --workdir /tmp/serve-bench --jobs anomaly --seconds 4

Three models are trained once into WORKDIR (a few steps each, logged to WORKDIR/mlflow.db: their speed
does not depend on their weights): a forecaster (the default `model=enc_dec`: 30 steps of history, 70
ahead), an anomaly model (`experiment=plant_anomaly`: the masked detector) and a classifier
(`experiment=plant_regime`). Their typical requests: the forecaster, one series' 200 rows (its last 70
with the known inputs only); the anomaly model, 1,000 rows of one plant; the classifier, 50 series of
one window (60 rows) each.

Each server is started as a user starts it (`tsformer-serve <model folder> --port P`, in its own
process on 127.0.0.1), and driven by `httpx`'s async client in this process: C clients each sending
the same request again as soon as answered, for `--seconds` per level. Measured per level: answers/s,
latency p50 / p95 / p99, answers other than 200 (by status), the peak resident memory of the server's
processes (sampled every 50 ms), and `/health`'s latency, asked every 50 ms meanwhile by a client in a
process of its own (in this process, the load's event loop delayed the probe's answers itself).
Beside the default server (2 model threads), for every job: 1 thread, and 2 worker processes of 1
thread each (threads or processes); for the forecaster, `mlflow models serve` on the same run's
logged model (its uvicorn, `--env-manager local`). The client shares the machine's cores with the
server: the figures are the pair's, and the machine is shared, so compare within a run.

Last, the streaming form (`params: {"stream": key}`) in this process: the anomaly model's answer per
new row, rows sent in chunks of 1, 10 and 100, against scoring the 1,000-row table causally at once
(`Predictor.predict_stream` against `AnomalyModel.judge(causal=True)`, text times read in both; the
best of 3 each; no HTTP, no JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

BIN = Path(sys.executable).parent
COMMON = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=5",
    "trainer.limit_val_batches=2",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "figures=false",
]
TRAININGS = {
    "forecaster": ["model=enc_dec", "data.source.n_series=2", "data.source.n_steps=1000"],
    "anomaly": ["experiment=plant_anomaly", "data.source.n_steps=3000"],
    "classifier": ["experiment=plant_regime", "data.source.n_series=16", "data.source.n_steps=800"],
}


def train(workdir: Path, job: str) -> dict:
    """{folder, run_id} of the job's model, trained once into workdir."""
    saved = workdir / f"{job}.json"
    if saved.is_file():
        return json.loads(saved.read_text())
    from tsformer.train import compose_config, run

    uri = f"sqlite:///{workdir}/mlflow.db"
    overrides = [*TRAININGS[job], *COMMON, f"logger.mlflow.tracking_uri={uri}"]
    with contextlib.chdir(workdir), contextlib.redirect_stdout(io.StringIO()):
        result = run(compose_config(overrides, workdir / job))
    model = {"folder": str(result.model_folder), "run_id": result.run_id}
    saved.write_text(json.dumps(model))
    return model


def requests_of() -> dict[str, pd.DataFrame]:
    """Each job's typical request table, as a client holds it (times as text)."""
    from tsformer.data.plant_anomaly import simulate_plant_anomaly
    from tsformer.data.simulators import simulate_plant, simulate_plant_regimes

    forecast = simulate_plant(n_series=1, n_steps=200, seed=5)
    forecast.loc[forecast.index[-70:], ["dynamic_temperature", "dynamic_pressure"]] = np.nan
    anomaly = simulate_plant_anomaly(n_steps=3000, seed=5)  # its last 1,000 rows of a plant hold the fault
    anomaly = anomaly[anomaly.series_id == 0].iloc[-1000:].drop(columns="label")
    classify = simulate_plant_regimes(n_series=50, n_steps=60, seed=5).drop(columns="regime")
    tables = {"forecaster": forecast, "anomaly": anomaly, "classifier": classify}
    return {job: t.astype({"time": str}).reset_index(drop=True) for job, t in tables.items()}


def body_of(table: pd.DataFrame, **params) -> bytes:
    split = json.loads(table.to_json(orient="split", index=False))
    return json.dumps({"dataframe_split": split, **({"params": params} if params else {})}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: list[str], port: int, workdir: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "MLFLOW_TRACKING_URI": f"sqlite:///{workdir}/mlflow.db"}  # fmt: skip
    server = subprocess.Popen(command, cwd=workdir, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True)  # fmt: skip
    import httpx

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"{command[0]} ended: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        time.sleep(0.5)
    raise RuntimeError(f"no answer from {command} within 300 s")


def stop(server: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def tree_rss(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.NoSuchProcess:
        return 0


async def drive(port: int, body: bytes, clients: int, seconds: float, server_pid: int) -> dict:
    """C clients in a closed loop for `seconds`, /health every 50 ms, the server's memory every 50 ms."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    latencies, statuses, peak = [], {}, [0]
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        end = time.monotonic() + seconds

        async def one_client():
            while time.monotonic() < end:
                started = time.perf_counter()
                answer = await client.post(
                    "/invocations", content=body, headers={"Content-Type": "application/json"}
                )
                latencies.append(time.perf_counter() - started)
                statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1

        async def sampler():  # the server's memory
            while time.monotonic() < end:
                peak[0] = max(peak[0], tree_rss(server_pid))
                await asyncio.sleep(0.05)

        # /health from a process of its own: this process's event loop, busy with the clients, would
        # delay the probe's answer and count its own delay as the server's
        probe = await asyncio.create_subprocess_exec(
            sys.executable, "-c", PROBE, f"{url}/health", str(seconds), stdout=asyncio.subprocess.PIPE
        )
        began = time.perf_counter()
        await asyncio.gather(sampler(), *(one_client() for _ in range(clients)))
        elapsed = time.perf_counter() - began
        health = json.loads((await probe.communicate())[0])
    ok = statuses.get(200, 0)
    ms = np.asarray(latencies) * 1000
    return {
        "clients": clients,
        "answers": sum(statuses.values()),
        "ok/s": ok / elapsed,
        "p50 ms": np.percentile(ms, 50),
        "p95 ms": np.percentile(ms, 95),
        "p99 ms": np.percentile(ms, 99),
        "errors": ", ".join(f"{n}x{s}" for s, n in sorted(statuses.items()) if s != 200) or "0",
        "peak MB": peak[0] / 2**20,
        "health p50 ms": np.percentile(health, 50) * 1000,
        "health max ms": max(health) * 1000,
    }


# /health every 50 ms for a level's seconds, in a process of its own: the latencies (s) as JSON
PROBE = """
import json, sys, time
import httpx
url, seconds, out = sys.argv[1], float(sys.argv[2]), []
with httpx.Client(timeout=30) as client:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        client.get(url)
        out.append(time.perf_counter() - started)
        time.sleep(0.05)
print(json.dumps(out))
"""


def measure(name: str, command: list[str], port: int, body: bytes, args, workdir: Path) -> list[dict]:
    server = start(command, port, workdir, workdir / f"{name}.log")
    rows = []
    try:
        rest = tree_rss(server.pid) / 2**20
        for clients in args.clients:
            row = asyncio.run(drive(port, body, clients, args.seconds, server.pid))
            rows.append({"server": name, "idle MB": rest, **row})
            with (workdir / "rows.jsonl").open("a") as saved:  # kept as measured: a later failure loses none
                saved.write(json.dumps({"server": name, "idle MB": rest, **row}) + "\n")
            print(f"  {name} {clients} clients: {row['ok/s']:.1f}/s, p50 {row['p50 ms']:.0f} ms, "
                  f"errors {row['errors']}, health max {row['health max ms']:.0f} ms", flush=True)  # fmt: skip
    finally:
        stop(server)
    return rows


def stream_cost(folder: str, table: pd.DataFrame, repeats: int = 3) -> list[dict]:
    """Seconds per row: the whole table (its text times read) scored causally at once, and the rows
    streamed in chunks (each request's text times read)."""
    from tsformer.data.schema import read_times
    from tsformer.serving.predictor import Predictor

    predictor = Predictor.of_folder(folder)
    model = predictor.model

    def whole_table():
        model.judge(table.assign(time=read_times(table.time, None, "the table")), causal=True)

    whole = min(_timed(whole_table) for _ in range(repeats)) / len(table)
    rows = [
        {"form": "whole table, causal", "chunk rows": len(table), "ms per row": whole * 1000, "ratio": 1.0}
    ]
    first = max(model.detector.window, model.detector.window_length)
    for chunk in (1, 10, 100):
        n = min(len(table) - first, 200 if chunk == 1 else 600)

        def streamed(chunk: int = chunk, n: int = n) -> float:
            _, state = predictor.predict_stream(None, table.iloc[:first], {})
            started = time.perf_counter()
            for at in range(first, first + n, chunk):
                _, state = predictor.predict_stream(state, table.iloc[at : at + chunk], {})
            return time.perf_counter() - started

        per_row = min(streamed() for _ in range(repeats)) / n  # the best of `repeats`, as the whole table's
        rows.append(
            {"form": "stream", "chunk rows": chunk, "ms per row": per_row * 1000, "ratio": per_row / whole}
        )
    return rows


def _timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/serve-bench"))
    parser.add_argument("--jobs", nargs="+", default=list(TRAININGS))
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--no-mlflow", action="store_true", help="leave out `mlflow models serve`")
    parser.add_argument("--stream-only", action="store_true", help="the anomaly stream's cost alone")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.workdir = args.workdir.resolve()
    print(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    import httpx

    tables, results = requests_of(), []
    for job in [] if args.stream_only else args.jobs:
        model = train(args.workdir, job)
        body = body_of(tables[job])
        port = free_port()
        serve = [str(BIN / "tsformer-serve"), model["folder"], "--port", str(port)]
        variants = {"tsformer-serve": serve,  # the defaults: one process of 2 model threads
                    "tsformer-serve --threads 1": [*serve, "--threads", "1"],
                    "tsformer-serve --workers 2 --threads 1": [*serve, "--workers", "2", "--threads", "1"]}  # fmt: skip
        if job == "forecaster" and not args.no_mlflow:
            uri = f"runs:/{model['run_id']}/model"
            variants["mlflow models serve"] = [str(BIN / "mlflow"), "models", "serve", "-m", uri, "-p", str(port),
                                               "--env-manager", "local"]  # fmt: skip
        print(f"{job}: request of {len(tables[job])} rows, {len(body) / 1024:.0f} KB", flush=True)
        for name, command in variants.items():
            server = start(command, port, args.workdir, args.workdir / "check.log")
            answer = httpx.post(f"http://127.0.0.1:{port}/invocations", content=body, timeout=120,
                                headers={"Content-Type": "application/json"})  # fmt: skip
            stop(server)
            if answer.status_code != 200:
                print(f"  {name}: {answer.status_code} {answer.text[:300]}: not measured", flush=True)
                continue
            results += [{"job": job, **row} for row in measure(name, command, port, body, args, args.workdir)]
    if results:
        print("\n" + pd.DataFrame(results).to_markdown(index=False, floatfmt=".1f"))
    if "anomaly" in args.jobs:
        cost = pd.DataFrame(stream_cost(train(args.workdir, "anomaly")["folder"], tables["anomaly"]))
        print("\n" + cost.to_markdown(index=False, floatfmt=".3f"))
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end", flush=True)


if __name__ == "__main__":
    main()
