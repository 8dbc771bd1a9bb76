"""State reconstruction: a window model whose targets are rebuilt at every step of its window
(`job.py`: the forecasting job's functions, named after this job; its model is a `Forecaster`).
"""
