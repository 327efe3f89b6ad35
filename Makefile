# Parley: `make run` starts the gateway, `make test` runs the suite. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The config every `parley` command reads by default; `make run` writes it the first time
# (`parley onboard --non-interactive`: the model from PARLEY_MODEL / PARLEY_API_BASE /
# PARLEY_API_KEY, WebChat on). `make run CONFIG=config.example.yaml` runs the example instead.
CONFIG ?= $(or $(PARLEY_CONFIG),$(HOME)/.parley/config.yaml)
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: run chat test lint bench install install-test system-deps bench-deps clean

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
	@test -f "$(CONFIG)" || $(BIN)/parley onboard --non-interactive --skip-test --config "$(CONFIG)"
	$(BIN)/parley gateway --config "$(CONFIG)"

chat: install
	@test -f "$(CONFIG)" || $(BIN)/parley onboard --non-interactive --skip-test --config "$(CONFIG)"
	$(BIN)/parley chat --config "$(CONFIG)"

# System packages tests drive for real (Debian's chromium for the WebChat browser tests,
# bubblewrap and prlimit for the exec sandbox, postgresql for the several-process store: the
# tests start a throwaway cluster of their own), installed with apt-get when missing and allowed
# (root, or sudo without a password); otherwise the command to run is printed and those tests
# say why they skip. Written package:program where the program has another name.
SYSTEM_PACKAGES := chromium bubblewrap:bwrap util-linux:prlimit postgresql:pg_ctlcluster
# `make bench` also counts a turn's instructions with valgrind's callgrind (item 12).
BENCH_PACKAGES := $(SYSTEM_PACKAGES) valgrind:callgrind_control
define install_missing
	@missing=""; for p in $(1); do \
	  command -v "$${p#*:}" >/dev/null || missing="$$missing $${p%%:*}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else sudo=none; fi; \
	  if [ "$$sudo" = none ]; then echo "make: missing system packages:$$missing (apt-get install$$missing)" >&2; \
	  else { $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing; } \
	    || echo "make: could not install$$missing; the $(2) that need them will say so" >&2; fi; \
	fi
endef

system-deps:
	$(call install_missing,$(SYSTEM_PACKAGES),tests)

bench-deps:
	$(call install_missing,$(BENCH_PACKAGES),benchmarks)

test: install-test system-deps
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -rs

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/mypy gateway channels agent workspace parley bench

bench: install-test bench-deps
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build *.egg-info
