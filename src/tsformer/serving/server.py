"""`tsformer-serve MODEL [--host 127.0.0.1] [--port 5001] [limits]`: a trained model answers over HTTP.

MODEL is what `predict.py` takes (a run id, `runs:/` or `models:/` URI, or a folder; `--tracking-uri`
as there). Requests and answers follow MLflow's scoring protocol (those of `mlflow models serve`), so
that MLflow's clients and examples work:

- `POST /invocations` with a JSON body `{"dataframe_split": {"columns": [...], "data": [[...], ...]}}`
  or `{"dataframe_records": [{...}, ...]}`, optionally `"params"`: the options of the model's job, as
  predict.py's (`{"origin": "2024-05-01 12:00"}` for a forecaster, `{"impute": true}` for a fill-in
  model); or a CSV body (`Content-Type: text/csv`). The table is laid out as for `predict.py`, times as
  text in the training data's format.
- The answer: `{"predictions": [{column: value, ...}, ...]}`, the rows of `predict.py`'s CSV (both answer
  through `serving.predictor.Predictor`), missing values as `null` (valid JSON), times as ISO text
  (`2024-01-01T02:09:00.000`) for every job; the tables predict.py writes beside its CSV under their
  names (e.g. `"events"`).
- `"params": {"stream": "<key>"}`, for a model whose job answers rows as they arrive
  (`Predictor.streams`): the server keeps the key's state, and the table holds the new rows only; the
  answer says `"stream": {"key", "new", "lost", ...}` (docs/operations.md).
- A table the model cannot take: status 400 and `{"error_code": "BAD_REQUEST", "message": "..."}`, the
  one line `predict.py` prints, no stack trace (MLflow's server answers with the whole trace); no
  message holds more than `MESSAGE_CHARS` characters.
- Under load (`Limits`): the model runs in a pool of worker threads, never on the event loop, so
  `/health` answers while they work; past the queue's bound 503 with `Retry-After`; a body over the limit
  413 (from Content-Length, or while it is read); a body slower than the time limit 408; a request past
  its time limit 504.
- `GET /ping`, `/health`: 200 once the model is loaded; `GET /version`: the tsformer version; `GET
  /metrics`: Prometheus' text format (`serving.metrics`).
- One line per request in the log: method, path, status, seconds; SIGTERM (or Ctrl+C) finishes the
  requests in flight, up to `--grace` seconds, then one line says the server stopped.

The server runs in this process (uvicorn imported, not started from PATH as `mlflow models serve` does,
which fails unless the virtual environment is activated).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd
from fastapi import FastAPI, Request  # at module level: FastAPI reads the handlers' annotations here
from fastapi.responses import Response

from tsformer import __version__
from tsformer.data.schema import DataValidationError
from tsformer.data.split_rows import SplitRows
from tsformer.serving.metrics import Metrics
from tsformer.serving.pool import TimeLimit, WorkerPool
from tsformer.serving.streams import StreamStates
from tsformer.tracking import TrackingServerUnreachable

log = logging.getLogger(__name__)

DEFAULT_PORT = 5001  # `mlflow ui` takes 5000
MESSAGE_CHARS = 300  # the most of a message an answer holds (a message may quote the request)


@dataclass(frozen=True)
class Limits:
    """What the server holds at once, and for how long (the command's options; docs/operations.md).
    The defaults suit a 2-core machine."""

    threads: int | None = None  # threads running the model (parse, predict, answer), per process; None:
    # the model's job's (`Prediction.serve_threads`)
    workers: int = 1  # server processes (uvicorn's workers), each loading the model
    queue: int = 64  # requests waiting for a thread, per process; more at once are answered 503
    timeout: float = 60.0  # seconds from a request's arrival to its answer (504; 408 for its body)
    max_body_mb: float = 16.0  # request bodies over it are answered 413
    max_columns: int = 10_000  # tables of more columns are refused (400) before they are built
    stream_keys: int = 1000  # streams kept; past it, the least recently used is dropped
    grace: float = 30.0  # seconds SIGTERM waits for the requests in flight
    max_connections: int = 512  # open connections (uvicorn's limit_concurrency: 503 past it)

    @property
    def max_body(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)


class BadRequest(ValueError):
    """A request the model cannot answer: its message is the answer's one line."""


class Refused(Exception):
    """A request answered with an error status before the model sees it: (status, error code, message)."""

    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.headers = status, code, headers or {}


def one_line(text: str) -> str:
    """The first line of `text`, at most `MESSAGE_CHARS` characters."""
    first = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return first if len(first) <= MESSAGE_CHARS else first[: MESSAGE_CHARS - 3] + "..."


def read_request(
    body: bytes, content_type: str, csv_options: dict | None = None, max_columns: int | None = None
) -> tuple[pd.DataFrame | SplitRows, dict]:
    """(table, params) of an /invocations request in MLflow's formats (see the module docstring; a
    stream's `dataframe_split` rows as `SplitRows`, `_table_of_json`); a CSV
    body is read with `csv_options` (the training file's separator, decimal mark, encoding). A table of
    more than `max_columns` columns is refused before it is built."""
    mime = (content_type or "application/json").split(";")[0].strip().lower()
    if mime == "text/csv":
        options = {k: v for k, v in (csv_options or {}).items() if v is not None}
        _check_columns(_csv_columns(body, options.get("sep", ",")), max_columns)
        try:
            return pd.read_csv(io.BytesIO(body), **options), {}
        except (ValueError, UnicodeDecodeError) as err:  # pandas' parser errors are ValueErrors
            raise BadRequest(f"the CSV body cannot be read: {one_line(err)}") from err
    if mime != "application/json":
        raise BadRequest(f"Content-Type {one_line(mime)!r}: send application/json or text/csv")
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadRequest(f"the body is not JSON: {err}") from err
    except RecursionError:  # Python's parser refuses a nesting deeper than its recursion limit
        raise BadRequest("the body is JSON nested too deep (a table is two levels deep)") from None
    return _table_of_json(payload, max_columns)


def _csv_columns(body: bytes, sep: str) -> int:
    header = body[: body.find(b"\n")] if b"\n" in body else body
    return header.count(sep.encode() if isinstance(sep, str) else b",") + 1


def _check_columns(n: int, max_columns: int | None) -> None:
    if max_columns is not None and n > max_columns:
        raise BadRequest(
            f"the table has {n} columns, more than the server takes ({max_columns}: --max-columns)"
        )


def _table_of_json(payload, max_columns: int | None = None) -> tuple[pd.DataFrame | SplitRows, dict]:
    """(table, params) of a JSON request: `dataframe_split` or `dataframe_records`, and `params`; a
    stream's `dataframe_split` as `SplitRows` (its job reads those, or their `frame`)."""
    params = payload.get("params") or {} if isinstance(payload, dict) else {}
    if isinstance(payload, dict) and isinstance(payload.get("dataframe_split"), dict):
        split = payload["dataframe_split"]
        columns, data = split.get("columns"), split.get("data")
        widest = (
            max((len(row) for row in data if isinstance(row, list)), default=0)
            if isinstance(data, list)
            else 0
        )
        _check_columns(max(len(columns) if isinstance(columns, list) else 0, widest), max_columns)
        rows = SplitRows.of(columns, data) if isinstance(params, dict) and "stream" in params else None
        if rows is not None:  # a stream's few rows: its job reads them without building a table
            return rows, params
        try:
            return pd.DataFrame(data, columns=columns), params
        except (ValueError, TypeError) as err:
            raise BadRequest(f"dataframe_split: {one_line(err)}") from err
    if isinstance(payload, dict) and isinstance(payload.get("dataframe_records"), list):
        records = payload["dataframe_records"]
        _check_columns(max((len(r) for r in records if isinstance(r, dict)), default=0), max_columns)
        try:
            return pd.DataFrame.from_records(records), params
        except (ValueError, TypeError, AttributeError) as err:
            raise BadRequest(f"dataframe_records: {one_line(err)}") from err
    raise BadRequest(
        'the JSON body holds the table as "dataframe_split" ({"columns": [...], "data": [[...]]}) '
        'or "dataframe_records" ([{column: value}, ...])'
    )


def _refusal(err: Exception) -> BadRequest:
    return BadRequest(one_line(err) or type(err).__name__)


def answer(predictor, table: pd.DataFrame, params: dict) -> str:
    """The JSON answer to a table: `{"predictions": [...]}`, the rows of `predictor.predict(table,
    params)` (a `Predictor`), missing values null, times ISO text; the tables of the answer's
    `attrs["beside"]` under their names."""
    try:
        result = predictor.predict(table, params, source="the request's table")
    except (DataValidationError, ValueError, KeyError) as err:
        raise _refusal(err) from err
    return answer_of(result)


def answer_stream(
    predictor, streams: StreamStates, key, table: pd.DataFrame | SplitRows, params: dict
) -> str:
    """The JSON answer to the new rows of stream `key` (`Predictor.predict_stream`, the key's state kept
    in `streams`): as `answer`, and `"stream"`: the key, whether it started now, whether its state was
    lost, and what the job says of it (`attrs["stream"]`)."""
    try:
        key = streams.checked_key(key)
        if not predictor.streams:
            raise ValueError(predictor.streams_not)
        result, said = streams.answer(
            key, lambda state: predictor.predict_stream(state, table, params, source="the request's table")
        )
    except (DataValidationError, ValueError, KeyError) as err:
        raise _refusal(err) from err
    return answer_of(result, {"stream": {**said, **result.attrs.get("stream", {})}})


def answer_of(result: pd.DataFrame, extra: dict | None = None) -> str:
    parts = ['"predictions": ' + answer_json(result)]
    parts += [
        f"{json.dumps(name)}: {answer_json(frame)}" for name, frame in result.attrs.get("beside", {}).items()
    ]
    parts += [f"{json.dumps(name)}: {json.dumps(value)}" for name, value in (extra or {}).items()]
    return "{" + ", ".join(parts) + "}"


def answer_json(frame: pd.DataFrame) -> str:
    """The rows of an answer as a JSON list of objects: missing values null (json.dumps would write
    NaN, which JSON parsers refuse), times ISO text (`2024-01-01T02:09:00.000`)."""
    if len(frame) == 0:  # a stream's usual events table: pandas' writer is a stream row's fixed cost
        return "[]"
    return frame.to_json(orient="records", date_format="iso")


def error_response(status: int, code: str, message: str, headers: dict | None = None) -> Response:
    body = json.dumps({"error_code": code, "message": one_line(message)})
    return Response(content=body, status_code=status, media_type="application/json", headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) as soon as it is known to pass `limit` bytes: from its
    Content-Length, or while it is read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Refused(413, "REQUEST_TOO_LARGE", _too_large(int(declared), limit))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(413, "REQUEST_TOO_LARGE", _too_large(size, limit, "more than "))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int, more: str = "") -> str:
    return f"the body has {more}{size} bytes; the server takes at most {limit} (--max-body-mb)"


