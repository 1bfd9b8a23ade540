"""The three faults of ``make ha-check`` and how long the system took to recover from each.

A fault strikes once the jobs moved on (the chaos driver's progress gate). Recovery is
timed from the moment it struck: ``ready_s`` until the last moment a service was seen
not ready (``/readyz``, polled every :data:`POLL_S`; 0 if none was), ``resumed_s`` until
:data:`RESUMED_ROWS` more rows have an outcome in the ledger (outcomes flowing again end
to end), and for a broker node ``back_s`` until the killed node, started again as a
supervisor would, runs in the cluster with its mirrors in sync.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiohttp
import asyncpg

from tests.chaos.driver import rows_done, wait_for_progress
from tests.ha.brokers import Node, RabbitCluster
from tests.ha.databases import PgPair
from tests.helpers.checks import readyz, services_of
from tests.helpers.processes import System
from tests.helpers.support import wait_until

RESUMED_ROWS = 128
POLL_S = 0.2
SETTLE_S = 3.0  # every service ready this long: recovered
RECOVERY_TIMEOUT_S = 240
NODE_BACK_TIMEOUT_S = 240


@dataclass
class FaultRecord:
    """One fault as it happened and the recovery times (seconds from ``at``)."""

    fault: str
    target: str
    rows_done: int
    at: float
    ready_s: float = 0.0
    resumed_s: float = 0.0
    back_s: float | None = None


async def _done_now(url: str, batch_ids: Sequence[str]) -> int | None:
    try:
        return (await rows_done(url, batch_ids))[1]
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
        return None  # the database is failing over


async def _all_ready(system: System, http: aiohttp.ClientSession) -> bool:
    statuses = await asyncio.gather(*(readyz(p, http) for p in services_of(system)))
    return all(status == 200 for status in statuses)


async def recover(
    record: FaultRecord, system: System, http: aiohttp.ClientSession, batch_ids: Sequence[str]
) -> None:
    """Poll until outcomes flow again and every service is ready (for at least
    :data:`SETTLE_S`); note when the last service not ready was seen and when outcomes
    resumed."""
    started = time.monotonic()
    last_not_ready = started
    resumed_at: float | None = None
    target = record.rows_done + RESUMED_ROWS
    url = system.iso.database_url
    while True:
        now = time.monotonic()
        if now - started > RECOVERY_TIMEOUT_S:
            raise AssertionError(f"no recovery from {record.fault} in {RECOVERY_TIMEOUT_S} s")
        if not await _all_ready(system, http):
            last_not_ready = time.monotonic()
        if resumed_at is None and ((await _done_now(url, batch_ids)) or 0) >= target:
            resumed_at = time.monotonic()
        if resumed_at is not None and time.monotonic() - last_not_ready >= SETTLE_S:
            break
        await asyncio.sleep(POLL_S)
    record.ready_s = round(last_not_ready - started, 2)
    record.resumed_s = round(resumed_at - started, 2)


async def strike(
    fault: str,
    target: str,
    action: Callable[[], Awaitable[None]],
    system: System,
    http: aiohttp.ClientSession,
    batch_ids: Sequence[str],
    after_rows: int,
) -> FaultRecord:
    """Wait until ``after_rows`` rows are done, run ``action`` (the fault), time the
    recovery."""
    done = await wait_for_progress(system.iso.database_url, batch_ids, after_rows, fault)
    record = FaultRecord(fault, target, done, time.time())
    await action()
    await recover(record, system, http, batch_ids)
    return record


async def node_back(
    record: FaultRecord, cluster: RabbitCluster, node: Node, queues: Sequence[str]
) -> None:
    """Start the killed node again and wait until the mirrors of ``queues`` are in sync."""
    await asyncio.to_thread(cluster.restart, node)

    async def synced() -> bool:
        states = [await asyncio.to_thread(cluster.synced, queue) for queue in queues]
        return all(states)

    await wait_until(synced, NODE_BACK_TIMEOUT_S, f"{node.name}'s mirrors in sync", 1.0)
    record.back_s = round(time.time() - record.at, 2)


def kill_node(cluster: RabbitCluster, node: Node) -> Callable[[], Awaitable[None]]:
    """The fault: ``kill -9`` of one broker node."""

    async def action() -> None:
        await asyncio.to_thread(cluster.kill, node)

    return action


def fail_over(pair: PgPair) -> Callable[[], Awaitable[None]]:
    """The fault: the primary stopped (immediately), then the standby promoted."""

    async def action() -> None:
        await asyncio.to_thread(pair.stop_primary)
        await asyncio.to_thread(pair.promote_standby)

    return action
