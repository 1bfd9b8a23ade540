# Relay Batches — every task is a make target. `make run` and `make test` set up first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST := $(BIN)/pytest -p no:cacheprovider

.PHONY: setup run test unit integration e2e chaos lint format migrate clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

migrate: setup
	$(BIN)/relay migrate

run: setup
	$(BIN)/relay dev

# The whole suite against the real Postgres and RabbitMQ (no benchmarks).
test: setup lint
	RELAY_CHAOS_SERVERS= $(PYTEST) tests/unit tests/integration tests/e2e tests/chaos/test_kills.py

unit: setup
	$(PYTEST) tests/unit

integration: setup
	$(PYTEST) tests/integration

e2e: setup
	$(PYTEST) tests/e2e

# Chaos: kill -9 of every service mid-batch, then RabbitMQ and Postgres restarted for real
# (this disrupts every other user of those servers). RELAY_CHAOS_SERVERS=sever drops only
# this run's own connections instead. Reports: test-output/chaos/*.json.
chaos: setup
	RELAY_CHAOS_SERVERS=$${RELAY_CHAOS_SERVERS:-restart} $(PYTEST) tests/chaos

lint: setup
	$(BIN)/ruff check libs services tests
	$(BIN)/ruff format --check libs services tests

format: setup
	$(BIN)/ruff format libs services tests
	$(BIN)/ruff check --fix libs services tests


clean:
	rm -rf $(VENV) build *.egg-info test-output bench-report.json
