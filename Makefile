# The two commands of the README: `make demo` and `make test`. Each builds .venv from nothing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := --quiet --disable-pip-version-check
# The lowest supported versions (constraints-lowest.txt), next to an application's own
# narrower ranges: the environment the lowest-versions pass runs in, built once.
LOWEST := .venv-lowest
LOWEST_STAMP := $(LOWEST)/.installed
APP_RANGES := 'sqlalchemy>=2.0,<2.1' 'alembic<1.15' 'tenacity<9' 'redis>=6.4,<7'
# What that pass runs (about 2 minutes): the private Celery/kombu names, the app's Alembic
# next to the platform's, and a package of a team's own on the wheel with real workers.
LOWEST_TESTS := tests/unit/test_internals.py tests/integration/sql/test_app_alembic.py \
	tests/acceptance/test_lowest_versions.py

.PHONY: install services lint typecheck unit test lowest demo bench chaos clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP) --upgrade pip
	$(BIN)/python -m pip install $(PIP) -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(LOWEST_STAMP): pyproject.toml constraints-lowest.txt
	rm -rf $(LOWEST)
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install $(PIP) -c constraints-lowest.txt \
		'.[postgres,gevent]' $(APP_RANGES) pytest pytest-timeout hypothesis
	touch $(LOWEST_STAMP)

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
	$(MAKE) lowest

# The checkout's wheel (no dependencies: they stay at the lowest versions) over the cached
# environment, `pip check` (the wheel's ranges hold the versions installed), then the pass.
lowest: $(LOWEST_STAMP) services
	$(LOWEST)/bin/python -m pip install $(PIP) --no-deps --force-reinstall .
	$(LOWEST)/bin/python -m pip check
	JOBS_LOWEST_VERSIONS=1 $(LOWEST)/bin/pytest $(LOWEST_TESTS)

# BROKER=rabbitmq (or JOBS_DEMO_BROKER=rabbitmq): the same tour on the RabbitMQ at
# 127.0.0.1:5672, in a vhost of its own (docs/demo.md).
demo: install
	$(BIN)/python -m tasks.demo $(if $(BROKER),--broker $(BROKER))

bench: install services
	$(BIN)/python -m bench.throughput
	$(BIN)/python -m bench.brokers
	$(BIN)/python -m bench.delayed
	$(BIN)/python -m bench.scrape
	$(BIN)/python -m bench.costs
	$(BIN)/python -m bench.io_profile
	$(BIN)/python -m bench.memory
	$(BIN)/python -m bench.dispatch
	$(BIN)/python -m bench.retries
	$(BIN)/python -m bench.ratelimit
	$(BIN)/python -m bench.concurrency
	$(BIN)/python -m bench.fairness
	$(BIN)/python -m bench.dlq_listing
	$(BIN)/python -m bench.outbox
	$(BIN)/python -m bench.batches

# The long soak (20,000 jobs under kills, a Redis restart and a database cut; ~10 min), then
# the same on a three-node RabbitMQ cluster of its own whose fast-queue leader node is killed
# four times (~8 min), after the cluster harness's own proof. The short forms (2,000 jobs)
# run in `make test` (tests/acceptance/test_chaos.py, tests/acceptance/test_chaos_rabbitmq.py).
chaos: install services
	$(BIN)/python -m bench.chaos --jobs 20000
	JOBS_CLUSTER_CHAOS=1 $(BIN)/pytest -q tests/integration/rabbitmq/test_cluster.py
	$(BIN)/python -m bench.chaos --broker rabbitmq-cluster --jobs 20000 --leader-kills 4 \
		--results bench/results/chaos-rabbitmq.json

clean:
	rm -rf $(VENV) $(LOWEST) .pytest_cache .mypy_cache .ruff_cache .demo jobs_platform.sqlite3*
