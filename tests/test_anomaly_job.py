"""The anomaly job end to end on tiny settings: `train.py experiment=plant_anomaly` writes the per-row and
events tables, the model folder and the MLflow run (figures, pyfunc model); `predict.py` scores a new
table with the model folder and names what is wrong with a bad one. (The contract every job keeps,
tests/test_jobs.py, runs it too.)"""

from __future__ import annotations

import contextlib
import functools
import io
import json

import numpy as np
import pandas as pd
import pytest

from conftest import TINY_ANOMALY
from tsformer.data.anomaly import split_at
from tsformer.data.plant_anomaly import CHANNELS, simulate_plant_anomaly
from tsformer.jobs.anomaly import evaluation
from tsformer.jobs.anomaly.judging import AnomalyModel
from tsformer.jobs.anomaly.report import report_lines
from tsformer.predict import main as predict_main
from tsformer.serving.predictor import Predictor
from tsformer.serving.server import answer
from tsformer.tracking import tracking_uri_for
from tsformer.train import compose_config, run

pytestmark = pytest.mark.slow

EVALUATED: dict[tuple, dict] = {}  # TSB-AD's figures by their inputs, over the module's two runs


def evaluated_once(evaluate):
    """`evaluation.evaluate`, its figures kept by their inputs (the bytes of the score, labels and first
    channel, and the threshold): the runs of both detectors fit the same baselines on the same rows
    and evaluate their same scores (TSB-AD's VUS: about a second an evaluation, 7 scores x 4 series a
    run); what differs, the detector's own score, is evaluated for each run."""

    @functools.wraps(evaluate)
    def once(score, label, x_first_channel, threshold=None):
        parts = (score, label, x_first_channel)
        key = (*((a.dtype.str, a.shape, a.tobytes()) for a in map(np.asarray, parts)), threshold)
        if key not in EVALUATED:
            EVALUATED[key] = evaluate(score, label, x_first_channel, threshold)
        return dict(EVALUATED[key])

    return once


@pytest.fixture(
    scope="module", params=["enc_only_anomaly_plant", "dec_only_anomaly"]
)  # the plant's threshold rows
def trained(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)  # mlflow's artifacts land here
        mp.setattr(evaluation, "evaluate", evaluated_once(evaluation.evaluate))  # per_series calls it
        cfg = compose_config([*TINY_ANOMALY, f"model={request.param}", f"logger.mlflow.tracking_uri={uri}", "figures=true"],
                             folder / "out")  # fmt: skip
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            result = run(cfg)
        return result, folder, uri, printed.getvalue()


def test_run_writes_rows_events_model_and_mlflow_run(trained):
    result, folder, uri, _ = trained
    rows = pd.read_csv(folder / "out" / "anomalies.csv")
    assert list(rows.columns[:6]) == ["series_id", "time", "score", "threshold", "alarm", "event_id"]
    assert {"top_channel_1", "label"} <= set(rows.columns)
    assert len(rows) == 4 * 700  # every judged row: the last half of each of the 4 series
    assert set(rows["top_channel_1"]) <= set(CHANNELS)
    events = pd.read_csv(folder / "out" / "events.csv")
    assert list(events.columns) == ["event_id", "series_id", "start", "end", "n_rows", "page_time", "page_delay_rows",
                                    "page_delay", "peak_score", "peak_time", "top_channels"]  # fmt: skip
    assert set(events["event_id"]) == set(rows["event_id"].dropna().astype(int))
    assert {"test/event_recall", "test/false_alarms_per_1000", "test/loss", "test/threshold"} <= set(
        result.metrics
    )
    assert rows["threshold"].iloc[0] == pytest.approx(result.metrics["test/threshold"])
    # the model folder scores the judged rows as the run did
    table = simulate_plant_anomaly(n_steps=1400, test_fraction=0.5)
    _, judged = split_at(table, 0.5, "time")
    again = AnomalyModel.load(result.model_folder).judge(judged)[0]
    np.testing.assert_allclose(again["score"], rows["score"], rtol=1e-6)
    assert (again["event_id"].fillna(-1).to_numpy() == rows["event_id"].fillna(-1).to_numpy()).all()

    import mlflow

    with tracking_uri_for(uri):  # a `runs:/` URI is looked up in the process's tracking URI
        client = mlflow.MlflowClient(uri)
        artifacts = {a.path for a in client.list_artifacts(result.run_id, "plots")}
        logged = client.get_run(result.run_id).data.metrics
        model = mlflow.pyfunc.load_model(f"runs:/{result.run_id}/model")
    assert artifacts == {"plots/anomaly_scores.png", "plots/anomaly_contributions.png"}
    assert logged["test/event_recall"] == result.metrics["test/event_recall"]
    table = simulate_plant_anomaly(n_steps=1400, test_fraction=0.5).head(300)
    expected = AnomalyModel.load(result.model_folder).judge(table)[0]["score"]
    np.testing.assert_allclose(model.predict(table)["score"], expected)
    # tsformer-serve answers with the job's rows of a table
    served = answer(Predictor.of_folder(result.model_folder), table, {})
    np.testing.assert_allclose([row["score"] for row in json.loads(served)["predictions"]], expected)


