"""The contract every task class of every registered job keeps (`tsformer.jobs.JOBS`), shared by the
test_contract_*.py files (each trains a few task classes once, in a module fixture, so that xdist's
workers share the trainings: `make test` runs a file per worker).

A tiny run of the task class trains, writes its outputs and model folder and names and tags its MLflow
run after the job; then the same table is answered three ways: the predict.py command its summary
prints (run as printed, from another folder, with a bare PATH), tsformer-serve (one real request on
127.0.0.1, the process stopped after) and the run's logged pyfunc model; all three answer what the model
folder's `Predictor` answers in this process. The first task class of each job runs predict.py and
tsformer-serve as processes; the job's other task classes give the printed command's arguments to
predict.py's `main` and their request to tsformer-serve's application in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import httpx
import matplotlib.pyplot as plt
import mlflow
import numpy as np
import pandas as pd
import pytest
import yaml
from matplotlib.figure import Figure
from mlflow.tracking import MlflowClient

from conftest import NOT_LINEAR, REPO, TINY, TINY_ANOMALY, CountAllocations, plant_csv_overrides
from tsformer import tracking
from tsformer.callbacks import MLflowRun
from tsformer.data import simulate_plant
from tsformer.jobs import JOBS, job_of_folder, load_model
from tsformer.predict import main as predict_main
from tsformer.serving.predictor import Predictor
from tsformer.serving.server import answer_json
from tsformer.serving.server import app as server_app
from tsformer.serving.writers import write_answer
from tsformer.tracking import tracking_uri_for
from tsformer.train import compose_config, run

TINY_REGIME = [o for o in TINY if not o.startswith("data.source")] + [
    "data.source.n_series=8",
    "data.source.n_steps=600",
]
BARE = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}  # `env -i PATH=/usr/bin:/bin`, and one thread


def plant_csv(folder: Path) -> Path:
    path = folder / "plant.csv"
    simulate_plant(n_series=2, n_steps=800, freq="1min", seed=0).to_csv(path, index=False)
    return path


def model_option(task_class: str) -> str:
    """The conf/model option whose `_target_` is `task_class`."""
    for path in sorted((REPO / "conf" / "model").glob("*.yaml")):
        if yaml.safe_load(path.read_text()).get("_target_") == task_class:
            return path.stem
    raise LookupError(f"no conf/model option builds {task_class}")


def _plant(task: str, *extra: str):
    return lambda f: [*plant_csv_overrides(plant_csv(f)), f"model={model_option(task)}", *extra]


# the detectors' runs read no label: the contract is about answering; the metrics beside the baselines
# (TSB-AD's VUS of every score on every series, the slow part of a labelled run) are test_anomaly_job's
TINY_UNLABELLED = [*TINY_ANOMALY, "data.label_col=null"]
FORECASTERS = "tsformer.tasks.forecasting."
# task class (module.qualname as the model folder names it) -> the overrides of a tiny run in a folder
RUNS = {
    FORECASTERS + "EncoderDecoderForecaster": _plant("tsformer.tasks.EncoderDecoderForecaster"),
    FORECASTERS + "DecoderOnlyForecaster": _plant("tsformer.tasks.DecoderOnlyForecaster"),
    FORECASTERS + "EncoderForecaster": _plant("tsformer.tasks.EncoderForecaster"),
    FORECASTERS + "LinearForecaster": lambda f: [
        o for o in _plant("tsformer.tasks.LinearForecaster")(f) if not o.startswith(NOT_LINEAR)
    ],
    "tsformer.tasks.reconstruction.ReconstructionTask": _plant(
        "tsformer.tasks.ReconstructionTask", "model.context_len=30"
    ),
    "tsformer.tasks.masked.MaskedFillIn": _plant("tsformer.tasks.MaskedFillIn", "model.context_len=30"),
    "tsformer.tasks.classification.ClassificationTask": lambda f: ["experiment=plant_regime", *TINY_REGIME],
    "tsformer.tasks.pretraining.MaskedPretraining": lambda f: [
        "experiment=plant_regime",
        "pretrain=masked",
        *TINY_REGIME,
        "trainer.max_steps=3",
    ],
    "tsformer.tasks.anomaly.MaskedAnomalyDetector": lambda f: [*TINY_UNLABELLED, "model=enc_only_anomaly"],
    "tsformer.tasks.anomaly.ForecastAnomalyDetector": lambda f: [*TINY_UNLABELLED, "model=dec_only_anomaly"],
}


# which test_contract_<name>.py file trains which task classes (each file a worker's share of `make test`)
FILES = {
    "forecasters": [
        FORECASTERS + n
        for n in (
            "EncoderDecoderForecaster",
            "DecoderOnlyForecaster",
            "EncoderForecaster",
            "LinearForecaster",
        )
    ],
    "window_models": [
        "tsformer.tasks.reconstruction.ReconstructionTask",
        "tsformer.tasks.masked.MaskedFillIn",
    ],
    "sequences": [
        "tsformer.tasks.classification.ClassificationTask",
        "tsformer.tasks.pretraining.MaskedPretraining",
    ],
    "anomaly": [
        "tsformer.tasks.anomaly.MaskedAnomalyDetector",
        "tsformer.tasks.anomaly.ForecastAnomalyDetector",
    ],
}


def task_classes() -> set[str]:
    """Every task class of every registered job."""
    return {f"{cls.__module__}.{cls.__qualname__}" for job in JOBS.values() for cls in job.tasks}


@dataclass
class Trained:
    task: str  # the task class
    job: object  # its `Job`
    result: object  # train.run's `RunResult`
    summary: str  # what the run printed
    folder: Path  # the folder it ran in
    uri: str  # its tracking URI
    logged: (
        tuple  # what the run's MLflow callback logged its outputs with: (job, cfg, task, datamodule, outputs)
    )
    figures_logged: list[str]  # the figures the run logged (TINY's figures=false: none)


def trained_fixture(tasks: list[str]):
    """A module fixture: one tiny run of each of `tasks` (`Trained`)."""

    @pytest.fixture(scope="module", params=tasks, ids=[t.rpartition(".")[2] for t in tasks])
    def trained(request, tmp_path_factory):
        task = request.param
        folder = tmp_path_factory.mktemp(task.rpartition(".")[2])
        uri = f"sqlite:///{folder}/mlflow.db"
        logged, figures_logged = [], []
        log_outputs, log_figure = MLflowRun.log_outputs, tracking.log_figure

        def recorded_log_outputs(recorder, job, task, datamodule, outputs, best_ckpt):
            logged.append((job, recorder.cfg, task, datamodule, outputs))
            return log_outputs(recorder, job, task, datamodule, outputs, best_ckpt)

        def recorded_log_figure(logger, fig, artifact_file, folder=None):
            figures_logged.append(artifact_file)
            return log_figure(logger, fig, artifact_file, folder)

        with pytest.MonkeyPatch.context() as mp:  # MLflow's artifacts go to ./mlruns: the run's folder
            mp.chdir(folder)
            mp.setattr(MLflowRun, "log_outputs", recorded_log_outputs)
            mp.setattr(tracking, "log_figure", recorded_log_figure)
            cfg = compose_config([*RUNS[task](folder), f"logger.mlflow.tracking_uri={uri}"], folder / "out")
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                result = run(cfg)
        job = job_of_folder(result.model_folder)
        return Trained(task, job, result, printed.getvalue(), folder, uri, logged[0], figures_logged)

    return trained


# -- the three ways of answering ---------------------------------------------------------------------


def request_table(trained: Trained) -> pd.DataFrame:
    """The table the three ways answer, as `pd.read_csv` gives it: the run's example; for masked
    fill-in, rows of the training table with every third target cell emptied (the example has no
    observed value left to fill from)."""
    if "MaskedFillIn" in trained.task:
        table = pd.read_csv(trained.folder / "plant.csv").iloc[-90:].reset_index(drop=True)
        table.loc[table.index % 3 == 0, "dynamic_temperature"] = np.nan
    else:
        table = trained.result.outputs.example
    if table is None:  # pre-training: a classifier's table (its example would be one)
        table = pd.DataFrame({"series_id": [0], "step": [0], "x": [0.0]})
    return pd.read_csv(io.StringIO(table.to_csv(index=False)))


def usage_command(summary: str) -> list[str]:
    """The command of the summary's line after `model folder:` ('<what>: <command>')."""
    lines = summary.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("model folder: "))
    return shlex.split(lines[at + 1].split(": ", 1)[1])


