"""`tsformer-serve`'s reading of requests and writing of answers, without a server or a trained model
(the end-to-end request against a real server: tests/test_mlflow_logged_model.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tsformer.data.schema import DataValidationError
from tsformer.serving.server import BadRequest, answer, read_request

TABLE = pd.DataFrame(
    {"series_id": [0, 0], "time": ["2024-01-01 00:00", "2024-01-01 00:01"], "x": [1.5, None]}
)


@pytest.mark.parametrize(
    "body, content_type",
    [
        (
            json.dumps({"dataframe_split": json.loads(TABLE.to_json(orient="split", index=False))}),
            "application/json",
        ),
        (json.dumps({"dataframe_records": json.loads(TABLE.to_json(orient="records"))}), "application/json"),
        (TABLE.to_csv(index=False), "text/csv; charset=utf-8"),
    ],
    ids=["dataframe_split", "dataframe_records", "csv"],
)
def test_the_formats_of_mlflows_scoring_protocol_give_the_table(body, content_type):
    table, params = read_request(body.encode(), content_type)
    pd.testing.assert_frame_equal(table.astype({"time": str}), TABLE, check_dtype=False)
    assert params == {}


def test_a_csv_body_is_read_with_the_training_files_options():
    body = "series_id;time;x\n0;2024-01-01 00:00;1,5\n"
    table, _ = read_request(body.encode(), "text/csv", {"sep": ";", "decimal": ",", "encoding": None})
    assert table.x.tolist() == [1.5]


@pytest.mark.parametrize(
    "body, content_type, says",
    [
        (b"{not json", "application/json", "not JSON"),
        (b'{"data": []}', "application/json", "dataframe_split"),
        (b"x", "application/xml", "application/json or text/csv"),
    ],
)
def test_a_request_it_cannot_read_is_one_line(body, content_type, says):
    with pytest.raises(BadRequest, match=says) as err:
        read_request(body, content_type)
    assert "\n" not in str(err.value)


class Refusing:
    """A predictor that refuses every table with a message of several lines."""

    def predict(self, table, params=None, source=""):
        raise DataValidationError(f"{source}: missing column 'supply_voltage'\nsecond line")


class Echo:
    def predict(self, table, params=None, source=""):
        return table.assign(origin=params["origin"], when=pd.to_datetime(table.time))


def test_missing_values_are_null_and_a_refused_table_is_its_first_line():
    strict = json.loads(answer(Echo(), TABLE, {"origin": "2024-01-01 00:00"}), parse_constant=pytest.fail)
    rows = strict["predictions"]
    assert rows[1]["x"] is None and rows[0]["x"] == 1.5 and rows[0]["origin"] == "2024-01-01 00:00"
    assert rows[0]["when"].startswith("2024-01-01T00:00:00")
    with pytest.raises(BadRequest) as err:
        answer(Refusing(), TABLE, {})
    assert str(err.value) == "the request's table: missing column 'supply_voltage'"
    assert np.isnan(TABLE.x[1])  # the request's table itself is left as it was
