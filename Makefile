# Relay Batches — every task is a make target. `make run` and `make test` set up first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST := $(BIN)/pytest -p no:cacheprovider

.PHONY: setup run test unit integration e2e fuzz lint format migrate clean

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
	$(PYTEST) tests/unit tests/integration tests/e2e

unit: setup
	$(PYTEST) tests/unit

integration: setup
	$(PYTEST) tests/integration

e2e: setup
	$(PYTEST) tests/e2e

# Schemathesis against a live ingest-api, far longer than the bounded run in `make test`,
# with a random seed (RELAY_FUZZ_SEED=n to replay one). Report in test-output/openapi/.
FUZZ_EXAMPLES ?= 400
fuzz: setup
	RELAY_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) RELAY_FUZZ_SEED=$(RELAY_FUZZ_SEED) RELAY_FUZZ_TIMEOUT_S=3300 \
		$(PYTEST) -rP --timeout=3600 tests/integration/test_openapi_fuzz.py

lint: setup
	$(BIN)/ruff check libs services tests
	$(BIN)/ruff format --check libs services tests

format: setup
	$(BIN)/ruff format libs services tests
	$(BIN)/ruff check --fix libs services tests


clean:
	rm -rf $(VENV) build *.egg-info test-output bench-report.json
