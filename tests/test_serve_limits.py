"""tsformer-serve under load and hostile requests, its ASGI application in this process (no server
process: tests/test_serve_process.py starts one where the process is what is tested): the model off the
event loop, the queue's bound (503), the time limit (504), the body limit (413), tables it refuses in one
short line, /metrics, and an anomaly model's streams."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO
from tsformer.serving.pool import MODEL_NICENESS, WorkerPool
from tsformer.serving.predictor import Predictor
from tsformer.serving.server import MESSAGE_CHARS, Limits, app

FIXTURES = REPO / "tests" / "fixtures"
ROWS = {"columns": ["x"], "data": [[1.0], [2.0]]}


class Blocking:
    """A predictor whose answers wait until `go` is set (a model busy for as long as a test likes)."""

    def __init__(self):
        self.go = threading.Event()
        self.started = threading.Semaphore(0)
        self.model = SimpleNamespace()
        self.serve_threads = 1
        self.streams = False

    def predict(self, table, params=None, source=""):
        self.started.release()
        assert self.go.wait(30), "the test never let the model answer"
        return table


class Failing:
    """A predictor whose model fails on every table, with a message quoting a long column name."""

    model = SimpleNamespace()
    serve_threads = 1
    streams = False

    def predict(self, table, params=None, source=""):
        raise RuntimeError(f"cannot take column {table.columns[0]!r}\nsecond line")


def body(split: dict = ROWS, **params) -> bytes:
    return json.dumps({"dataframe_split": split, **({"params": params} if params else {})}).encode()


def serve(predictor, scenario, **limits):
    """Runs `scenario(client)` against the application answering with `predictor` within `limits`."""
    api = app(predictor, Limits(**limits))

    async def run():
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=20) as client:
            return await scenario(client)

    try:
        return asyncio.run(run())
    finally:
        api.state.pool.shutdown()


async def waiting_for(semaphore: threading.Semaphore) -> None:
    """Until the model has started on a request (a worker thread holds it)."""
    while not semaphore.acquire(blocking=False):
        await asyncio.sleep(0.01)


def one_short_line(answer: httpx.Response) -> str:
    message = answer.json()["message"]
    assert "\n" not in message and len(message) <= MESSAGE_CHARS, message
    return message


def test_health_answers_while_the_workers_are_busy_and_past_the_queue_is_503_at_once():
    model = Blocking()

    async def scenario(client):
        running = asyncio.create_task(client.post("/invocations", content=body()))
        await waiting_for(model.started)  # the one worker is busy
        waiting = asyncio.create_task(client.post("/invocations", content=body()))
        await asyncio.sleep(0.05)  # admitted: it waits for the worker
        health = await client.get("/health")  # answered by the event loop meanwhile
        refused = await client.post("/invocations", content=body())
        model.go.set()
        return (
            health,
            refused,
            await running,
            await waiting,
            await client.post("/invocations", content=body()),
        )

    health, refused, first, second, after = serve(model, scenario, threads=1, queue=1)
    assert health.status_code == 200
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "busy" in one_short_line(refused)
    assert [r.status_code for r in (first, second, after)] == [200, 200, 200]
    assert first.json()["predictions"] == [{"x": 1.0}, {"x": 2.0}]


def test_a_request_past_its_time_limit_is_504_and_its_place_comes_back_when_the_model_ends():
    model = Blocking()

    async def scenario(client):
        late = await client.post("/invocations", content=body())  # the worker stays busy after it
        refused = await client.post("/invocations", content=body())  # its place is still held
        model.go.set()
        await asyncio.sleep(0.2)
        return late, refused, await client.post("/invocations", content=body())

    late, refused, after = serve(model, scenario, threads=1, queue=0, timeout=0.3)
    assert late.status_code == 504 and "0.3 s" in one_short_line(late)
    assert refused.status_code == 503
    assert after.status_code == 200


def test_a_request_the_calls_ahead_would_keep_waiting_past_the_time_limit_is_503_at_once():
    pool = WorkerPool(workers=1, queue=10, seconds=60)

    async def scenario():
        assert pool.admit() is None
        await pool.run(lambda: time.sleep(0.05), 5)  # the mean call: what it took
        pool.seconds = 3.5 * pool.mean_call
        assert all(pool.admit() is None for _ in range(4))  # 0, 1, 2 and 3 calls ahead of it
        return pool.admit()  # 4 calls ahead: it would wait past the limit

    try:
        said = asyncio.run(scenario())
    finally:
        pool.shutdown()
    assert said.startswith("4 requests ahead, about ") and pool.admitted == 4


def test_a_body_over_the_limit_is_413_from_its_length_or_while_it_is_read():
    model = Blocking()
    model.go.set()
    big = body({"columns": ["x"], "data": [[float(i)] for i in range(2000)]})
    assert len(big) > 1024 * 10

    async def chunks():  # no Content-Length: sent chunked, counted as it is read
        for start in range(0, len(big), 1000):
            yield big[start : start + 1000]

    async def scenario(client):
        declared = await client.post("/invocations", content=big)
        streamed = await client.post("/invocations", content=chunks())
        return (
            declared,
            streamed,
            await client.get("/health"),
            await client.post("/invocations", content=body()),
        )

    declared, streamed, health, after = serve(model, scenario, max_body_mb=10 / 1024)
    assert declared.status_code == 413 and f"has {len(big)} bytes" in one_short_line(declared)
    assert streamed.status_code == 413 and "more than" in one_short_line(streamed)
    assert "chunked" not in declared.request.headers.get("transfer-encoding", "")
    assert streamed.request.headers["transfer-encoding"] == "chunked"
    assert health.status_code == 200 and after.status_code == 200


@pytest.fixture(scope="module")
def anomaly_model():
    return Predictor.of_folder(FIXTURES / "anomaly_1")


@pytest.fixture(scope="module")
def anomaly_table():
    return pd.read_csv(FIXTURES / "anomaly_1_input.csv")


def split_of(table: pd.DataFrame) -> dict:
    return json.loads(table.to_json(orient="split", index=False))


def test_hostile_requests_are_one_short_line_and_the_server_answers_the_next_good_one(
    anomaly_model, anomaly_table
):
    good = body(split_of(anomaly_table.iloc[:50]))
    nested = b'{"dataframe_split": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    wide = body({"columns": [f"c{i}" for i in range(10**6)], "data": [[0] * 10**6]})
    long_name = "x" * 100_000
    bad_cell = anomaly_table.iloc[:50].astype({"supply_voltage": object})
    bad_cell.loc[7, "supply_voltage"] = long_name
    hostile = {
        "nested 10,000 deep": (nested, 400, "nested too deep"),
        "10^6 columns": (wide, 400, "1000000 columns"),
        "a cell the model cannot read": (body(split_of(bad_cell)), 400, "row 7"),
        "a column name of 100,000 characters": (
            body(split_of(anomaly_table.iloc[:50].rename(columns={"supply_voltage": long_name}))),
            400,
            "supply_voltage",
        ),
    }

    async def scenario(client):
        answers = {}
        for name, (content, _, _) in hostile.items():
            answers[name] = (
                await client.post("/invocations", content=content),
                await client.get("/health"),
                await client.post("/invocations", content=good),
            )
        return answers

    answers = serve(anomaly_model, scenario, max_body_mb=32)
    for name, (status, says) in ((n, h[1:]) for n, h in hostile.items()):
        refused, health, after = answers[name]
        assert refused.status_code == status, (name, refused.text[:300])
        assert says in one_short_line(refused), (name, refused.json())
        assert health.status_code == 200 and after.status_code == 200, name
        assert len(after.json()["predictions"]) == 50


def test_a_model_that_fails_is_500_in_one_short_line():
    async def scenario(client):
        return await client.post("/invocations", content=body({"columns": ["y" * 5000], "data": [[1]]}))

    failed = serve(Failing(), scenario)
    assert failed.status_code == 500
    assert one_short_line(failed).startswith("the model failed on this request: RuntimeError: cannot take")


def metric_values(text: str) -> dict:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_count_requests_by_status_latency_rows_queue_and_load_time(anomaly_model, anomaly_table):
    async def scenario(client):
        await client.post("/invocations", content=body(split_of(anomaly_table.iloc[:40])))
        await client.post("/invocations", content=b"{not json")
        await client.get("/health")
        return await client.get("/metrics")

    api_metrics = serve(anomaly_model, scenario)
    assert api_metrics.headers["content-type"].startswith("text/plain")
    values = metric_values(api_metrics.text)
    invocations = (("path", "/invocations"),)
    assert values[("tsformer_requests_total", (*invocations, ("status", "200")))] == 1
    assert values[("tsformer_requests_total", (*invocations, ("status", "400")))] == 1
    assert values[("tsformer_requests_total", (("path", "/health"), ("status", "200")))] == 1
    assert values[("tsformer_request_seconds_count", invocations)] == 2
    assert values[("tsformer_rows_total", ())] == 40
    assert values[("tsformer_queue_depth", ())] == 0 and values[("tsformer_running", ())] == 0
    assert ("tsformer_model_load_seconds", ()) in values
    assert values[("tsformer_process", (("pid", str(os.getpid())),))] == 1  # the process answering


def sorted_rows(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows).sort_values(["series_id", "time"], kind="stable").reset_index(drop=True)


def test_a_stream_answers_each_new_row_once_as_the_whole_table_scored_causally(anomaly_model, anomaly_table):
    """Chunks of the table sent under one key: every row answered once, as judging the whole table
    causally answers it; a model whose job does not stream (a classifier) refuses the param in one line."""
    whole, _, _ = anomaly_model.model.judge(
        anomaly_table.assign(time=pd.to_datetime(anomaly_table.time)), causal=True
    )
    sizes = np.random.default_rng(1).integers(1, 60, size=40).cumsum()
    chunks = np.split(np.arange(len(anomaly_table)), sizes[sizes < len(anomaly_table)])

    async def scenario(client):
        answers = []
        for at in chunks:
            content = body(split_of(anomaly_table.iloc[at]), stream="plant-7")
            answers.append((await client.post("/invocations", content=content)).json())
        return answers

    answers = serve(anomaly_model, scenario)
    assert answers[0]["stream"]["new"] and not any(a["stream"]["new"] for a in answers[1:])
    streamed = sorted_rows([row for a in answers for row in a["predictions"]])
    expected = sorted_rows(json.loads(whole.to_json(orient="records", date_format="iso")))
    pd.testing.assert_frame_equal(streamed.drop(columns="event_id"), expected.drop(columns="event_id"))

    async def not_streaming(client):
        return await client.post("/invocations", content=body(stream="k"))

    model = Blocking()
    model.job, model.streams_not = SimpleNamespace(name="classification"), "params: 'stream' is not an option"
    refused = serve(model, not_streaming)
    assert refused.status_code == 400 and "'stream' is not an option" in one_short_line(refused)


def test_past_the_bound_of_streams_the_oldest_is_dropped_and_its_next_answer_says_so(
    anomaly_model, anomaly_table, caplog
):
    first, later = split_of(anomaly_table.iloc[:30]), split_of(anomaly_table.iloc[30:40])

    async def scenario(client):
        await client.post("/invocations", content=body(first, stream="a"))
        await client.post("/invocations", content=body(first, stream="b"))  # drops a
        return (await client.post("/invocations", content=body(later, stream="a"))).json()

    with caplog.at_level("WARNING", logger="tsformer.serving.streams"):
        again = serve(anomaly_model, scenario, stream_keys=1)
    assert "stream 'a' dropped: more than 1 streams kept" in caplog.text
    assert again["stream"]["new"] and "kept rows of stream 'a' were dropped" in again["stream"]["lost"]
    # its first 10 rows again are fewer than a window: kept, answered once the window is complete
    assert again["predictions"] == [] and again["stream"]["pending_rows"] == {"0": 10}


@pytest.mark.skipif(
    not hasattr(os, "setpriority") or sys.platform != "linux", reason="a thread's nice value: Linux"
)
def test_the_model_threads_leave_the_cores_to_the_event_loop_first():
    pool = WorkerPool(workers=1, queue=0)
    try:
        here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        worker = pool.executor.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        assert worker.result(timeout=10) == min(19, here + MODEL_NICENESS)
    finally:
        pool.shutdown()


def test_the_model_threads_are_its_job_s_unless_threads_is_given(anomaly_model):
    """`--threads` not given: the job's `Prediction.serve_threads` (2 for an anomaly model, whose requests
    are long tensor work; 1 for the jobs whose short requests two threads of one process answer fewer of:
    benchmarks/RESULTS_serve.md, run 6); given, it wins."""
    forecaster = Predictor.of_folder(FIXTURES / "forecaster_v2")
    sizes = {}
    for name, predictor, limits in [("anomaly", anomaly_model, Limits()), ("forecaster", forecaster, Limits()),
                                    ("given", anomaly_model, Limits(threads=3))]:  # fmt: skip
        api = app(predictor, limits)
        sizes[name] = api.state.pool.workers
        api.state.pool.shutdown()
    assert sizes == {"anomaly": 2, "forecaster": 1, "given": 3}