def params_of(command: list[str]) -> dict:
    """The params a printed predict.py command gives (its switches, such as --impute)."""
    flags = {p.flag: p.name for job in JOBS.values() for p in job.prediction.params if p.kind is bool}
    return {flags[word]: True for word in command if word in flags}


@dataclass
class Answers:
    table: pd.DataFrame
    params: dict
    expected: pd.DataFrame | str  # the in-process Predictor's answer, or its refusal (one line)
    predict_py: subprocess.CompletedProcess
    written: pd.DataFrame | None  # predict.py's CSV
    elsewhere: Path  # where it ran
    served: tuple[int, dict]  # status and JSON of tsformer-serve's answer
    server_log: str
    pyfunc: pd.DataFrame | None  # None: no pyfunc model (the folder logged as the run's artifacts)


def answers_fixture():
    """A module fixture: the three answers (`Answers`) of each `trained` model."""

    @pytest.fixture(scope="module")
    def answers(trained, tmp_path_factory) -> Answers:
        tmp = tmp_path_factory.mktemp("answers")
        table = request_table(trained)
        (tmp / "table.csv").write_text(table.to_csv(index=False))
        command = usage_command(trained.summary)
        params = params_of(command)
        predictor = Predictor.of_folder(trained.result.model_folder)
        try:
            expected = predictor.predict(table, params, source=str(tmp / "table.csv"))
        except ValueError as err:
            expected = str(err)
        run_command = run_predict_py if first_of_its_job(trained.task) else run_predict_in_process
        proc, written, elsewhere = run_command(command, trained, tmp)
        serve = serve_one_request if first_of_its_job(trained.task) else serve_one_request_in_process
        served, log = serve(trained.result.model_folder, table, params, tmp)
        return Answers(
            table,
            params,
            expected,
            proc,
            written,
            elsewhere,
            served,
            log,
            pyfunc_answer(trained, table, params),
        )

    return answers


