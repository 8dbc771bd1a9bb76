"""What a run records of its data in MLflow (`tsformer.data_inputs`): every kind of data module, built
from the real configs, gives its tables' name, source, whole-table digest, schema and context; logging
twice records nothing twice (a resumed run: tests/test_resume.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest
from hydra.utils import instantiate
from mlflow import MlflowClient
from omegaconf import OmegaConf

from tsformer.data import simulate_plant
from tsformer.data_inputs import data_inputs, log_datasets, table_digest
from tsformer.train import compose_config


def inputs_of(overrides: list[str], tmp_path) -> list:
    cfg = compose_config(overrides, tmp_path / "out")
    data = OmegaConf.to_container(cfg.data, resolve=True)
    return data_inputs(data, instantiate(cfg.data))


def described(found) -> list[tuple]:
    """(name, source type, source, context) of each input."""
    return [
        (i.dataset.name, i.dataset.source_type, json.loads(i.dataset.source), i.tags[0].value) for i in found
    ]


@pytest.mark.parametrize(
    ("overrides", "function"),
    [
        ([], "tsformer.data.simulators.simulate_plant"),  # forecasting's default run
        (["experiment=plant_regime"], "tsformer.data.simulators.simulate_plant_regimes"),  # a stream
        (["experiment=plant_anomaly"], "tsformer.data.plant_anomaly.simulate_plant_anomaly"),
    ],
    ids=["window-data", "classifier-stream", "anomaly-data"],
)
def test_a_simulated_table_is_named_by_its_simulator_and_seed(tmp_path, overrides, function):
    cfg = compose_config(overrides, tmp_path / "out")
    (found,) = inputs_of(overrides, tmp_path)
    name, kind, source, context = described([found])[0]
    assert (name, kind, context) == (cfg.data.name, "code", "training")
    assert source["tags"]["function"] == function and source["tags"]["seed"] == "0"
    table = instantiate(cfg.data.source)
    assert found.dataset.digest == table_digest(table)
    columns = [c["name"] for c in json.loads(found.dataset.schema)["mlflow_colspec"]]
    assert columns == list(table.columns)
    assert json.loads(found.dataset.profile)["num_rows"] == len(table)


def test_files_are_named_by_path_and_a_test_file_is_testing(tmp_path):
    rows = [
        {"series_id": s, "step": t, "x": float(s + t), "label": f"c{s % 2}"}
        for s in range(8)
        for t in range(5)
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "train.csv", index=False)
    pd.DataFrame(rows[:20]).to_csv(tmp_path / "test.csv", index=False)
    found = inputs_of(
        ["data=sequences", f"data.train={tmp_path / 'train.csv'}", f"data.test={tmp_path / 'test.csv'}"],
        tmp_path,
    )
    assert described(found) == [
        ("train.csv", "local", {"uri": str(tmp_path / "train.csv")}, "training"),
        ("test.csv", "local", {"uri": str(tmp_path / "test.csv")}, "testing"),
    ]


def test_the_digest_reads_every_row():
    """MLflow's own digest reads the first 10,000 rows: a change after them must change ours."""
    table = simulate_plant(n_series=1, n_steps=12_000, freq="1min", seed=0)
    changed = table.copy()
    changed.loc[11_000, "dynamic_temperature"] += 0.5
    assert table_digest(changed) != table_digest(table) == table_digest(table.copy())


def test_logging_twice_records_each_table_once(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    logger = SimpleNamespace(experiment=client, run_id=run_id)
    cfg = compose_config([], tmp_path / "out")
    data = OmegaConf.to_container(cfg.data, resolve=True)
    datamodule = instantiate(cfg.data)
    log_datasets(logger, data, datamodule)
    log_datasets(logger, data, datamodule)  # as a resumed run does
    (logged,) = client.get_run(run_id).inputs.dataset_inputs
    assert (logged.dataset.name, logged.tags[0].value) == ("plant", "training")


def logger_whose_log_inputs(client, run_id: str, log_inputs):
    """A run's logger (`experiment`, `run_id`) whose MLflow client is `client` but for its `log_inputs`."""

    class Client:
        def __getattr__(self, name):
            return getattr(client, name)

    patched = Client()
    patched.log_inputs = log_inputs
    return SimpleNamespace(experiment=patched, run_id=run_id)


def test_a_dataset_another_run_inserted_at_the_same_moment_is_linked_not_an_error(tmp_path):
    """Two runs started together log the same new table: the insert of the later one fails on MLflow's
    unique key (seen with two train.py processes on one database); it links to the row the other made."""
    from mlflow.exceptions import MlflowException

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("x")
    first, second = (client.create_run(experiment).info.run_id for _ in range(2))
    cfg = compose_config([], tmp_path / "out")
    data = OmegaConf.to_container(cfg.data, resolve=True)
    datamodule = instantiate(cfg.data)
    calls = []

    def racing(run_id, datasets):  # the other run's insert lands between this run's lookup and its insert
        calls.append(run_id)
        if len(calls) == 1:
            client.log_inputs(first, datasets=datasets)
            raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.digest")
        client.log_inputs(run_id, datasets=datasets)

    log_datasets(logger_whose_log_inputs(client, second, racing), data, datamodule)
    assert calls == [second, second]
    linked = [client.get_run(r).inputs.dataset_inputs for r in (first, second)]
    assert [len(inputs) for inputs in linked] == [1, 1]
    assert linked[0][0].dataset.digest == linked[1][0].dataset.digest


def test_any_other_mlflow_error_of_logging_datasets_is_raised(tmp_path):
    from mlflow.exceptions import MlflowException

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    cfg = compose_config([], tmp_path / "out")

    def failing(run_id, datasets):
        raise MlflowException("database is locked")

    with pytest.raises(MlflowException, match="database is locked"):
        log_datasets(
            logger_whose_log_inputs(client, run_id, failing),
            OmegaConf.to_container(cfg.data, resolve=True),
            instantiate(cfg.data),
        )


def test_an_archive_ts_file_is_logged_as_its_series(tmp_path):
    """A .ts file (data.archive=, data.train=X_TRAIN.ts) is logged as its long table, named by path."""
    text = "@problemName Tiny\n@univariate true\n@equalLength true\n@seriesLength 3\n@classLabel true a b\n@data\n"
    text += "".join(f"{i},{i + 1},{i + 2}:{'ab'[i % 2]}\n" for i in range(6))
    (tmp_path / "Tiny").mkdir()
    for split in ("TRAIN", "TEST"):
        (tmp_path / "Tiny" / f"Tiny_{split}.ts").write_text(text)
    found = inputs_of(["data=sequences", f"data.archive={tmp_path}", "data.name=Tiny"], tmp_path)
    assert [(name, context) for name, _, _, context in described(found)] == [
        ("Tiny_TRAIN.ts", "training"),
        ("Tiny_TEST.ts", "testing"),
    ]
    assert json.loads(found[0].dataset.profile)["num_rows"] == 18  # 6 series of 3 steps