async def admitted_body(request: Request, pool: WorkerPool, limits: Limits) -> bytes:
    """The body of a request given a place in `pool` (`Refused` when there is none: 503), read within
    the body limit (413) and the time limit (408); the place is given back if it is refused."""
    busy = pool.admit()
    if busy is not None:
        message = f"the server is busy ({busy}; --threads {limits.threads}, --queue {limits.queue}): retry"
        raise Refused(503, "TEMPORARILY_UNAVAILABLE", message, {"Retry-After": "1"})
    try:
        return await asyncio.wait_for(read_body(request, limits.max_body), limits.timeout)
    except asyncio.TimeoutError:
        pool.release()
        raise Refused(
            408, "REQUEST_TIMEOUT", f"the body did not arrive within {limits.timeout:g} s (--timeout)"
        ) from None
    except BaseException:
        pool.release()
        raise


def with_model_threads(limits: Limits, predictor) -> Limits:
    """`limits` with its threads the model's job's where `--threads` was not given."""
    if limits.threads is not None:
        return limits
    return replace(limits, threads=predictor.serve_threads)


def app(predictor, limits: Limits | None = None, load_seconds: float = 0.0):
    """The FastAPI application answering with `predictor` (a `Predictor`; its model's CSV options read
    a CSV body) within `limits`, one access line per request in the log."""
    limits = with_model_threads(limits or Limits(), predictor)
    pool = WorkerPool(limits.threads, limits.queue, limits.timeout)
    streams = StreamStates(limits.stream_keys)
    metrics = Metrics(pool, streams, load_seconds)
    api = FastAPI(title="tsformer")
    api.state.pool, api.state.metrics = pool, metrics

    def stopped() -> None:  # after uvicorn's graceful shutdown: the requests in flight are answered
        pool.shutdown()
        log.info(
            "stopped: %d requests answered, %d still running after the %g s grace period",
            metrics.total(), pool.running, limits.grace,
        )  # fmt: skip

    api.router.on_shutdown.append(stopped)

    @api.middleware("http")
    async def access_line(request: Request, call_next):
        started = time.perf_counter()
        response = await call_next(request)
        seconds = time.perf_counter() - started
        log.info("%s %s %d %.3fs", request.method, request.url.path, response.status_code, seconds)
        metrics.answered(request.url.path, response.status_code, seconds)
        return response

    @api.get("/ping")
    @api.get("/health")
    async def ping():  # on the event loop: it answers while the workers are busy
        return Response(content="{}", media_type="application/json")

    @api.get("/version")
    async def version():
        return Response(content=json.dumps(__version__), media_type="application/json")

    @api.get("/metrics")
    async def exposition():
        return Response(content=metrics.exposition(), media_type=metrics.content_type)

    csv = getattr(getattr(predictor.model, "contract", None), "csv", None)

    def work(body: bytes, content_type: str) -> str:
        """Parse, predict, answer: in a worker thread."""
        table, params = read_request(body, content_type, csv, limits.max_columns)
        if isinstance(params, dict) and "stream" in params:
            params = dict(params)
            text = answer_stream(predictor, streams, params.pop("stream"), table, params)
        else:
            text = answer(predictor, table, params)
        metrics.rows.inc(len(table))
        return text

    @api.post("/invocations")
    async def invocations(request: Request):
        arrived = time.monotonic()
        try:
            body = await admitted_body(request, pool, limits)
        except Refused as err:
            return error_response(err.status, err.code, str(err), err.headers)
        content_type = request.headers.get("content-type", "")
        try:
            text = await pool.run(
                lambda: work(body, content_type), limits.timeout - (time.monotonic() - arrived)
            )
            return Response(content=text, media_type="application/json")
        except TimeLimit:
            return error_response(
                504, "DEADLINE_EXCEEDED", f"no answer within {limits.timeout:g} s (--timeout)"
            )
        except BadRequest as err:
            return error_response(400, "BAD_REQUEST", str(err))
        except Exception as err:
            log.error("request failed: %s: %s", type(err).__name__, one_line(err), exc_info=err)
            message = f"the model failed on this request: {type(err).__name__}: {one_line(err)}"
            return error_response(500, "INTERNAL_ERROR", message)

    return api