def first_of_its_job(task: str) -> bool:
    """Whether `task` is the first task class of its job in `RUNS`: the one whose printed command and
    tsformer-serve run as processes (the job's other task classes answer through the same entry points
    in this process: a process costs about 5 s of imports, and what it adds is the job's, not the class's)."""
    job_of = {f"{c.__module__}.{c.__qualname__}": job.name for job in JOBS.values() for c in job.tasks}
    return next(t for t in RUNS if job_of[t] == job_of[task]) == task


def with_table_and_output(command: list[str], tmp: Path) -> tuple[list[str], Path, Path]:
    """(the printed command with the table and an output path in place of its placeholders, the output
    path, an empty folder to run it from)."""
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    out = tmp / "out.csv"
    if "<table.csv>" in command:
        command = list(command)
        command[command.index("<table.csv>")] = str(tmp / "table.csv")
        command[command.index("--output") + 1] = str(out)
    return command, out, elsewhere


def run_predict_in_process(command: list[str], trained: Trained, tmp: Path):
    """The printed predict.py command's arguments given to predict.py's `main` in this process, from an
    empty folder: (its exit status and what it printed as a process's, the CSV or None, the folder)."""
    command, out, elsewhere = with_table_and_output(command, tmp)
    assert Path(command[1]).name == "predict.py", command  # a job of one task class runs its own process
    stdout, stderr = io.StringIO(), io.StringIO()
    with (
        pytest.MonkeyPatch.context() as mp,
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        mp.chdir(elsewhere)
        status = predict_main(command[2:])
    proc = subprocess.CompletedProcess(command, status, stdout.getvalue(), stderr.getvalue())
    return proc, pd.read_csv(out) if out.is_file() else None, elsewhere


def run_predict_py(command: list[str], trained: Trained, tmp: Path):
    """The summary's command, run as printed from an empty folder with a bare PATH: (process, the CSV
    it wrote or None, the folder). A training command (fine-tuning from a pre-trained encoder) is the
    printed one; a predict.py command gets the table and an output path in place of its placeholders."""
    command, out, elsewhere = with_table_and_output(command, tmp)
    proc = subprocess.run(
        command,
        cwd=elsewhere,
        env=BARE,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return proc, pd.read_csv(out) if out.is_file() else None, elsewhere


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def wait_listening(server: subprocess.Popen, port: int, seconds: float) -> None:
    """Until tsformer-serve (`server`, its output piped) has loaded its model and listens on `port` of
    127.0.0.1; fails with its output if it died, or if `seconds` passed."""
    deadline = time.monotonic() + seconds
    while True:
        assert server.poll() is None, server.stdout.read().decode()[-3000:]
        assert time.monotonic() < deadline, f"tsformer-serve did not listen within {seconds:g} s"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)


def stop_process_group(process: subprocess.Popen, seconds: float = 30) -> None:
    """SIGTERM to a process started with `start_new_session=True` and every process it started (a
    server's workers), SIGKILL after `seconds`."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def serve_one_request(
    folder: Path, table: pd.DataFrame, params: dict, tmp: Path
) -> tuple[tuple[int, dict], str]:
    """`tsformer-serve <folder>` (the console script, bare PATH) on a free port of 127.0.0.1: one request
    with `table` and `params`, then the process is stopped; (status and JSON answer, what it printed)."""
    port = free_port()
    serve = Path(sys.executable).parent / "tsformer-serve"
    server = subprocess.Popen(
        [str(serve), str(folder), "--port", str(port)],
        cwd=tmp, env=BARE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_listening(server, port, seconds=180)
        split = json.loads(table.to_json(orient="split", index=False))
        body = json.dumps({"dataframe_split": split, "params": params}).encode()
        served = post(f"http://127.0.0.1:{port}/invocations", body)
    finally:
        server.terminate()
        try:
            output = server.communicate(timeout=30)[0].decode()
        except subprocess.TimeoutExpired:
            server.kill()
            output = server.communicate()[0].decode()
    return served, output


def serve_one_request_in_process(
    folder: Path, table: pd.DataFrame, params: dict, tmp: Path
) -> tuple[tuple[int, dict], str]:
    """tsformer-serve's application (`serving.server.app`) of the folder's `Predictor` in this process: one
    request with `table` and `params` through its ASGI interface; (status and JSON answer, the lines it
    logged: the server process's announcement is `serve_one_request`'s, for the first task class of a job)."""
    split = json.loads(table.to_json(orient="split", index=False))
    body = json.dumps({"dataframe_split": split, "params": params}).encode()
    api = server_app(Predictor.of_folder(folder))
    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    server_log = logging.getLogger(server_app.__module__)
    level = server_log.level

    async def post_once():
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=120) as client:
            return await client.post(
                "/invocations", content=body, headers={"Content-Type": "application/json"}
            )

    server_log.addHandler(handler)
    server_log.setLevel(logging.INFO)
    try:
        response = asyncio.run(post_once())
    finally:
        server_log.removeHandler(handler)
        server_log.setLevel(level)
        api.state.pool.shutdown()
    return (response.status_code, response.json()), logged.getvalue()


def pyfunc_answer(trained: Trained, table: pd.DataFrame, params: dict) -> pd.DataFrame | None:
    """The run's logged pyfunc model's answer (None where the run logs its folder instead)."""
    if trained.result.outputs.example is None:
        return None
    with tracking_uri_for(trained.uri), pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        model = mlflow.pyfunc.load_model(f"runs:/{trained.result.run_id}/model")
    return model.predict(table, params=params or None)


def csv_round_trip(frame: pd.DataFrame, folder: Path, as_read: dict | None = None) -> pd.DataFrame:
    """`frame` as predict.py writes it, read back."""
    return pd.read_csv(write_answer(frame, folder / "expected.csv", as_read)[0])


def json_round_trip(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` as tsformer-serve writes it, read back."""
    return pd.DataFrame(json.loads(answer_json(frame)))


# -- the tests, imported by the test_contract_*.py files -------------------------------------------


def test_the_run_is_named_and_tagged_after_its_job_and_writes_its_model_folder(trained):
    job, result, summary, uri = trained.job, trained.result, trained.summary, trained.uri
    assert any(f"{cls.__module__}.{cls.__qualname__}" == trained.task for cls in job.tasks)
    client = MlflowClient(uri)
    the_run = client.get_run(result.run_id)
    assert the_run.info.status == "FINISHED"
    assert the_run.data.tags["job"] == job.name
    assert the_run.info.run_name.startswith(f"{job.name}-{the_run.data.tags['family']}-")
    load_model(result.model_folder)
    if result.csv_path is not None:  # the job's table under its own artifact folder
        logged = {a.path for a in client.list_artifacts(result.run_id, result.outputs.logged_under)}
        assert f"{result.outputs.logged_under}/{result.csv_path.name}" in logged, logged
    experiment = the_run.info.experiment_id
    assert f"{sys.executable} -m mlflow ui --backend-store-uri {uri}" in summary
    assert f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{result.run_id}" in summary
    assert f"model folder: {result.model_folder.resolve()}" in summary


def test_a_job_s_figures_come_only_through_its_figures_member_and_none_when_figures_is_false(trained):
    """TINY's figures=false: the run drew and logged none (no file, no artifact). With figures=true the
    job's `figures` answers {"plots/<name>.png": figure}, and its `log_outputs` draws none itself (the
    run's MLflow callback logs what `figures` answers: a new job cannot forget the setting)."""
    job, cfg, task, datamodule, outputs = trained.logged
    assert cfg.figures is False and trained.figures_logged == []
    assert not list(Path(cfg.paths.output_dir).rglob("*.png"))
    assert not MlflowClient(trained.uri).list_artifacts(trained.result.run_id, "plots")
    plt.close("all")
    logger = mock.MagicMock()  # the MLflow client's calls, answered and recorded
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tracking, "log_figure", mock.Mock(side_effect=AssertionError("a job logged a figure")))
        job.log_outputs(logger, cfg, task, datamodule, outputs)
    assert plt.get_fignums() == [], "log_outputs drew a figure"
    drawn = job.figures(cfg, task, datamodule, outputs)
    assert all(name.startswith("plots/") and name.endswith(".png") for name in drawn), list(drawn)
    assert all(isinstance(figure, Figure) for figure in drawn.values())
    assert not logger.experiment.log_figure.called and not logger.experiment.log_image.called
    plt.close("all")


