"""The MLflow pyfunc model of a run, as MLflow's "model from code" (nothing pickled).

MLflow copies this file into the logged model and runs it when the model is loaded; it wraps the
run's model folder (`tsformer.jobs.forecasting.forecaster`), logged beside it as the artifact `model_folder`, and the
tsformer package itself (logged as code), so that in any Python process with the dependencies:

    model = mlflow.pyfunc.load_model("runs:/<run id>/model")        # or "models:/<name>/<version>"
    forecasts = model.predict(table)                                  # the forecasts CSV's columns
    forecasts = model.predict(table, params={"origin": "2024-05-01 12:00"})  # backtest from a time
    classes = model.predict(sequences)                                # a classifier's run: classes

`table` is laid out as for `python predict.py` (see `Forecaster.predict`). The logging side is
`tracking.log_pyfunc_model`.
"""

import mlflow
import pandas as pd

from tsformer.jobs import load_model


class TsformerForecastModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        self.forecaster = load_model(context.artifacts["model_folder"])  # a Forecaster or a Classifier

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        origin = (params or {}).get(
            "origin"
        ) or None  # "" (the signature's default): each series' last target
        return self.forecaster.predict(model_input, origin=origin, source="model input")


mlflow.models.set_model(TsformerForecastModel())