def test_run_measures_the_score_beside_baselines_fitted_on_its_train_rows(trained, capsys):
    """With labels: TSB-AD's metrics per series of the detector and of each baseline fitted on the same
    train rows (here Hotelling's T² recomputed by hand), and the table in the summary."""
    result = trained[0]
    names = ("hotelling_t2", "pca_residual", "isolation_forest", "random")
    assert {f"test/{b}_vus_pr" for b in names} | {"test/vus_pr", "test/auc_roc"} <= set(result.metrics)
    channels = AnomalyModel.load(result.model_folder).detector.channels  # the measured ones, then the known
    assert sorted(channels) == sorted(CHANNELS)
    by_series = hotelling_vus_pr_by_hand(tuple(channels))
    assert result.metrics["test/n_series_evaluated"] == len(by_series) > 0
    assert result.metrics["test/hotelling_t2_vus_pr"] == pytest.approx(np.mean(by_series), abs=1e-9)


@functools.cache  # the same rows and channels for both detectors: computed once
def hotelling_vus_pr_by_hand(channels: tuple[str, ...]) -> list[float]:
    """TSB-AD's VUS-PR of Hotelling's T² fitted on the plant's train rows, per judged series with both
    kinds of rows, by hand: the score fitted here, `evaluation.evaluate` called here (its figures those
    a run computed where the score is, to the bit, the run's)."""
    from tsformer.data.anomaly import split_normal_rows
    from tsformer.jobs.anomaly.baselines import HotellingT2

    evaluate = evaluated_once(evaluation.evaluate)
    channels = list(channels)
    normal, judged = split_at(simulate_plant_anomaly(n_steps=1400, test_fraction=0.5), 0.5, "time")
    train, _ = split_normal_rows(normal, 0.2)
    score = HotellingT2().fit(train[channels].to_numpy()).score(judged[channels].to_numpy()).score
    label, first = judged["label"].to_numpy(), judged[channels[0]].to_numpy()
    by_series = []
    for sid in judged["series_id"].unique():
        rows = (judged["series_id"] == sid).to_numpy()
        if label[rows].any() and not label[rows].all():
            by_series.append(evaluate(score[rows], label[rows], first[rows])["vus_pr"])
    return by_series


def test_the_summary_lists_events_incidents_and_the_alarm_rate_beside_its_target(trained):
    result, folder, _, summary = trained
    events = pd.read_csv(folder / "out" / "events.csv")
    lines = summary.splitlines()
    assert any(line.startswith("anomaly: 2800 rows judged") for line in lines)
    assert (
        "state channels (0/1 in the train rows: entered as they are, not restored nor forecast): none"
        in lines
    )
    listed = [line for line in lines if line.startswith("  #")]
    assert len(listed) == min(len(events), 20)
    assert any(line.startswith("labelled incidents: 4: ") for line in lines)
    assert sum(line.startswith("  series ") for line in lines) == 4  # each fault: found, late or missed
    rate = result.metrics["test/normal_alarm_rate"]
    assert f"= {rate:.4f} (target 0.01, model.false_alarm_rate)" in summary
    assert "loss" not in summary  # the forecast detector's loss is a negative log likelihood: not shown


