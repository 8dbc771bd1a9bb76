"""Forecasting: a window model's run and its use on new tables.

- `job.py`: the job (`JOB`): test forecasts, their CSV, figures, the summary, predict.py's use
- `forecaster.py`: the model folder of a window model (`DataContract`) and `Forecaster.predict`
- `export.py`: forecasts -> the tidy long frame (`COLUMNS`), sampled paths, error by step
- `plots.py`: forecast windows, error by step, attention maps, fan chart
"""
