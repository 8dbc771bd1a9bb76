"""`tsformer-serve MODEL [--host 127.0.0.1] [--port 5001]`: a trained model answers over HTTP.

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
  (`2024-01-01T02:09:00.000`) for every job.
- A table the model cannot take: status 400 and `{"error_code": "BAD_REQUEST", "message": "..."}`, the
  one line `predict.py` prints, no stack trace (MLflow's server answers with the whole trace).
- `GET /ping`, `/health`: 200 once the model is loaded; `GET /version`: the tsformer version.
- One line per request in the log: method, path, status, seconds.

The server runs in this process (uvicorn imported, not started from PATH as `mlflow models serve` does,
which fails unless the virtual environment is activated).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
import time

import pandas as pd
from fastapi import FastAPI, Request  # at module level: FastAPI reads the handlers' annotations here
from fastapi.responses import Response

from tsformer import __version__
from tsformer.data.schema import DataValidationError
from tsformer.tracking import TrackingServerUnreachable

log = logging.getLogger(__name__)

DEFAULT_PORT = 5001  # `mlflow ui` takes 5000


class BadRequest(ValueError):
    """A request the model cannot answer: its message is the answer's one line."""


def read_request(
    body: bytes, content_type: str, csv_options: dict | None = None
) -> tuple[pd.DataFrame, dict]:
    """(table, params) of an /invocations request in MLflow's formats (see the module docstring); a CSV
    body is read with `csv_options` (the training file's separator, decimal mark, encoding)."""
    mime = (content_type or "application/json").split(";")[0].strip().lower()
    if mime == "text/csv":
        options = {k: v for k, v in (csv_options or {}).items() if v is not None}
        try:
            return pd.read_csv(io.BytesIO(body), **options), {}
        except (ValueError, UnicodeDecodeError) as err:  # pandas' parser errors are ValueErrors
            raise BadRequest(f"the CSV body cannot be read: {str(err).strip().splitlines()[0]}") from err
    if mime != "application/json":
        raise BadRequest(f"Content-Type {mime!r}: send application/json or text/csv")
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadRequest(f"the body is not JSON: {err}") from err
    return _table_of_json(payload)


def _table_of_json(payload) -> tuple[pd.DataFrame, dict]:
    """(table, params) of a JSON request: `dataframe_split` or `dataframe_records`, and `params`."""
    params = payload.get("params") or {} if isinstance(payload, dict) else {}
    if isinstance(payload, dict) and isinstance(payload.get("dataframe_split"), dict):
        split = payload["dataframe_split"]
        try:
            return pd.DataFrame(split.get("data"), columns=split.get("columns")), params
        except (ValueError, TypeError) as err:
            raise BadRequest(f"dataframe_split: {err}") from err
    if isinstance(payload, dict) and isinstance(payload.get("dataframe_records"), list):
        return pd.DataFrame.from_records(payload["dataframe_records"]), params
    raise BadRequest(
        'the JSON body holds the table as "dataframe_split" ({"columns": [...], "data": [[...]]}) '
        'or "dataframe_records" ([{column: value}, ...])'
    )


def answer(predictor, table: pd.DataFrame, params: dict) -> str:
    """The JSON answer to a table: `{"predictions": [...]}`, the rows of `predictor.predict(table,
    params)` (a `Predictor`), missing values null, times ISO text."""
    try:
        result = predictor.predict(table, params, source="the request's table")
    except (DataValidationError, ValueError, KeyError) as err:
        raise BadRequest(
            str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        ) from err
    return '{"predictions": ' + answer_json(result) + "}"


def answer_json(frame: pd.DataFrame) -> str:
    """The rows of an answer as a JSON list of objects: missing values null (json.dumps would write
    NaN, which JSON parsers refuse), times ISO text (`2024-01-01T02:09:00.000`)."""
    return frame.to_json(orient="records", date_format="iso")


def app(predictor):
    """The FastAPI application answering with `predictor` (a `Predictor`; its model's CSV options read
    a CSV body), one access line per request in the log."""

    api = FastAPI(title="tsformer")

    def json_response(content: str, status: int = 200) -> Response:
        return Response(content=content, status_code=status, media_type="application/json")

    @api.middleware("http")
    async def access_line(request: Request, call_next):
        started = time.perf_counter()
        response = await call_next(request)
        seconds = time.perf_counter() - started
        log.info("%s %s %d %.3fs", request.method, request.url.path, response.status_code, seconds)
        return response

    @api.get("/ping")
    @api.get("/health")
    def ping():
        return json_response("{}")

    @api.get("/version")
    def version():
        return json_response(json.dumps(__version__))

    @api.post("/invocations")
    async def invocations(request: Request):
        body = await request.body()
        try:
            csv = predictor.model.contract.csv
            table, params = read_request(body, request.headers.get("content-type", ""), csv)
            return json_response(answer(predictor, table, params))
        except BadRequest as err:
            return json_response(json.dumps({"error_code": "BAD_REQUEST", "message": str(err)}), 400)
        except Exception as err:
            log.exception("request failed")
            message = f"the model failed on this request: {type(err).__name__}: {err}".splitlines()[0]
            return json_response(json.dumps({"error_code": "INTERNAL_ERROR", "message": message}), 500)

    return api


def main(argv: list[str] | None = None) -> int:
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
    args = parser.parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per small download
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from tsformer.serving.predictor import load_predictor

    try:
        predictor = load_predictor(args.model, args.tracking_uri)
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
    uvicorn.run(app(predictor), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