def test_predict_py_scores_a_table_and_names_bad_input(trained, tmp_path, capsys):
    result, _, _, _ = trained
    table = simulate_plant_anomaly(n_steps=1400, test_fraction=0.5)
    table.to_csv(tmp_path / "new.csv", index=False)
    # predict.py's code in this process (the contract runs predict.py as a process for both detectors)
    assert (
        predict_main(
            [str(result.model_folder), str(tmp_path / "new.csv"), "-o", str(tmp_path / "scored.csv")]
        )
        == 0
    )
    printed = capsys.readouterr().out
    model = AnomalyModel.load(result.model_folder)
    rows, events, _ = model.judge(table)
    detector = model.detector
    expected = report_lines(rows, events, model.false_alarm_rate, detector.state_names, detector.constant_names,
                            known=detector.known_names, threshold_rows=detector.hparams.threshold_rows)  # fmt: skip
    assert printed.splitlines()[: len(expected)] == expected  # the same report as the run's summary
    scored = pd.read_csv(tmp_path / "scored.csv")
    expected = AnomalyModel.load(result.model_folder).judge(table)[0]
    np.testing.assert_allclose(scored["score"], expected["score"], rtol=1e-6)
    assert (tmp_path / "scored_events.csv").is_file()

    holed = table.copy()
    holed.loc[11, "dynamic_pressure"] = np.nan
    labels = table.copy()
    labels.loc[3, "label"] = 7
    if AnomalyModel.load(result.model_folder).detector.method != "masked":  # the checks are the same for both
        return
    cases = {
        "missing": (table.drop(columns="supply_voltage"), "column 'supply_voltage' is missing"),
        "short": (
            table.head(10),
            "has 10 rows, fewer than one window of 16 (model.context_len + model.horizon)",
        ),
        "empty": (holed, "column 'dynamic_pressure', row 11 (counted from 0): empty"),
        "labels": (labels, "column 'label' (data.label_col), row 3 (counted from 0): 7; labels must be 0"),
    }
    for name, (bad, message) in cases.items():
        bad.to_csv(tmp_path / f"{name}.csv", index=False)
        args = [
            str(result.model_folder),
            str(tmp_path / f"{name}.csv"),
            "--output",
            str(tmp_path / f"{name}_out.csv"),
        ]
        assert predict_main(args) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, (name, err)
        assert not (tmp_path / f"{name}_out.csv").exists()
        assert not (tmp_path / f"{name}_out.csv").exists()