def test_the_printed_command_runs_from_another_folder_with_a_bare_path(trained, answers):
    command = usage_command(trained.summary)
    assert Path(command[0]).is_absolute() and Path(command[1]).is_absolute(), command
    proc = answers.predict_py
    assert proc.returncode == 0, proc.stderr[-3000:]
    if Path(command[1]).name == "train.py":  # fine-tuning from the pre-trained encoder: it trained
        assert f"init_from={trained.result.model_folder.resolve()}" in command
        assert "model folder: " in proc.stdout
        return
    assert Path(command[1]).name == "predict.py"
    assert not list(answers.elsewhere.iterdir())  # nothing written where it ran


def test_predict_py_tsformer_serve_and_pyfunc_answer_what_the_predictor_answers(
    trained, answers, tmp_path, capsys
):
    expected = answers.expected
    status, served = answers.served
    if isinstance(expected, str):  # a model that answers no table: the same one line everywhere
        assert status == 400 and served["message"] == expected, served
        assert "\n" not in expected
        table, out = tmp_path / "table.csv", tmp_path / "out.csv"
        answers.table.to_csv(table, index=False)
        assert predict_main([str(trained.result.model_folder), str(table), "--output", str(out)]) == 2
        assert capsys.readouterr().err == f"error: {expected}\n" and not out.exists()
        return
    as_read = None
    if trained.job.prediction.written_as_read:  # a completed input table, written as it was read
        contract = load_model(trained.result.model_folder).contract
        as_read = {**contract.csv, "date_format": contract.time_format}
    pd.testing.assert_frame_equal(answers.written, csv_round_trip(expected, tmp_path, as_read))
    assert status == 200, served
    pd.testing.assert_frame_equal(pd.DataFrame(served["predictions"]), json_round_trip(expected))
    for column in expected.select_dtypes("datetime").columns:  # ISO text, whatever the job
        iso = pd.Series([row[column] for row in served["predictions"]])
        assert iso.str.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}").all(), iso.head()
    if answers.pyfunc is not None:
        pd.testing.assert_frame_equal(answers.pyfunc, expected)


