# The two commands of the README: `make demo` (set-up + the demo pipeline) and `make test`.
# Both create the virtual environment .venv from pyproject.toml on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup demo test

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[hf,jax,report,test,tpu]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tpulm run

test: $(STAMP)
	$(BIN)/python -m pytest
