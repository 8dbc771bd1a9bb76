"""tsformer-serve under concurrent load: each job's typical request at 1, 4, 16 and 64 concurrent clients.

    OMP_NUM_THREADS=1 python benchmarks/serve_load.py --workdir /tmp/serve-bench
    OMP_NUM_THREADS=1 python benchmarks/serve_load.py --workdir /tmp/serve-bench --jobs anomaly --seconds 4
    OMP_NUM_THREADS=1 python benchmarks/serve_load.py --jobs classifier --clients 1 16 --repeat 5 --no-mlflow

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
Beside the default server (the job's model threads: `Prediction.serve_threads`), for every job: 1
thread, and 2 worker processes of 1 thread each (threads or processes); for the forecaster, `mlflow models serve` on the same run's
logged model (its uvicorn, `--env-manager local`). The client shares the machine's cores with the
server: the figures are the pair's, and the machine is shared, so compare within a run.

`--repeat R` runs every level R times on each server, the levels in order in each repetition (1, 4, 16,
64, 1, 4, ...: 1 and 16 clients alternate, so a slow minute of the machine falls on both), prints each
repetition, and then each level's throughput against 1 client's in the same repetition: the least,
median and largest ratio over the R repetitions, how far the noise moves it (8 s levels once each know
a ratio to about +-0.2: benchmarks/RESULTS_serve.md, run 7).

Last, the streaming form (`params: {"stream": key}`) in this process: the anomaly model's answer per
new row, rows sent in chunks of 1, 10 and 100, against scoring the 1,000-row table causally at once
(the best of 3 each, wall-clock and CPU time; no HTTP): in process (`Predictor.predict_stream` against
`AnomalyModel.judge(causal=True)`, text times read in both, no JSON) and served (each request's JSON
body read and its answer written as the server's worker thread does: `stream_cost`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
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
    """Every level of `args.clients` on one server, `args.repeat` times over (each repetition runs the
    levels in order, so that 1 and 16 clients alternate); a row per level and repetition."""
    server = start(command, port, workdir, workdir / f"{name}.log")
    rows = []
    try:
        rest = tree_rss(server.pid) / 2**20
        for rep in range(1, args.repeat + 1):
            for clients in args.clients:
                row = {"server": name, "idle MB": rest, "rep": rep,
                       **asyncio.run(drive(port, body, clients, args.seconds, server.pid))}  # fmt: skip
                rows.append(row)
                with (workdir / "rows.jsonl").open(
                    "a"
                ) as saved:  # kept as measured: a later failure loses none
                    saved.write(json.dumps(row) + "\n")
                print(f"  {name} rep {rep}, {clients} clients: {row['ok/s']:.1f}/s, p50 {row['p50 ms']:.0f} ms, "
                      f"errors {row['errors']}, health max {row['health max ms']:.0f} ms", flush=True)  # fmt: skip
    finally:
        stop(server)
    return rows


def ratio_spread(results: pd.DataFrame) -> pd.DataFrame:
    """Per job, server and level: its answers/s against 1 client's in the same repetition, the least,
    median and largest over the repetitions (how far the noise moves a ratio)."""
    ones = results[results.clients == 1].set_index(["job", "server", "rep"])["ok/s"]
    rows = []
    for (job, server, clients), level in results[results.clients != 1].groupby(
        ["job", "server", "clients"], sort=False
    ):
        ratio = level["ok/s"].to_numpy() / ones.loc[[(job, server, r) for r in level.rep]].to_numpy()
        rows.append({"job": job, "server": server, "clients": clients, "repetitions": len(ratio),
                     "ratio to 1 client, min": ratio.min(), "median": np.median(ratio), "max": ratio.max()})  # fmt: skip
    return pd.DataFrame(rows)


def stream_cost(folder: str, table: pd.DataFrame, repeats: int = 3) -> list[dict]:
    """Milliseconds per row, in two forms: in process (the whole table, its text times read, scored
    causally at once, against the rows streamed in chunks through `Predictor.predict_stream`), and
    served (as tsformer-serve's worker thread does it, without the HTTP: each request's JSON body read by
    `read_request`, answered as JSON text, the whole table's with the model's causal setting on; and again
    with each request's rows given to the job as their DataFrame, as a `dataframe_records` or CSV body's
    are, not as `SplitRows`). Each
    the best of `repeats`, in wall-clock time and in this process's CPU time (which the machine's other
    work moves less: it leaves out the waits for a core)."""
    from tsformer.data.schema import read_times
    from tsformer.data.split_rows import frame_of
    from tsformer.serving.predictor import Predictor
    from tsformer.serving.server import answer, answer_stream, read_request
    from tsformer.serving.streams import StreamStates

    predictor = Predictor.of_folder(folder)
    model = predictor.model
    first = max(model.detector.window, model.detector.window_length)

    def whole_table():
        yield
        model.judge(table.assign(time=read_times(table.time, None, "the table")), causal=True)

    whole_body = body_of(table)

    def whole_served():
        model.detector.hparams.causal = True  # the stream's causal row score, as `judge(causal=True)`
        yield
        answer(predictor, *read_request(whole_body, "application/json"))

    def streamed(chunk: int, n: int):
        _, state = predictor.predict_stream(None, table.iloc[:first], {})
        yield
        for at in range(first, first + n, chunk):
            _, state = predictor.predict_stream(state, table.iloc[at : at + chunk], {})

    def served(chunk: int, n: int, as_table: bool = False):
        bodies = [body_of(table.iloc[at : at + chunk], stream="s") for at in range(first, first + n, chunk)]
        streams = StreamStates(1)
        answer_stream(predictor, streams, "s", table.iloc[:first], {})
        yield
        for body in bodies:
            rows, params = read_request(body, "application/json")
            answer_stream(
                predictor, streams, params.pop("stream"), frame_of(rows) if as_table else rows, params
            )

    def served_as_table(chunk: int, n: int):
        return served(chunk, n, as_table=True)

    rows = []
    forms = [("in process", whole_table, streamed), ("served", whole_served, served)]
    forms += [("served, rows as a table", whole_served, served_as_table)]  # the DataFrame reader's cost
    for form, whole_form, stream_form in forms:
        whole = _best(whole_form, repeats) / len(table)
        rows.append({"form": form, "rows": f"whole table ({len(table)})", "ms per row": whole[0], "ratio": 1.0,
                     "CPU ms per row": whole[1], "CPU ratio": 1.0})  # fmt: skip
        for chunk in (1, 10, 100):
            n = min(len(table) - first, 200 if chunk == 1 else 600)
            per_row = _best(functools.partial(stream_form, chunk, n), repeats) / n
            rows.append({"form": form, "rows": f"stream, chunks of {chunk}", "ms per row": per_row[0],
                         "ratio": per_row[0] / whole[0], "CPU ms per row": per_row[1],
                         "CPU ratio": per_row[1] / whole[1]})  # fmt: skip
    return rows


def _best(work, repeats: int) -> np.ndarray:
    """(wall, CPU) milliseconds of `work()`'s part after its `yield` (before it: the setting up), each
    the least of `repeats` runs."""
    runs = []
    for _ in range(repeats):
        steps = work()
        next(steps)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in steps:
            pass
        runs.append((time.perf_counter() - wall, time.process_time() - cpu))
    return np.asarray(runs).min(axis=0) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/serve-bench"))
    parser.add_argument("--jobs", nargs="+", default=list(TRAININGS))
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of every level on each server, alternating"
    )
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
        variants = {"tsformer-serve": serve,  # the defaults: one process, the job's model threads
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
        table = pd.DataFrame(results)
        print(
            "\n"
            + table.drop(columns="rep" if args.repeat == 1 else []).to_markdown(index=False, floatfmt=".1f")
        )
        if 1 in args.clients and len(args.clients) > 1:
            print("\n" + ratio_spread(table).to_markdown(index=False, floatfmt=".2f"))
    if "anomaly" in args.jobs:
        cost = pd.DataFrame(stream_cost(train(args.workdir, "anomaly")["folder"], tables["anomaly"]))
        print("\n" + cost.to_markdown(index=False, floatfmt=".3f"))
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end", flush=True)


if __name__ == "__main__":
    main()