def test_tsformer_serve_names_the_job_and_writes_one_line_per_request(trained, answers):
    lines = answers.server_log.strip().splitlines()
    if first_of_its_job(trained.task):  # the process announces its model (the others: the application alone)
        assert lines[0].startswith(f"serving the {trained.job.name} model ("), lines
    else:
        assert Predictor.of_folder(trained.result.model_folder).job is trained.job
    requests = [line for line in lines if "/invocations" in line and not line.startswith("serving")]
    assert len(requests) == 1, lines


# -- a hostile folder of the model's kind ---------------------------------------------------------------

MARKER_MODULE = "tsformer_contract_hostile"  # a module a hostile folder names: importing it writes a file


def first_int_hparam(hparams: dict) -> str:
    return next(k for k, v in hparams.items() if type(v) is int)


# name -> (change of the folder's tsformer.json, words the one line holds)
HOSTILE = {
    "a wrong type": (
        lambda c: c["hparams"].update({first_int_hparam(c["hparams"]): "12"}),
        lambda c: [f"hparams.{first_int_hparam(c['hparams'])} is a string ('12'), expected int"],
    ),
    "a huge size": (
        lambda c: c["hparams"]["net"].update(d_model=10**9),
        lambda c: ["hparams do not build a network"],
    ),
    "an unknown key": (
        lambda c: c["hparams"].update(colour="red"),
        lambda c: ["unknown key(s) ['colour'] in hparams"],
    ),
    "code to import": (
        lambda c: c.update(task_class=f"{MARKER_MODULE}.Task"),
        lambda c: [f"task_class '{MARKER_MODULE}.Task' is not a task of this tsformer"],
    ),
}


