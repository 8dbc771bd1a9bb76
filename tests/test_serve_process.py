"""tsformer-serve as a process, where the process is what is tested (tests/test_serve_limits.py tests the
application in-process): slow clients (a body sent a byte at a time is answered 408; headers sent a byte
at a time hold their connection only), memory after hostile requests, and SIGTERM, which finishes the
request in flight and then stops with one log line; `--workers 2` (the model's answer from either
process, /metrics the answering process's own)."""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO
from contract import BARE, free_port, json_round_trip, post, stop_process_group, wait_listening
from tsformer.serving.predictor import Predictor

FIXTURES = REPO / "tests" / "fixtures"
pytestmark = pytest.mark.slow  # a server process: its imports alone take seconds


def health(port: int) -> int:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
        return answer.status


def request_head(port: int, length: int) -> bytes:
    return (
        f"POST /invocations HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def status_of(sock: socket.socket) -> int:
    sock.settimeout(30)
    return int(sock.recv(65536).split(b" ", 2)[1])


@pytest.fixture
def server(tmp_path):
    port = free_port()
    serve = Path(sys.executable).parent / "tsformer-serve"
    command = [
        str(serve),
        str(FIXTURES / "anomaly_1"),
        "--port",
        str(port),
        "--timeout",
        "3",
        "--grace",
        "10",
    ]
    process = subprocess.Popen(
        command, cwd=tmp_path, env=BARE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        wait_listening(process, port, seconds=120)
        yield process, port
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def test_slow_clients_hostile_requests_and_sigterm(server):
    process, port = server
    table = pd.read_csv(FIXTURES / "anomaly_1_input.csv").iloc[:100]
    good = json.dumps({"dataframe_split": json.loads(table.to_json(orient="split", index=False))}).encode()
    url = f"http://127.0.0.1:{port}/invocations"
    assert post(url, good)[0] == 200
    rss = psutil.Process(process.pid).memory_info().rss

    # headers a byte at a time (slowloris): uvicorn sets no limit on them; the connection holds no
    # worker, and the server answers others meanwhile
    trickle = socket.create_connection(("127.0.0.1", port))
    for byte in request_head(port, len(good))[:20]:
        trickle.send(bytes([byte]))
        time.sleep(0.05)
    assert health(port) == 200 and post(url, good)[0] == 200
    trickle.close()
    # a body a byte a second: 408 once the time limit (--timeout 3) passes
    with socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(request_head(port, len(good)))
        sent = 0
        while not select.select([slow], [], [], 0.5)[0]:  # a byte every half second until an answer
            slow.send(good[sent : sent + 1])
            sent += 1
        assert status_of(slow) == 408 and sent < len(good)
    # hostile tables: memory back to its level once answered
    wide = json.dumps({"dataframe_split": {"columns": list(range(10**6)), "data": [[0] * 10**6]}}).encode()
    nested = b'{"dataframe_split": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    for hostile in (wide, nested, wide):
        status, answer = post(url, hostile)
        assert status == 400 and len(answer["message"]) <= 300, answer
    assert post(url, good)[0] == 200
    assert psutil.Process(process.pid).memory_info().rss < rss + 150 * 2**20

    # SIGTERM with a request in flight (its body half sent): it is answered, then the server stops
    with socket.create_connection(("127.0.0.1", port)) as in_flight:
        in_flight.sendall(request_head(port, len(good)) + good[: len(good) // 2])
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        in_flight.sendall(good[len(good) // 2 :])
        assert status_of(in_flight) == 200
    assert process.wait(timeout=20) in (0, -signal.SIGTERM)  # uvicorn raises the signal again once stopped
    lines = process.stdout.read().decode().strip().splitlines()
    assert lines[-1].startswith("INFO tsformer.serving.server: stopped: "), lines[-5:]
    assert "0 still running" in lines[-1]
    assert not [line for line in lines if "Traceback" in line]


def test_two_worker_processes_answer_the_model_and_each_reports_its_own_metrics(tmp_path):
    """`--workers 2`: the processes share the port, each with its model; an answer equals the model's,
    and a scrape of /metrics reaches one worker, whose own figures it holds (`pid`: docs/operations.md)."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "tsformer-serve"), str(FIXTURES / "anomaly_1"), "--port",
               str(port), "--workers", "2", "--threads", "1"]  # fmt: skip
    process = subprocess.Popen(command, cwd=tmp_path, env=BARE, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_listening(process, port, seconds=120)  # the port is bound before the workers load the model
        table = pd.read_csv(FIXTURES / "anomaly_1_input.csv").iloc[:60]
        good = json.dumps({"dataframe_split": json.loads(table.to_json(orient="split", index=False))})
        status, answer = post(f"http://127.0.0.1:{port}/invocations", good.encode())
        assert status == 200, answer
        expected = Predictor.of_folder(FIXTURES / "anomaly_1").predict(table)
        pd.testing.assert_frame_equal(pd.DataFrame(answer["predictions"]), json_round_trip(expected))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as scraped:
            families = list(text_string_to_metric_families(scraped.read().decode()))
        samples = {s.name: s for family in families for s in family.samples}
        workers = {str(child.pid) for child in psutil.Process(process.pid).children(recursive=True)}
        assert samples["tsformer_process"].labels["pid"] in workers  # a worker's, not the supervisor's
        # families, not samples: the scrape may reach the worker that answered no request, whose
        # requests counter (labelled by status) has no sample yet
        assert {"tsformer_model_load_seconds", "tsformer_requests"} <= {family.name for family in families}
        assert samples["tsformer_model_load_seconds"].value > 0
    finally:
        stop_process_group(process)
