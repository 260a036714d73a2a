# The two commands of the README: `make demo` and `make test`. Each builds .venv from nothing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install services lint typecheck unit test demo bench chaos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

services:
	@bash ops/ensure-services.sh

lint: install
	$(BIN)/ruff check jobs_platform tasks tests bench docs/generate.py
	$(BIN)/ruff format --check jobs_platform tasks tests bench docs/generate.py

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest tests/unit

test: install services lint typecheck
	$(BIN)/pytest

demo: install
	$(BIN)/python -m tasks.demo

bench: install services
	$(BIN)/python -m bench.throughput
	$(BIN)/python -m bench.delayed
	$(BIN)/python -m bench.scrape
	$(BIN)/python -m bench.costs
	$(BIN)/python -m bench.io_profile
	$(BIN)/python -m bench.memory
	$(BIN)/python -m bench.dispatch
	$(BIN)/python -m bench.retries
	$(BIN)/python -m bench.ratelimit
	$(BIN)/python -m bench.dlq_listing

# The long soak (20,000 jobs under kills, a Redis restart and a database cut; ~10 min).
# Its short form (2,000 jobs) runs in `make test` (tests/acceptance/test_chaos.py).
chaos: install services
	$(BIN)/python -m bench.chaos --jobs 20000

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .demo jobs_platform.sqlite3*
