"""What a run records of its data in MLflow: each table it read as an MLflow dataset (the UI's Dataset
column and the run page's Datasets), with its name, source, digest and schema.

- Which tables: the one a data module reads (`source`: the series of a forecasting, reconstruction,
  fill-in or anomaly run, a classifier's stream; `train`: a classifier's sequences), in the context
  "training" (its validation and test rows are parts of it, split as the run's config says), and a
  separate test file (`test`) in the context "testing".
- Source: a file, as its absolute path (MLflow's "local" source); a table a function made (a simulator,
  a data set's loader), as MLflow's "code" source whose tags name the function and its arguments
  (seed included), so that the call that made it can be repeated.
- Digest: of the whole table, every row (MLflow's own digest reads its first 10,000 rows only).

`log_datasets` logs those the run has not logged yet: a resumed run keeps its datasets, none twice.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

# a data module's attribute holding a table (or its path), its key in the data config, and its context
TABLES = (
    ("source", "source", "training"),
    ("train_source", "train", "training"),
    ("test_source", "test", "testing"),
)


def table_digest(frame: pd.DataFrame) -> str:
    """An 8-character digest of every row and column name of `frame` (MLflow's digest format)."""
    from mlflow.data.digest_utils import get_normalized_md5_digest

    rows = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    return get_normalized_md5_digest([rows, np.int64(len(frame)), *(str(c).encode() for c in frame.columns)])


def data_inputs(data_cfg: Mapping, datamodule) -> list:
    """The MLflow `DatasetInput`s of the tables `datamodule` read (module docstring); `data_cfg`: the
    run's data config (a table's path, or the function and arguments that made it)."""
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = []
    for attribute, key, context in TABLES:
        table = getattr(datamodule, attribute, None)
        if table is None:
            continue
        dataset = _dataset(table, data_cfg.get(key), datamodule.name, data_cfg.get("csv") or {})
        inputs.append(DatasetInput(dataset, [InputTag(MLFLOW_DATASET_CONTEXT, context)]))
    return inputs


def _dataset(table, spec, data_name: str, csv: Mapping):
    """The MLflow dataset entity of one table: a DataFrame (made by the function `spec` names) or a
    path (read with the data config's `csv` options, as the data module read it)."""
    import mlflow
    from mlflow.data.code_dataset_source import CodeDatasetSource

    from tsformer.data.sources import load_table
    from tsformer.data.ts_format import read_ts

    if isinstance(table, pd.DataFrame):
        frame, name = table, data_name
        source = CodeDatasetSource(_call_tags(spec))
    else:  # read again as the data module read it (a path names the file as the run resolved it)
        path = Path(table).expanduser().resolve()
        frame = read_ts(path).long_table() if path.suffix.lower() == ".ts" else load_table(path, **csv)
        name, source = path.name, str(path)
    with warnings.catch_warnings():  # notes a user cannot act on
        # MLflow registers its local file source twice, and hints at integer columns of a model input
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
        warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer column")
        dataset = mlflow.data.from_pandas(frame, source=source, name=str(name), digest=table_digest(frame))
        return dataset._to_mlflow_entity()


def _call_tags(spec) -> dict[str, str]:
    """The function that made a table and its arguments (`_target_` and the rest of its config), as
    text; {"function": "in-memory table"} for a table given directly."""
    if not isinstance(spec, Mapping) or "_target_" not in spec:
        return {"function": "in-memory table"}
    return {"function": str(spec["_target_"]), **{str(k): str(v) for k, v in spec.items() if k != "_target_"}}


def log_datasets(logger, data_cfg: Mapping, datamodule) -> None:
    """The run's datasets in its MLflow run, those it has not logged yet (a resumed run: none twice)."""
    client, run_id = logger.experiment, logger.run_id
    logged = {(i.dataset.name, i.dataset.digest) for i in client.get_run(run_id).inputs.dataset_inputs}
    new = [i for i in data_inputs(data_cfg, datamodule) if (i.dataset.name, i.dataset.digest) not in logged]
    if not new:
        return
    from mlflow.exceptions import MlflowException

    try:
        client.log_inputs(run_id, datasets=new)
    except MlflowException as err:
        # Runs started together on one database (a parallel sweep, two terminals) may insert the same
        # new dataset at once: MLflow looks it up, finds none, and the later insert fails on the unique
        # key. The dataset exists now: the second call links this run to it.
        if "UNIQUE constraint failed: datasets" not in str(err):
            raise
        client.log_inputs(run_id, datasets=new)
