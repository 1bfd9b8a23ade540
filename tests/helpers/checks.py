"""What "nothing lost, nothing counted twice" means, checked against the API and ledger.

Shared by the e2e recovery tests and the chaos tests: after whatever was done to the
system, a batch must be ``completed``, ``completed + failed == total``, every custom_id
exactly once in its results (in submission order), the counters equal to the result
rows in the ledger, and exactly one webhook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg

from tests.helpers.processes import ServiceProcess, System
from tests.helpers.support import ApiClient, WebhookReceiver, wait_until

SERVICE_READY_TIMEOUT_S = 60


@dataclass(frozen=True)
class Verdict:
    """The facts a recovery check established (for the report line of a chaos run)."""

    status: str
    total: int
    completed: int
    failed: int
    result_rows: int
    webhooks: int


async def ledger_counts(database_url: str, batch_id: str) -> tuple[int, int, int, int]:
    """(completed, failed) counters and (content, error) result rows of a batch."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        row = await conn.fetchrow(
            "SELECT b.completed, b.failed,"
            " (SELECT count(*) FROM row_results o WHERE o.batch_id = b.id AND o.error IS NULL),"
            " (SELECT count(*) FROM row_results o WHERE o.batch_id = b.id"
            "  AND o.error IS NOT NULL)"
            " FROM batches b WHERE b.id = $1",
            batch_id,
        )
    finally:
        await conn.close()
    assert row is not None, f"batch {batch_id} is not in the ledger"
    return row[0], row[1], row[2], row[3]


async def assert_exactly_once(
    api: ApiClient,
    database_url: str,
    batch_id: str,
    custom_ids: list[str],
    webhooks: WebhookReceiver | None = None,
    contents: list[str] | None = None,
) -> Verdict:
    """Every check of the module doc on a terminal batch (and, given ``contents``, that
    every row succeeded with that content, in order); returns what was found."""
    batch = await api.get(batch_id)
    assert batch["status"] == "completed", batch
    assert batch["completed"] + batch["failed"] == batch["total"] == len(custom_ids), batch
    data = (await api.results(batch_id))["data"]
    seen = [row["custom_id"] for row in data]
    assert len(seen) == len(set(seen)), "a custom_id appears more than once in the results"
    assert seen == custom_ids, "results are missing rows or out of submission order"
    if contents is not None:
        assert [row.get("content") for row in data] == contents, "results differ from inputs"
    completed, failed, content_rows, error_rows = await ledger_counts(database_url, batch_id)
    assert (completed, failed) == (batch["completed"], batch["failed"])
    assert (content_rows, error_rows) == (completed, failed), "counters differ from result rows"
    hooks = 0
    if webhooks is not None:
        await wait_until(_has_hook(webhooks, batch_id), 60, f"the webhook of {batch_id}")
        bodies = webhooks.for_batch(batch_id)
        hooks = len(bodies)
        assert hooks == 1, f"{hooks} webhooks for {batch_id}"
        assert (bodies[0]["status"], bodies[0]["completed"], bodies[0]["failed"]) == (
            "completed",
            completed,
            failed,
        )
    return Verdict(batch["status"], batch["total"], completed, failed, len(data), hooks)


def _has_hook(webhooks: WebhookReceiver, batch_id: str) -> Any:
    async def check() -> bool:
        return bool(webhooks.for_batch(batch_id))

    return check


async def wait_terminal(api: ApiClient, batch_id: str, timeout: float) -> dict[str, Any]:
    """Poll the batch until it is terminal, riding out an ingest-api that is down."""

    async def terminal() -> dict[str, Any] | None:
        try:
            batch = await api.get(batch_id)
        except (aiohttp.ClientError, AssertionError, TimeoutError):
            return None
        return batch if batch["status"] in {"completed", "failed", "canceled"} else None

    return await wait_until(terminal, timeout, f"batch {batch_id} to finish", 0.25)


async def readyz(proc: ServiceProcess, http: aiohttp.ClientSession) -> int | None:
    """The current ``/readyz`` status of a process, or None if it does not answer."""
    port = proc.health_port()
    if port is None or not proc.alive():
        return None
    try:
        async with http.get(
            f"http://127.0.0.1:{port}/readyz", timeout=aiohttp.ClientTimeout(2)
        ) as response:
            return response.status
    except (aiohttp.ClientError, TimeoutError):
        return None


def services_of(system: System) -> list[ServiceProcess]:
    """Every service process of the system (not the upstream simulator)."""
    return [p for p in system.processes.values() if p.name != "upstream-sim"]


async def wait_all_ready(
    procs: list[ServiceProcess], http: aiohttp.ClientSession, timeout: float = 60
) -> None:
    """Wait until every process in ``procs`` answers ``/readyz`` with 200."""
    for proc in procs:
        await proc.wait_ready(http, timeout)


async def wait_all_not_ready(
    procs: list[ServiceProcess], http: aiohttp.ClientSession, timeout: float = 30
) -> dict[str, int | None]:
    """Wait until every process in ``procs`` answers ``/readyz`` with 503; their statuses."""
    seen: dict[str, int | None] = {}

    async def all_down() -> bool:
        for proc in procs:
            seen[proc.name] = await readyz(proc, http)
        return all(code == 503 for code in seen.values())

    await wait_until(all_down, timeout, "every service to report not ready", 0.1)
    return seen