# the limits' options: (name, what it bounds, what passing it gives)
OPTIONS = {
    "threads": "threads running the model, per process (default: the model's job's; docs/operations.md)",
    "workers": "server processes, each loading the model (uvicorn's workers)",
    "queue": "requests waiting for a thread, per process; past it: 503",
    "timeout": "seconds from a request's arrival to its answer; past it: 504 (408 for a slow body)",
    "max_body_mb": "largest request body; past it: 413",
    "max_columns": "widest table; past it: 400",
    "stream_keys": "streams whose state is kept; past it the least recently used is dropped",
    "grace": "seconds SIGTERM waits for the requests in flight",
    "max_connections": "open connections (uvicorn's limit_concurrency); past it: 503",
}


def parser_of() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tsformer-serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="MLflow run id, runs:/ or models:/ URI, or a model/run folder")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: this machine only)"
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or ./mlflow.db)"
    )
    limits = parser.add_argument_group("limits (docs/operations.md)")
    for name, field in Limits.__dataclass_fields__.items():
        flag = "--" + name.replace("_", "-")
        default = "" if field.default is None else f" (default {field.default:g})"
        limits.add_argument(flag, type=field.type == "float" and float or int, default=field.default,
                            help=OPTIONS[name] + default)  # fmt: skip
    return parser


