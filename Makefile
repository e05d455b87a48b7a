# The workbench's two commands: `make lab` and `make test` (plus `make bench`, and `make test-gpu` on a GPU machine).
# Both create or reuse .venv and install the project into it; installing again
# is a no-op unless pyproject.toml changed (the stamp carries its hash).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell sha1sum pyproject.toml | cut -c1-12)
STAMP := $(VENV)/.installed-$(HASH)
PYTEST_ARGS ?=

.PHONY: install lab test test-gpu bench clean help

help:
	@echo "make lab    - set up .venv and start JupyterLab on 127.0.0.1 with the tour notebook"
	@echo "make test   - set up .venv and run the whole test suite"
	@echo "make test-gpu - set up .venv and run the tests marked gpu (needs CUDA; fails without it)"
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

# The GPU tier: every test marked gpu (tests/gpu and any other). `make test` skips them without CUDA.
test-gpu: install
	@$(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else \
		'make test-gpu needs CUDA, but torch.cuda.is_available() is False here (torch ' + torch.__version__ + \
		'); run it on a machine with an NVIDIA GPU, or use make test for the CPU tiers')"
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m gpu $(PYTEST_ARGS) tests

bench: install
	OMP_NUM_THREADS=1 $(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
