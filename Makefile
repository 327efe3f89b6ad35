# Parley: `make run` starts the gateway, `make test` runs the suite. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config.example.yaml
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: run chat test lint bench install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install -q -c constraints.txt -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

run: install
	$(BIN)/parley gateway --config $(CONFIG)

chat: install
	$(BIN)/parley chat --config $(CONFIG)

test: install-test
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -rs

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/mypy gateway channels agent workspace

bench: install-test
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info
