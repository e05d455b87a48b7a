# The workbench's two commands: `make lab` and `make test` (plus `make bench`).
# Both create or reuse .venv and install the project into it; installing again
# is a no-op unless pyproject.toml changed (the stamp carries its hash).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell sha1sum pyproject.toml | cut -c1-12)
STAMP := $(VENV)/.installed-$(HASH)
PYTEST_ARGS ?=

.PHONY: install lab test bench clean help

help:
	@echo "make lab    - set up .venv and start JupyterLab on 127.0.0.1 with the tour notebook"
	@echo "make test   - set up .venv and run the whole test suite"
	@echo "make bench  - set up .venv and run the benchmarks in bench/"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install: $(STAMP)

lab: install
	bash scripts/lab.sh

test: install
	bash scripts/ensure_chromium.sh
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	OMP_NUM_THREADS=1 $(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