def test_a_new_plant_is_said_plainly_and_recalibrates_on_a_stretch_declared_normal(trained, tmp_path, capsys):
    """The README's new plant (`tsformer-data simulate plant_anomaly --seed 1`), its pressure sensor
    noisier: predict.py says in one line that the table is unlike the threshold's normal
    rows; with --normal-rows (params["normal_rows"] of the predictor) it is judged by the model
    recalibrated on that stretch, the model folder left as it is."""
    result, _, _, _ = trained
    table = simulate_plant_anomaly(n_steps=1400, test_fraction=0.5, seed=1)
    sd = table["dynamic_pressure"].std()  # a changed sensor: its reading 3 sd noisier
    table["dynamic_pressure"] += np.random.default_rng(0).normal(0.0, 3 * sd, len(table))
    table.to_csv(tmp_path / "new.csv", index=False)
    out = str(tmp_path / "scored.csv")
    assert predict_main([str(result.model_folder), str(tmp_path / "new.csv"), "-o", out]) == 0
    plain = capsys.readouterr().out.splitlines()
    unlike = [line for line in plain if line.startswith("unlike the normal rows the threshold came from: ")]
    assert len(unlike) == 1 and "--normal-rows A:B" in unlike[0] and "init_from" in unlike[0]
    before = pd.read_csv(out)

    args = [str(result.model_folder), str(tmp_path / "new.csv"), "-o", out, "--normal-rows", "0:300"]
    assert predict_main(args) == 0
    printed = capsys.readouterr().out
    assert "threshold recalibrated on the rows declared normal (normal_rows=0:300)" in printed
    after = pd.read_csv(out)
    model = AnomalyModel.load(result.model_folder)
    stretch = np.concatenate([rows[:300] for rows in table.groupby("series_id", sort=False).indices.values()])
    detector = model.detector
    threshold = float(detector.threshold)
    detector.calibrate(table.iloc[np.sort(stretch)].reset_index(drop=True))  # the same rows, by hand
    assert after["threshold"].iloc[0] == pytest.approx(float(detector.threshold))
    assert before["threshold"].iloc[0] == pytest.approx(threshold) != after["threshold"].iloc[0]
    # the predictor (tsformer-serve, the pyfunc model) takes the same key; the folder's model is unchanged
    predictor = Predictor.of_folder(result.model_folder)
    served = predictor.predict(table, {"normal_rows": "0:300"})
    np.testing.assert_allclose(served["threshold"], after["threshold"])
    assert predictor.predict(table.head(200), {})["threshold"].iloc[0] == pytest.approx(threshold)
    for spec, message in [("x", "give 'A:B'"), ("5000:6000", "no row of the table lies in it")]:
        assert predict_main([*args[:-1], spec]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_the_plants_weather_and_supply_condition_the_detector_and_are_never_scored(trained):
    """experiment=plant_anomaly declares its ambient inputs known (data.known_cols): channels of the
    detector, after the measured ones, never hidden in training, contributing nothing to a score; the
    summary and the model folder name them."""
    result, _, _, summary = trained
    known = ["ambient_pressure", "ambient_temperature", "supply_voltage"]
    assert "known inputs (condition the detector, never hidden nor scored): " + ", ".join(known) in summary
    detector = AnomalyModel.load(result.model_folder).detector
    assert detector.channels == ["dynamic_temperature", "dynamic_pressure", *known]
    assert detector.known_names == known and detector.is_scored.tolist() == [True, True, False, False, False]
    written = json.loads((result.model_folder / "tsformer.json").read_text())
    assert written["hparams"]["known_channels"] == known
    table = simulate_plant_anomaly(n_steps=1400, test_fraction=0.5).head(300)
    changed = table.assign(ambient_temperature=table["ambient_temperature"] + 1.0)
    scores = detector.score(changed)
    assert (scores.contributions[:, 2:] == 0).all()  # a condition is never scored itself ...
    assert not np.allclose(scores.score, detector.score(table).score)  # ... but the scores depend on it
    if detector.method == "masked":
        assert not detector.hidden_mask((64, 16, 5))[..., 2:].any()


def test_predict_reads_each_series_first_rows_as_context_and_judges_the_rest(trained, tmp_path):
    """predict.py --context-rows N (params["context_rows"]): each series' first N rows are read by the first
    windows, not judged nor written; the rows after them scored as the job scores judged rows after
    their normal rows (`data.judge_context`)."""
    result, _, _, _ = trained
    table = simulate_plant_anomaly(n_steps=1400, test_fraction=0.5)
    table.to_csv(tmp_path / "new.csv", index=False)
    out = str(tmp_path / "scored.csv")
    assert (
        predict_main(
            [str(result.model_folder), str(tmp_path / "new.csv"), "-o", out, "--context-rows", "700"]
        )
        == 0
    )
    rows = pd.read_csv(out)
    normal, judged = split_at(table, 0.5, "time")
    assert len(rows) == len(judged)
    assert pd.to_datetime(rows["time"]).tolist() == pd.to_datetime(judged["time"]).tolist()
    expected = AnomalyModel.load(result.model_folder).judge(judged, context=normal)[0]
    np.testing.assert_allclose(rows["score"], expected["score"], rtol=1e-6)
    served = Predictor.of_folder(result.model_folder).predict(table, {"context_rows": "700"})
    np.testing.assert_allclose(served["score"], expected["score"], rtol=1e-6)