def limits_of(args: argparse.Namespace) -> Limits:
    values = {name: getattr(args, name) for name in Limits.__dataclass_fields__}
    for name, value in values.items():
        least = 0 if name == "queue" else 0.001 if isinstance(value, float) else 1
        if value is not None and value < least:
            raise ValueError(f"--{name.replace('_', '-')}={value}: at least {least:g}")
    return Limits(**values)


APP_SETTINGS = "TSFORMER_SERVE_APP"  # what each of several worker processes loads (`app_of_environment`)


def app_of_environment():
    """The application of a worker process of `tsformer-serve --workers N` (uvicorn starts the processes
    and calls this factory in each): the model folder and limits the command resolved, from
    $TSFORMER_SERVE_APP."""
    from tsformer.serving.predictor import Predictor

    settings = json.loads(os.environ[APP_SETTINGS])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    started = time.perf_counter()
    predictor = Predictor.of_folder(settings["folder"])
    limits = with_model_threads(Limits(**settings["limits"]), predictor)
    _share_cores(limits)
    api = app(predictor, limits, time.perf_counter() - started)
    _settled()
    return api


def _settled() -> None:
    """The objects loaded so far (the libraries, the model) left out of Python's garbage collections: a
    full collection walks every object and holds every thread meanwhile, /health's answer included."""
    gc.collect()
    gc.freeze()


