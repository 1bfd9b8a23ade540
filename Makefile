# Relay Batches — every task is a make target. `make run` and `make test` set up first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST := $(BIN)/pytest -p no:cacheprovider

.PHONY: setup run test unit deploy integration e2e chaos fuzz lint typecheck format migrate clean bench browser \
	container-check lock config-docs docs monitoring-check prometheus ha-check

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
test: setup lint docs browser monitoring-check
	RELAY_CHAOS_SERVERS= $(PYTEST) tests/unit tests/deploy tests/integration tests/e2e tests/chaos/test_kills.py tests/chaos/test_two_workspaces.py tests/chaos/test_offload_kills.py

unit: setup
	$(PYTEST) tests/unit

# The deployment files (Dockerfile, compose, Kubernetes manifests, routes examples) and the
# built wheel in a fresh virtualenv; no servers needed.
deploy: setup
	$(PYTEST) tests/deploy

integration: setup
	$(PYTEST) tests/integration

e2e: setup browser prometheus
	$(PYTEST) tests/e2e

# Debian's Chromium for the panel's browser tests (Playwright drives it; it never
# downloads a browser). Installed only when missing; apt's output goes to a log.
APT_LOG := test-output/apt-chromium.log
browser:
	@test -x /usr/bin/chromium || { \
	  echo "installing Debian's chromium for the browser tests (log: $(APT_LOG))"; \
	  mkdir -p test-output; \
	  sudo=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  { $$sudo apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq chromium; } \
	    >$(APT_LOG) 2>&1 || { cat $(APT_LOG); exit 1; }; \
	}

# Debian's prometheus package: promtool for monitoring-check, and the prometheus server
# the e2e test scrapes a running system with (tests/e2e/test_prometheus.py; it starts its
# own on a free port; RUNLEVEL=1 keeps the package's own service from starting on 9090).
# Installed only when missing; apt's output goes to a log.
APT_PROMETHEUS_LOG := test-output/apt-prometheus.log
prometheus:
	@test -x /usr/bin/promtool -a -x /usr/bin/prometheus || { \
	  echo "installing Debian's prometheus for the monitoring checks (log: $(APT_PROMETHEUS_LOG))"; \
	  mkdir -p test-output; \
	  sudo=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  { $$sudo apt-get update -qq && \
	    RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends \
	      prometheus; } >$(APT_PROMETHEUS_LOG) 2>&1 || { cat $(APT_PROMETHEUS_LOG); exit 1; }; \
	}

# promtool's checks of deploy/monitoring: the rules file, its unit tests (each alert fires
# on a synthetic series, quiet on a healthy one), every dashboard expression, and the
# PrometheusRule of the monitoring component in step with the rules file (tests/monitoring).
monitoring-check: setup prometheus
	$(BIN)/python -m tests.monitoring.check

# Chaos: kill -9 of every service mid-batch, then RabbitMQ and Postgres restarted for real
# (this disrupts every other user of those servers). RELAY_CHAOS_SERVERS=sever drops only
# this run's own connections instead. Reports: test-output/chaos/*.json.
chaos: setup
	RELAY_CHAOS_SERVERS=$${RELAY_CHAOS_SERVERS:-restart} $(PYTEST) tests/chaos

# Relay on a three-node RabbitMQ cluster and a Postgres primary with a hot standby (its
# own servers on their own ports, removed afterwards): broker nodes killed and the
# database failed over mid-batch; report in test-output/ha/.
ha-check: setup
	$(BIN)/python -m tests.ha.check

# Schemathesis against a live ingest-api, far longer than the bounded run in `make test`,
# with a random seed (RELAY_FUZZ_SEED=n to replay one). Report in test-output/openapi/.
FUZZ_EXAMPLES ?= 400
fuzz: setup
	RELAY_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) RELAY_FUZZ_SEED=$(RELAY_FUZZ_SEED) RELAY_FUZZ_TIMEOUT_S=3300 \
		$(PYTEST) -rP --timeout=3600 tests/integration/test_openapi_fuzz.py

lint: setup typecheck
	$(BIN)/ruff check libs services tests
	$(BIN)/ruff format --check libs services tests

# mypy --strict over the whole relay_batches namespace. mypy cannot follow pyproject's
# package-dir map (services/ is relay_batches.services), so it reads a tree of links that
# lays the namespace out as it is installed.
TYPECHECK := build/typecheck
typecheck: setup
	@rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/relay_batches
	@ln -s $(CURDIR)/libs/relay_batches/* $(TYPECHECK)/relay_batches/
	@ln -s $(CURDIR)/services $(TYPECHECK)/relay_batches/services
	cd $(TYPECHECK) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p relay_batches

# The documentation site (mkdocs.yml, docs/) into build/site: --strict, so a broken link or
# a page missing from the nav fails it. The API reference pages are generated first, from
# the OpenAPI documents (docs/gen_api.py, a MkDocs hook).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

format: setup
	$(BIN)/ruff format libs services tests
	$(BIN)/ruff check --fix libs services tests


# The image, its services and the dev overlay run for real with podman (root): installs
# podman, runc and mmdebstrap with apt when missing, builds a local Debian base unless
# RELAY_BASE_IMAGE names one (e.g. docker.io/library/python:3.11-slim-bookworm), then every step of
# tests/container/check.py. Never part of `make test`; .ci/run runs it after.
container-check: setup
	$(BIN)/python -m tests.container.check

# The image's lock: every runtime dependency and the build backend, pinned with hashes,
# resolved from pyproject.toml against the public index only (no local config or wheels).
LOCK := deploy/docker/requirements.lock
lock: setup
	env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null \
	  $(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --all-build-deps \
	  --no-emit-index-url --no-emit-find-links --index-url https://pypi.org/simple \
	  --upgrade --output-file $(LOCK) pyproject.toml

# docs/operations/configuration.md, generated from the settings' declarations
# (libs/relay_batches/settings/); a unit test fails while the committed page differs.
config-docs: setup
	$(BIN)/python -m relay_batches.settings.docs

# Benchmarks (tests/bench): never part of `make test`; writes bench-report.json.
bench: setup
	$(PYTEST) tests/bench -s -o timeout=3600

clean:
	rm -rf $(VENV) build *.egg-info test-output bench-report.json
