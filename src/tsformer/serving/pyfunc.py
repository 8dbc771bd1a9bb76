"""The MLflow pyfunc model of a run, as MLflow's "model from code" (nothing pickled).

MLflow copies this file into the logged model and runs it when the model is loaded; it wraps the
run's model folder, logged beside it as the artifact `model_folder`, and the tsformer package itself
(logged as code), so that in any Python process with the dependencies:

    model = mlflow.pyfunc.load_model("runs:/<run id>/model")        # or "models:/<name>/<version>"
    forecasts = model.predict(table)                                  # the forecasts CSV's columns
    forecasts = model.predict(table, params={"origin": "2024-05-01 12:00"})  # backtest from a time
    classes = model.predict(sequences)                                # a classifier's run: classes
    filled = model.predict(table, params={"impute": True})            # a fill-in model's run

It answers as predict.py and tsformer-serve do, through the folder's `Predictor` (`serving.predictor`):
`table` is laid out as for `python predict.py`, `params` are the options of the model's job. The
logging side is `serving.pyfunc_logging.log_pyfunc_model`.
"""

import mlflow
import pandas as pd

from tsformer.serving.predictor import Predictor


class TsformerModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        self.predictor = Predictor.of_folder(context.artifacts["model_folder"])

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        return self.predictor.predict(model_input, params, source="model input")


mlflow.models.set_model(TsformerModel())
