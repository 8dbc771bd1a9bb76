"""`Predictor`'s params: every job's options are declared (`Prediction.params`); an unknown key, a value
of the wrong type or a required switch left out is one line naming it, before the model sees the table.
(The three ways of answering with a trained model of every job: tests/contract.py.)"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from tsformer.jobs import JOBS
from tsformer.jobs.base import ORIGIN, TIME_FORMAT, Param, Prediction
from tsformer.serving.predictor import Predictor

SWITCH = Param("explain", "add each channel's share", kind=bool)
REQUIRED = Param("impute", "fill the empty cells", kind=bool, required=True)


def echo(params: tuple[Param, ...]) -> Predictor:
    """A predictor whose answer is the params it was given, one row."""
    prediction = Prediction(lambda model, table, given, source: pd.DataFrame([given]), lambda *a: "", params)
    return Predictor(replace(JOBS["forecasting"], prediction=prediction), model=None)


def test_every_declared_param_reaches_the_answer_unset_ones_as_none_or_false():
    predictor = echo((ORIGIN, TIME_FORMAT, SWITCH))
    got = (
        predictor.predict(pd.DataFrame(), {"origin": "2024-01-01 00:00", "time_format": ""}).iloc[0].to_dict()
    )
    assert got == {"origin": "2024-01-01 00:00", "time_format": None, "explain": False}
    assert predictor.predict(pd.DataFrame(), {"explain": True}).explain.item() is True


@pytest.mark.parametrize(
    "params, says",
    [
        (
            {"horizon": 3},
            "params: 'horizon' is not an option of a forecasting model (its options: origin, explain)",
        ),
        ({"origin": 5}, "params: origin=5 is not text"),
        ({"explain": "yes"}, "params: explain='yes' is not true or false"),
        (["origin"], "params must be an object of options, got list"),
    ],
)
def test_a_bad_param_is_one_line_naming_it(params, says):
    with pytest.raises(ValueError) as err:
        echo((ORIGIN, SWITCH)).predict(pd.DataFrame(), params)
    assert str(err.value) == says


def test_a_required_switch_left_out_is_refused_with_its_option():
    predictor = echo((REQUIRED,))
    with pytest.raises(
        ValueError,
        match=r"impute: a model of the forecasting job answers with impute=true only \(predict.py --impute\)",
    ):
        predictor.predict(pd.DataFrame(), {})
    assert predictor.predict(pd.DataFrame(), {"impute": True}).impute.item() is True


def test_every_job_declares_its_params_once_with_a_help():
    for job in JOBS.values():
        names = [p.name for p in job.prediction.params]
        assert len(names) == len(set(names)), job.name
        assert all(p.help and p.kind in (str, bool) for p in job.prediction.params), job.name
