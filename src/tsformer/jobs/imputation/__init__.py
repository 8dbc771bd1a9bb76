"""Imputation: the gaps of a table filled by a masked fill-in model (`job.py`: `impute`, predict.py
--impute; its model is a `Forecaster`).
"""
