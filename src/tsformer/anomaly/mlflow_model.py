"""The MLflow pyfunc model of an anomaly run, as MLflow's "model from code" (nothing pickled):

    model = mlflow.pyfunc.load_model("runs:/<run id>/model")
    rows = model.predict(table)        # per row: score, threshold, alarm, event_id, top channels

It wraps the run's model folder (`job.AnomalyModel`), logged beside it as the artifact `model_folder`.
"""

import mlflow
import pandas as pd

from tsformer.anomaly.job import AnomalyModel


class TsformerAnomalyModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        self.model = AnomalyModel.load(context.artifacts["model_folder"])

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        return self.model.judge(model_input)[0]


mlflow.models.set_model(TsformerAnomalyModel())
