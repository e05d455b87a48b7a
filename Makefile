# The workbench's two commands: `make lab` and `make test` (plus `make bench`, and `make test-gpu` or
# `make gpu-check` on a GPU machine).
# Both create or reuse .venv and install the project into it; installing again
# is a no-op unless pyproject.toml changed (the stamp carries its hash).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell sha1sum pyproject.toml | cut -c1-12)
STAMP := $(VENV)/.installed-$(HASH)
PYTEST_ARGS ?=
OUT ?= bench/gpu/latest
# Processes write the bytecode of what they import, even where the machine sets PYTHONDONTWRITEBYTECODE (this
# project's machines do) and uv installed without it: otherwise every process compiled torch's modules from
# source again (`import torch, torch._dynamo`: 9.4 s of CPU without bytecode against 3.8 s with it, medians of
# three, in every rank of every run). Each module is compiled once, by the first process that imports it, which
# is cheaper than compiling the whole venv at install (81 s here).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: install lab test test-quick test-gpu gpu-check gpu-wheels bench site clean help

help:
	@echo "make lab    - set up .venv and start JupyterLab on 127.0.0.1 with the tour notebook"
	@echo "make test   - set up .venv and run the whole test suite"
	@echo "make test-quick - the tests that launch no run and open no browser (the edit loop)"
	@echo "make test-gpu - set up .venv and run the tests marked gpu (needs CUDA; fails without it)"
	@echo "make gpu-check [OUT=dir] - the gpu tier and bench/bench_gpu.py on this GPU, summary in OUT"
	@echo "               (default bench/gpu/latest; uses the first Python whose torch sees CUDA, never reinstalls torch)"
	@echo "make gpu-wheels - download into .whl/ the wheels the lent GPU image lacks (for an offline gpu-check)"
	@echo "make bench  - set up .venv and run the benchmarks in bench/"
	@echo "make site   - build the static site (docs and executed lessons, offline) into site/; open site/index.html"

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV) $(PYTHON)
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install: $(STAMP)

lab: install
	bash scripts/lab.sh

# The whole suite on TEST_WORKERS pytest-xdist workers (2 by default; 0: one process). The JupyterLab tests stay
# together on one worker, and so do the tests of the one-host Slurm cluster. On this project's 2-core machine, with
# the ranks started warm, two workers ran the suite in 13:18 against 15:30 in one process (bench/RESULTS.md,
# "Test suite time"): one worker's runs fill the cores while the other's browser, notebook and Slurm tests wait.
TEST_WORKERS ?= 2
# test-quick and test-gpu run in one process unless TEST_WORKERS is given (on the command line or in the environment)
OTHER_WORKERS := $(if $(filter file,$(origin TEST_WORKERS)),0,$(TEST_WORKERS))

# The site's tests (marked site) come second, in a session of their own: by then the first has executed every
# lesson and left its copy in build/lessons/, so the site is built from those copies instead of executing lessons
# a second time (scripts/build_site.py executes only what is missing or stale). Only the files that hold them are
# collected: collecting the whole tree again cost about 20 s.
SITE_TESTS := $(shell grep -rl --include='test_*.py' 'pytest.mark.site' tests)
test: install
	bash scripts/ensure_chromium.sh
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup) -m "not site" --durations=25 $(PYTEST_ARGS)
	OMP_NUM_THREADS=1 WORKBENCH_COLD_RANKS=1 $(BIN)/python -m pytest -m site $(SITE_TESTS) $(PYTEST_ARGS)

# The edit loop's tier: the tests that launch no run and open no browser (the whole suite is make test).
test-quick: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q $(if $(filter-out 0,$(OTHER_WORKERS)),-n $(OTHER_WORKERS)) -m "not multiproc and not notebook and not browser and not gpu and not slow" $(PYTEST_ARGS)

# The GPU tier: every test marked gpu (tests/gpu and any other). `make test` skips them without CUDA.
test-gpu: install
	@$(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else \
		'make test-gpu needs CUDA, but torch.cuda.is_available() is False here (torch ' + torch.__version__ + \
		'); run it on a machine with an NVIDIA GPU, or use make test for the CPU tiers')"
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m gpu $(if $(filter-out 0,$(OTHER_WORKERS)),-n $(OTHER_WORKERS)) $(PYTEST_ARGS) tests

# The GPU tier and the GPU benchmark in one command, on the lent GPU machines too: the script picks a Python
# whose torch sees CUDA (.venv or python3) and installs only what that Python lacks, so no install step here.
gpu-check:
	bash scripts/gpu_check.sh $(OUT)

gpu-wheels: install
	bash scripts/gpu_wheels.sh

bench: install
	OMP_NUM_THREADS=1 $(BIN)/python bench/run_all.py

# The docs and every lesson executed in its short mode, as a static site that needs no network (mkdocs.yml). A lesson
# that the notebook tests executed since it last changed is not executed again (build/lessons/).
site: install
	OMP_NUM_THREADS=1 $(BIN)/python scripts/build_site.py

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts site build/lessons build/site-src
