"""What every job shares to put a model to use: `references` (a run id, model URI or folder -> the
model folder, its job and inference object), `writers` (atomic writes), `server` (tsformer-serve: HTTP
in MLflow's scoring protocol) and `pyfunc` (the MLflow pyfunc model)."""
