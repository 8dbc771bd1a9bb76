"""`Metrics`: what tsformer-serve reports at `GET /metrics`, in Prometheus' text format (prometheus_client).

- `tsformer_requests_total{path, status}`: requests answered, by path and status
- `tsformer_request_seconds{path}`: a histogram of the time from a request's arrival to its answer
- `tsformer_rows_total`: rows of the tables answered
- `tsformer_queue_depth`: requests waiting for a worker; `tsformer_running`: requests being answered
- `tsformer_streams`: streams whose state is kept
- `tsformer_model_load_seconds`: how long loading the model took at start
- `tsformer_process{pid}`: 1, labelled with the id of the process that answered the scrape

Each application has its own registry (not prometheus_client's global one), so that several in one
process (tests) count apart. Paths that are no route of the server are counted as `other`. With
`--workers N`, each process counts its own requests and a scrape reaches one of them (its `pid` says
which): the figures are per process, not the server's sum.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

PATHS = ("/invocations", "/health", "/ping", "/version", "/metrics")
# latency buckets (seconds): a small table answers in milliseconds, a large one or a queue in seconds
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, pool, streams, load_seconds: float):
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "tsformer_requests",
            "Requests answered, by path and status",
            ["path", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "tsformer_request_seconds", "Seconds from a request's arrival to its answer", ["path"],
            buckets=BUCKETS, registry=registry,
        )  # fmt: skip
        self.rows = Counter("tsformer_rows", "Rows of the tables answered", registry=registry)
        Gauge("tsformer_queue_depth", "Requests waiting for a worker", registry=registry).set_function(
            lambda: pool.waiting
        )
        Gauge("tsformer_running", "Requests being answered by a worker", registry=registry).set_function(
            lambda: pool.running
        )
        Gauge("tsformer_streams", "Streams whose state is kept", registry=registry).set_function(
            lambda: len(streams)
        )
        Gauge("tsformer_model_load_seconds", "Seconds the model took to load", registry=registry).set(
            load_seconds
        )
        Gauge("tsformer_process", "1, labelled with the id of the process answering", ["pid"],
              registry=registry).labels(str(os.getpid())).set(1)  # fmt: skip
        self._total = 0

    def answered(self, path: str, status: int, seconds: float) -> None:
        path = path if path in PATHS else "other"
        self.requests.labels(path, str(status)).inc()
        self.latency.labels(path).observe(seconds)
        self._total += 1

    def total(self) -> int:
        """Requests answered since the start."""
        return self._total

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