def _share_cores(limits: Limits) -> None:
    """Each model thread's tensor work on its share of the cores (more threads than cores only contend),
    never more than PyTorch was given ($OMP_NUM_THREADS)."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    share = max(1, cores // (limits.threads * limits.workers))
    torch.set_num_threads(min(torch.get_num_threads(), share))


def main(argv: list[str] | None = None) -> int:
    args = parser_of().parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per small download
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from tsformer.serving.predictor import Predictor
    from tsformer.serving.references import resolve_model

    with tempfile.TemporaryDirectory() as downloaded:  # a run's model, kept while the workers load it
        try:
            limits = limits_of(args)
            started = time.perf_counter()
            folder = resolve_model(args.model, args.tracking_uri, Path(downloaded))
            predictor = Predictor.of_folder(folder)
            load_seconds = time.perf_counter() - started
            limits = with_model_threads(limits, predictor)
        except (DataValidationError, FileNotFoundError, ValueError, TrackingServerUnreachable) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        import uvicorn

        info = predictor.model.info
        print(
            f"serving the {predictor.job.name} model ({info.family}) of run {info.run_id} at "
            f"http://{args.host}:{args.port}/invocations (Ctrl+C stops)",
            flush=True,
        )
        # uvicorn's own access log is off: the application writes one line per request (`app`)
        options = {
            "host": args.host, "port": args.port, "log_level": "warning", "access_log": False,
            "timeout_graceful_shutdown": max(1, round(limits.grace)), "limit_concurrency": limits.max_connections,
        }  # fmt: skip
        if limits.workers == 1:
            _share_cores(limits)
            api = app(predictor, limits, load_seconds)
            _settled()
            # SIGTERM: uvicorn stops, then raises the signal again (exit status 143)
            uvicorn.Server(uvicorn.Config(api, **options)).run()
            return 0
        del predictor  # each worker process loads its own
        os.environ[APP_SETTINGS] = json.dumps({"folder": str(folder), "limits": asdict(limits)})
        uvicorn.run(
            "tsformer.serving.server:app_of_environment", factory=True, workers=limits.workers, **options
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
