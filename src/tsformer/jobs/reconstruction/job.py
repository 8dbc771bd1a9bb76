"""State reconstruction (model=enc_only, horizon 0): the targets of every row rebuilt from the inputs of
its window. The files, figures and metrics are forecasting's (`jobs/forecasting.py`); the figures and
predict.py's windows follow `task.reconstructs`."""

from __future__ import annotations

from dataclasses import replace

from tsformer.jobs.base import predict_usage
from tsformer.jobs.forecasting import job as forecasting
from tsformer.tasks.reconstruction import ReconstructionTask

JOB = replace(
    forecasting.JOB,
    name="reconstruction",
    tasks=(ReconstructionTask,),
    usage=predict_usage("reconstruct the targets of new data", "--output", "reconstruction.csv"),
)
