"""A real Prometheus scrapes a running system (every service its own process) with the
rules of ``deploy/monitoring`` loaded (each ``for:`` shortened in a copy): every target
is up, the key series are there and move while a batch runs, every dashboard expression
evaluates, and RelayDeploymentFailing fires for a deployment that fails every call, and
for that one only. The series each service serves are written to
``test-output/monitoring/series.json``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.processes import SERVICES, System, signed_in, system_fixture
from tests.helpers.prometheus import Prometheus, running_prometheus
from tests.helpers.support import ApiClient, rows, wait_until
from tests.monitoring.files import dashboard_expressions

system = system_fixture("prometheus", RELAY_BACKLOG_SECONDS="0.5", max_retries=1)
SLOW_ROWS = 240
# Slow enough that its failing calls span several scrapes: a counter child born at its
# first increment shows no rate until a later scrape sees it grow.
FAILING_ROWS = 40
FAILING_DELAY_MS = 300
KEY_SERIES = (
    "relay_rows_processed_total",
    "relay_rows_recorded_total",
    "relay_upstream_calls_total",
    "relay_upstream_latency_seconds_bucket",
    "relay_messages_published_total",
    "relay_messages_consumed_total",
    "relay_job_transitions_total",
    "relay_http_request_duration_seconds_count",
    "relay_backlog_rows",
    "relay_backlog_jobs",
    "relay_backlog_oldest_queued_seconds",
)


@pytest.fixture(scope="module")
async def prometheus(
    system: System, http: aiohttp.ClientSession, output_dir: Path
) -> AsyncIterator[Prometheus]:
    """Prometheus on this module's system."""
    async with running_prometheus(system, http, output_dir / "e2e-prometheus") as running:
        yield running


@pytest.fixture(scope="module")
async def client(system: System, http: aiohttp.ClientSession) -> ApiClient:
    """A client of the module's system."""
    return await signed_in(system, http, "prometheus")


async def test_every_service_is_a_target_that_is_up(prometheus: Prometheus) -> None:
    async def all_up() -> dict[str, str] | None:
        targets = (await prometheus.api("targets"))["activeTargets"]
        health = {t["labels"]["service"]: t["health"] for t in targets}
        return health if set(health.values()) == {"up"} and len(health) == len(SERVICES) else None

    health = await wait_until(all_up, 30, "every target to be up", every=0.5)
    assert set(health) == set(SERVICES)


async def _total(prometheus: Prometheus, expr: str) -> float:
    return await prometheus.scalar(expr) or 0.0


async def test_the_key_series_are_there_and_move_while_a_batch_runs(
    prometheus: Prometheus, client: ApiClient, output_dir: Path
) -> None:
    requests = rows(SLOW_ROWS, "slow row {i} [sim:delay-ms=60]")
    created = await client.submit({"model": "gpt-4o-mini", "requests": requests})
    processed = 'sum(relay_rows_processed_total{service="row-worker"})'
    waiting = 'sum(relay_backlog_rows{service="dispatcher",status="running"})'

    async def running_backlog() -> float | None:
        value = await prometheus.scalar(waiting)
        return value if value else None

    first_backlog = await wait_until(running_backlog, 30, "a running job's backlog", every=0.5)
    first = await _total(prometheus, processed)

    async def moved() -> bool:
        backlog = await prometheus.scalar(waiting)
        return await _total(prometheus, processed) > first and backlog != first_backlog

    await wait_until(moved, 60, "rows answered and the backlog to move", every=0.5)
    batch = await client.wait_status(created["id"], {"completed"}, timeout=120)
    assert batch["completed"] == SLOW_ROWS

    async def all_present() -> list[str] | None:
        present = [s for s in KEY_SERIES if await prometheus.query(f"count({s})")]
        return present if len(present) == len(KEY_SERIES) else None

    await wait_until(all_present, 30, "every key series", every=0.5)

    async def all_answered() -> bool:
        return await _total(prometheus, processed) >= SLOW_ROWS

    await wait_until(all_answered, 30, "every row answered in the scrapes", every=0.5)
    finished = 'sum(relay_job_time_to_finish_seconds_count{service="aggregator"})'
    await wait_until(lambda: _total(prometheus, finished), 30, "a job's time to finish")
    await _write_series_counts(prometheus, output_dir)


async def _write_series_counts(prometheus: Prometheus, output_dir: Path) -> None:
    """The series each service serves, as Prometheus scraped them (issue 30's figure)."""
    counts = {
        r["metric"]["service"]: int(float(r["value"][1]))
        for r in await prometheus.query(
            'count by (service) ({service!="", __name__!~"scrape_.*|up"})'
        )
    }
    relay = {
        r["metric"]["service"]: int(float(r["value"][1]))
        for r in await prometheus.query('count by (service) ({__name__=~"relay_.*"})')
    }
    assert set(counts) == set(SERVICES)
    folder = output_dir / "monitoring"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "series.json").write_text(
        json.dumps({"all": counts, "relay": relay}, indent=1, sort_keys=True)
    )


async def test_every_dashboard_expression_evaluates(prometheus: Prometheus) -> None:
    answered = 0
    for where, expr in dashboard_expressions().items():
        data = await prometheus.api("query", query=expr)
        assert data["resultType"] == "vector", where
        answered += bool(data["result"])
    assert answered >= 15  # a running system gives most of them data


async def test_a_deployment_failing_every_call_fires_its_alert(
    prometheus: Prometheus, client: ApiClient
) -> None:
    failing = rows(
        FAILING_ROWS, f"failing row {{i}} [sim:status=500] [sim:delay-ms={FAILING_DELAY_MS}]"
    )
    created = await client.submit({"model": "sim-priced", "requests": failing})
    healthy = await client.submit({"model": "gpt-4o-mini", "requests": rows(20)})

    async def firing() -> list[dict[str, str]] | None:
        alerts = (await prometheus.api("alerts"))["alerts"]
        found = [
            a["labels"]
            for a in alerts
            if a["labels"]["alertname"] == "RelayDeploymentFailing" and a["state"] == "firing"
        ]
        return found or None

    fired = await wait_until(firing, 90, "RelayDeploymentFailing to fire", every=0.5)
    assert [labels["deployment"] for labels in fired] == ["sim-priced"]
    batch = await client.wait_status(created["id"], {"completed"}, timeout=120)
    assert batch["failed"] == FAILING_ROWS
    await client.wait_status(healthy["id"], {"completed"}, timeout=120)
    errors = 'sum(relay_upstream_calls_total{deployment="sim-priced",outcome="error"})'
    assert await _total(prometheus, errors) >= FAILING_ROWS
    answered = 'sum(relay_upstream_calls_total{deployment="sim-priced",outcome="ok"})'
    assert await _total(prometheus, answered) == 0
