# Set-up, demo and tests. Each target creates .venv (if missing) and installs the project first,
# so a fresh machine needs only Python 3.10+ and make.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Offline and quiet: no telemetry, no hub access in tests.
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 90

.PHONY: setup demo test lint bench docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The CPU build of torch first, so nothing later pulls the multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $@

demo: setup
	$(BIN)/dapo demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

bench: setup
	$(BIN)/pip install -q -c constraints.txt -e '.[bench]'
	$(BIN)/python -m bench

# The documentation site: the generated reference pages, then site/ (a broken link fails it).
docs: setup
	$(BIN)/python -m flows.reference_docs && $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