def test_a_hostile_folder_of_its_kind_is_one_line_without_allocating_or_running_code(
    trained, tmp_path, capsys, monkeypatch
):
    """Copies of the run's model folder, each with one hostile change: refused by predict.py in one line
    (exit 2, nothing written), before more than 1 GB is allocated (a 10**9-wide network is shaped on
    PyTorch's meta device) and without importing the module a `task_class` names (on sys.path here)."""
    (tmp_path / f"{MARKER_MODULE}.py").write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').close()\nclass Task: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    table = tmp_path / "table.csv"
    request_table(trained).to_csv(table, index=False)
    for case, (change, words) in HOSTILE.items():
        folder = shutil.copytree(trained.result.model_folder, tmp_path / case.replace(" ", "_"))
        config = json.loads((folder / "tsformer.json").read_text())
        expected = words(config)
        change(config)
        (folder / "tsformer.json").write_text(json.dumps(config))
        out = tmp_path / "out.csv"
        with CountAllocations() as counted:
            assert predict_main([str(folder), str(table), "--output", str(out)]) == 2, case
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, (case, err)
        assert all(word in err for word in [str(folder / "tsformer.json"), *expected]), (case, err)
        assert counted.elements * 4 < 10**9, (case, counted.elements)  # float32 numbers: under 1 GB
        assert not out.exists() and not (tmp_path / "ran").exists() and MARKER_MODULE not in sys.modules, case
