# Two commands do all set-up on a fresh clone: `make train` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build; a GPU user installs a CUDA build into .venv first (see README) and this step keeps it.
TORCH_VERSION ?= 2.13.0
# TSB-AD's published anomaly metrics, installed with --no-deps: its evaluation needs only numpy,
# scikit-learn, scipy and statsmodels (our dependencies), while its requirements pin numpy<2 and pull
# torch, transformers, tslearn, stumpy and more
TSB_AD_VERSION := 1.5

.PHONY: install test test-fast lint format train serve bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==$(TORCH_VERSION)"
	$(PY) -m pip install -q -e ".[dev,spark]"
	$(PY) -m pip install -q --no-deps "TSB-AD==$(TSB_AD_VERSION)"
	touch $@

# pytest exits 5 when it collects no test; that is a failure of the suite, not a pass.
# A worker process per core and one more (at most 4; tests/conftest.py), a test file per worker (its
# module fixtures train once): the suite's runs are small and single-threaded, so the cores share them.
# Files are handed out in the order tests/conftest.py sets (the long ones first), not by their number
# of tests (xdist's default, which left long files of few tests to the end).
test: install
	$(PY) -m pytest -q --numprocesses=auto --maxprocesses=4 --dist=loadfile --no-loadscope-reorder

# The unit tests alone (under a minute on 2 cores): no training run, no real data, no GPU, no Spark
# (markers in pyproject.toml). Run it while working; `make test` before a commit.
test-fast: install
	$(PY) -m pytest -q --numprocesses=auto --maxprocesses=4 --dist=loadfile --no-loadscope-reorder \
		-m "not slow and not needs_data and not gpu and not spark"

LINT_PATHS := src tests benchmarks tools train.py predict.py

lint: install
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

# Rewrites files: ruff's safe fixes (imports sorted, ...), then its formatting
format: install
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)
	$(VENV)/bin/ruff format $(LINT_PATHS)

train: install
	$(PY) train.py

# make serve MODEL=<run id | folder> [PORT=5001]: the model answers on http://127.0.0.1:$(PORT)/invocations
PORT ?= 5001
serve: install
	@test -n "$(MODEL)" || { echo "error: give the model: make serve MODEL=<run id | runs:/<id>/model | folder>" >&2; exit 2; }
	$(VENV)/bin/tsformer-serve "$(MODEL)" --port $(PORT)

bench: install
	$(PY) benchmarks/kv_cache.py

clean:
	rm -rf $(VENV) outputs multirun mlflow.db mlartifacts .pytest_cache
