"""`Predictor`: a trained model answering tables, the one way predict.py, tsformer-serve and the pyfunc
model use it.

    predictor = load_predictor("runs:/<run id>/model")         # a run id, runs:/ or models:/ URI, or folder
    predictor = Predictor.of_folder("outputs/<date>/<time>/model")
    answer = predictor.predict(pd.read_csv("new.csv"))           # the rows predict.py writes
    answer = predictor.predict(table, {"origin": "2024-05-01 12:00"})

The table is laid out as the training data, as `pd.read_csv` gives it (times as text, read in the
training data's format unless `params["time_format"]` says otherwise). `params` are the options of a
use, each declared by the model's job (`jobs.base.Prediction.params`: a forecaster's `origin`, a fill-in
model's `impute`, ...); an unknown one, or a value of the wrong type, is refused in one line naming it.
What the answer holds is the job's (`Job.prediction.answer`): forecasts, classes, judged rows, the
table with its gaps filled.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from tsformer.data.split_rows import SplitRows
from tsformer.jobs.base import Job, Param


class Predictor:
    """A loaded model (`model`: its job's inference object, e.g. a `Forecaster`) and its `job`."""

    def __init__(self, job: Job, model):
        self.job = job
        self.model = model

    @classmethod
    def of_folder(cls, folder: str | Path) -> Predictor:
        """The predictor of a model folder, checked as it is loaded (`model_folder.read`)."""
        from tsformer.jobs import job_of_folder, load_model  # the registry imports every job (and this)

        return cls(job_of_folder(folder), load_model(folder))

    @property
    def params(self) -> tuple[Param, ...]:
        """The options this model's job takes."""
        return self.job.prediction.params

    def predict(
        self, table: pd.DataFrame, params: dict | None = None, *, source: str = "the table"
    ) -> pd.DataFrame:
        """The answer to `table` (see the module docstring); `source` names the table in messages."""
        return self.job.prediction.answer(self.model, table, self.checked(params), source)

    @property
    def streams(self) -> bool:
        """Whether this model's job answers rows as they arrive (`predict_stream`)."""
        return self.job.prediction.stream is not None

    @property
    def serve_threads(self) -> int:
        """tsformer-serve's model threads a process for this model when `--threads` is not given."""
        return self.job.prediction.serve_threads

    @property
    def streams_not(self) -> str:
        """The one line refusing a stream of a model whose job answers whole tables only."""
        return f"params: 'stream' is not an option of a {self.job.name} model: it answers whole tables"

    def predict_stream(
        self, state, rows: pd.DataFrame | SplitRows, params: dict | None = None, *, source: str = "the table"
    ):
        """(answer, next state) of `rows`, the new rows of a stream whose kept state is `state` (None: a
        new stream); the state is the job's, opaque to the caller, and `state` itself is left as it was.
        `rows` a table, or a request's rows as it holds them (`SplitRows`: the job reads them, or their
        `frame`)."""
        if not self.streams:
            raise ValueError(self.streams_not)
        return self.job.prediction.stream(self.model, state, rows, self.checked(params), source)

    def checked(self, params: dict | None) -> dict:
        """Every declared param with its value (`Param.unset` where not given), `params` checked: a key
        the job does not declare, a value of another type, or a required switch not given is one line."""
        given = {} if params is None else params
        if not isinstance(given, dict):
            # a user's input: a ValueError, as predict.py and tsformer-serve report them
            raise ValueError(f"params must be an object of options, got {type(given).__name__}")  # noqa: TRY004
        declared = {p.name: p for p in self.params}
        unknown = sorted(str(k) for k in given if k not in declared)
        if unknown:
            takes = ", ".join(declared) or "none"
            raise ValueError(
                f"params: {unknown[0]!r} is not an option of a {self.job.name} model (its options: {takes})"
            )
        values = {}
        for name, param in declared.items():
            values[name] = _value(param, given.get(name))
            if param.required and not values[name]:
                raise ValueError(
                    f"{name}: a model of the {self.job.name} job answers with {name}=true only (predict.py "
                    f"{param.flag}): {param.help}"
                )
        return values


def _value(param: Param, value):
    """`value` as `param` takes it: text (None where not given) or a switch (False where not given);
    None and "" (what the pyfunc signature's default may be) are not given."""
    if value is None or (isinstance(value, str) and value == ""):
        return False if param.kind is bool else None
    if param.kind is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise ValueError(f"params: {param.name}={value!r} is not true or false")
    if not isinstance(value, str):
        raise ValueError(f"params: {param.name}={value!r} is not text")  # noqa: TRY004 (as above)
    return value


def load_predictor(reference: str, tracking_uri: str | None = None) -> Predictor:
    """The predictor of a run id, `runs:/` or `models:/` URI, or folder (`references.resolve_model`); a
    downloaded copy is removed once loaded."""
    from tsformer.serving.references import resolve_model

    with tempfile.TemporaryDirectory() as tmp:
        return Predictor.of_folder(resolve_model(reference, tracking_uri, Path(tmp)))
