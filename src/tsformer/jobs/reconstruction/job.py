"""State reconstruction (model=enc_only, horizon 0): the targets of every row rebuilt from the inputs of
its window. The files, figures and metrics are forecasting's (`jobs/forecasting.py`); the figures and
predict.py's windows follow `task.reconstructs`."""

from __future__ import annotations

from dataclasses import replace

from tsformer.jobs.base import TIME_FORMAT, predict_usage
from tsformer.jobs.forecasting import job as forecasting
from tsformer.tasks.reconstruction import ReconstructionTask

JOB = replace(
    forecasting.JOB,
    name="reconstruction",
    tasks=(ReconstructionTask,),
    # a reconstruction has no forecast origin: every row is rebuilt from the inputs of its window (around
    # it: whole tables only, no stream)
    prediction=replace(forecasting.JOB.prediction, params=(TIME_FORMAT,), stream=None),
    usage=predict_usage("reconstruct the targets of new data", "--output", "reconstruction.csv"),
)
