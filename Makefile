# ballast: `make demo` and `make test` work on a fresh machine; .venv is (re)built when
# pyproject.toml or constraints.txt change.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Bytecode caches on, whatever the shell says: every rank, worker and CLI process of the
# suite imports ballast, and compiling it anew each time cost 11% of the DDP launch tests
# (57.9 -> 51.5 s); __pycache__/ is ignored by git.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help venv demo test test-quick nightly soak lint audit format clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)  ## create or refresh .venv from pyproject.toml + constraints.txt

demo: $(STAMP)  ## generate a skewed sample and run the whole pipeline on it
	$(BIN)/ballast demo --work-dir demo-output

# Two tiers (tests/tiers.py): `slow` tests start a process or a service, the rest may not.
test: $(STAMP)  ## the whole suite, as CI runs it (starts its own local services)
	$(BIN)/pytest -n 3 --dist loadgroup --no-loadscope-reorder --durations=25 -m "not nightly"

# On 2 xdist workers: serial it took 3:06-3:25 on a 2-core host, 2:09 on two (target 3 min).
test-quick: $(STAMP)  ## the quick tier for the edit loop: pure logic, no process or service
	$(BIN)/pytest -n 2 -m "not slow" --durations=10

# 30 nights of the incremental chain, one seeded fault a night (tests/soak/chain.py); long.
soak: $(STAMP)  ## the nightly chain under faults for 30 nights, then the per-fault table
	BALLAST_SOAK_NIGHTS=$${BALLAST_SOAK_NIGHTS:-30} $(BIN)/pytest -q -s tests/soak

# Tests of several pipeline runs, or of tasks of minutes (the `nightly` marker): five at once
# on one Prefect and one MLflow server (tests/nightly), two nights read through MLflow's REST
# API, a stage of 60 s+ tasks on a slowed worker under the stall watch's defaults, and the
# benchmarks that start several runs at their smallest size; not in `test`.
nightly: $(STAMP)  ## the nightly tier: several pipelines at once, their wall times printed
	BALLAST_NIGHTLY=1 $(BIN)/pytest -q -s -p no:randomly -m nightly --durations=10

lint: $(STAMP)  ## ruff (lint and formatting), mypy and the import-linter contracts of docs/architecture.md
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# --strict: a pin that cannot be looked up fails the audit instead of passing unaudited.
audit: $(STAMP)  ## known vulnerabilities of every pin in constraints.txt (needs PyPI's JSON API)
	@test -x $(BIN)/pip-audit || $(BIN)/pip install --quiet --disable-pip-version-check pip-audit
	$(BIN)/pip-audit --requirement constraints.txt --disable-pip --no-deps --strict \
		--progress-spinner off

format: $(STAMP)  ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:  ## remove demo output and caches (keeps .venv)
	rm -rf demo-output .mypy_cache .ruff_cache .pytest_cache
