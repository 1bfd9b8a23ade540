"""Stall recovery end to end, on a system of its own: lost rows are re-sent per job
whatever the queue depth, slow rows are never paid for twice, and the rows of a worker
killed with ``kill -9`` finish exactly once.

Two row-workers of 4 slots, slices of 4 rows, a window of 64 rows per workspace, a stall
timeout of 3 s and heartbeats every 0.5 s (a worker's report is valid for 1.5 s).
"""

from __future__ import annotations

import asyncio
import signal
import time

import aio_pika
import aiohttp
import asyncpg
import pytest

from relay_batches.bus.topology import Names
from relay_batches.messages import SliceMessage
from relay_batches.services.relay_cli import admin
from tests.helpers.checks import assert_exactly_once, wait_terminal
from tests.helpers.processes import ServiceProcess, System, signed_in, sim_calls, system_fixture
from tests.helpers.support import (
    AMQP_URL,
    ApiClient,
    rows,
    rows_queue_depth,
    wait_until,
)

STALL_S = 3.0
GRACE_S = 10  # RELAY_SHUTDOWN_GRACE_S of build_system


# Every service as its own process, two row-workers.
ssystem = system_fixture(
    "stall",
    fresh_logs=True,
    workers=2,
    RELAY_BATCH_CONCURRENCY="4",
    RELAY_SLICE_ROWS="4",
    RELAY_DISPATCH_WINDOW="64",
    RELAY_STALL_SECONDS=str(STALL_S),
    RELAY_HEARTBEAT_SECONDS="0.5",
)


@pytest.fixture(scope="module")
async def sapi(ssystem: System, http: aiohttp.ClientSession) -> ApiClient:
    """A client of this module's API."""
    return await signed_in(ssystem, http, "stall")


async def submit(api: ApiClient, n: int, delay_ms: int) -> str:
    """A batch of ``n`` rows that each take ``delay_ms`` upstream."""
    body = {"model": "gpt-4o-mini", "requests": rows(n, f"row {{i}} [sim:delay-ms={delay_ms}]")}
    return str((await api.submit(body))["id"])


def custom_ids(n: int) -> list[str]:
    """The custom ids :func:`tests.helpers.support.rows` gives ``n`` rows."""
    return [f"r-{i}" for i in range(n)]


async def wait_dispatched(database_url: str, batch_id: str, upto: int) -> None:
    """Wait until the dispatcher recorded rows below ``upto`` of a job as published."""
    conn = await asyncpg.connect(database_url)
    try:

        async def published() -> bool:
            value = await conn.fetchval(
                "SELECT dispatched_upto FROM batches WHERE id = $1", batch_id
            )
            return value is not None and value >= upto

        await wait_until(published, 60, f"{upto} rows of {batch_id} to be published", 0.02)
    finally:
        await conn.close()


async def drop_ready_rows(namespace: str) -> dict[str, int]:
    """The fault: take every ready task message out of the rows queue and drop it (the
    broker lost them); return the dropped rows per job."""
    dropped: dict[str, int] = {}
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(Names(namespace).rows, passive=True)
        while (message := await queue.get(fail=False, timeout=5)) is not None:
            task = SliceMessage.decode(message.body)
            dropped[task.batch_id] = dropped.get(task.batch_id, 0) + len(task.rows)
            await message.ack()
    return dropped


def logged(system: System, action: str, batch_id: str) -> bool:
    """Whether the dispatcher logged ``action`` for ``batch_id``."""
    return any(
        f'"action":"{action}"' in line and batch_id in line
        for line in system.processes["dispatcher"].log_path.read_text().splitlines()
    )


async def test_lost_rows_of_one_job_are_resent_under_steady_load_from_others(
    ssystem: System, sapi: ApiClient, http: aiohttp.ClientSession
) -> None:
    """Job L keeps rows waiting in the queue; job X's rows are dropped from the broker
    while they wait behind L's; job M arrives and keeps the queue busy. X is recovered a
    stall timeout later (the old dispatcher skipped recovery while any row was waiting,
    so X waited for the whole queue to drain: all of L and M). X belongs to another
    workspace: one workspace's jobs share one window, which the two workers' prefetch
    would hold entirely, so only another workspace's rows wait behind L's."""
    load = await submit(sapi, 500, delay_ms=250)
    await wait_dispatched(ssystem.iso.database_url, load, 32)
    other = await admin.create_key(ssystem.iso.database_url, "stall-other")
    xapi = ApiClient(ssystem.api_url, other.key, http)
    lost = await submit(xapi, 20, delay_ms=10)
    await wait_dispatched(ssystem.iso.database_url, lost, 20)
    dropped = await drop_ready_rows(ssystem.iso.namespace)
    started = time.monotonic()
    assert dropped.get(lost, 0) > 0, f"X's rows should have been waiting behind L's: {dropped}"
    more = await submit(sapi, 300, delay_ms=250)

    await wait_terminal(xapi, lost, 60)
    recovered_s = time.monotonic() - started
    waiting = await rows_queue_depth(ssystem.iso.namespace)
    assert (await sapi.get(more))["status"] == "running"
    assert waiting > 0, "the queue should still hold rows of the other jobs"
    assert recovered_s < 4 * STALL_S, f"X took {recovered_s:.1f} s to recover"
    await assert_exactly_once(xapi, ssystem.iso.database_url, lost, custom_ids(20))
    assert logged(ssystem, "job_stalled", lost)

    for batch_id, n in ((load, 500), (more, 300)):
        await wait_terminal(sapi, batch_id, 180)
        await assert_exactly_once(sapi, ssystem.iso.database_url, batch_id, custom_ids(n))


async def test_rows_slower_than_the_stall_timeout_are_called_once_each(
    ssystem: System, sapi: ApiClient, http: aiohttp.ClientSession
) -> None:
    """4 rows that each take 8 s (the stall timeout is 3 s): held by a live worker all
    along, so they are never re-sent; the old dispatcher re-published them every stall
    period (4 slow rows cost 16 upstream calls)."""
    before = await sim_calls(http, ssystem)
    batch_id = await submit(sapi, 4, delay_ms=8000)
    await wait_terminal(sapi, batch_id, 60)
    await assert_exactly_once(sapi, ssystem.iso.database_url, batch_id, custom_ids(4))
    assert await sim_calls(http, ssystem) - before == 4
    assert logged(ssystem, "job_waiting", batch_id), "stalled, and its rows were found held"
    assert not logged(ssystem, "job_stalled", batch_id)


async def test_rows_of_a_worker_killed_while_holding_them_finish_exactly_once(
    ssystem: System, sapi: ApiClient, http: aiohttp.ClientSession
) -> None:
    """One worker holds the 4 slow rows of a job (one slice, all four in flight) and is
    killed with ``kill -9``; the other worker gets them again (the broker returns the
    unacked slice), the dead worker's heartbeat expires, the job completes with every
    row once, and nothing is re-sent on top: 4 calls by the killed worker and 4 by the
    survivor, however many stall periods the rows take."""
    first, second = ssystem.processes["row-worker"], ssystem.processes["row-worker#2"]
    try:
        await _kill_a_holding_worker(ssystem, sapi, http, first, second)
    finally:
        if not first.alive():
            first.start()
            await first.wait_ready(http)


async def _kill_a_holding_worker(
    ssystem: System,
    sapi: ApiClient,
    http: aiohttp.ClientSession,
    first: ServiceProcess,
    second: ServiceProcess,
) -> None:
    second.signal(signal.SIGTERM)
    assert await asyncio.to_thread(second.wait, GRACE_S + 5) == 0
    before = await sim_calls(http, ssystem)
    batch_id = await submit(sapi, 4, delay_ms=5000)

    async def all_taken() -> bool:
        return await sim_calls(http, ssystem) - before >= 4

    await wait_until(all_taken, 30, "the first worker to call all 4 rows")
    second.start()
    await second.wait_ready(http)
    first.signal(signal.SIGKILL)
    assert await asyncio.to_thread(first.wait, 10) == -signal.SIGKILL

    await wait_terminal(sapi, batch_id, 60)
    await assert_exactly_once(sapi, ssystem.iso.database_url, batch_id, custom_ids(4))
    assert await sim_calls(http, ssystem) - before == 8
    assert logged(ssystem, "job_waiting", batch_id), "stalled, and its rows were found held"


async def test_rows_recorded_while_the_aggregator_is_down_are_not_run_again(
    ssystem: System, sapi: ApiClient, http: aiohttp.ClientSession
) -> None:
    """The aggregator stops; a job's 20 rows are all called and their outcomes confirmed
    on ``results`` (no worker holds them, the ledger has none of them, the rows queue is
    empty), and stay unrecorded for more than twice the stall timeout. The old
    dispatcher took them for lost and ran every one again; now recovery waits for the
    aggregator, which records each row once when it is back."""
    aggregator = ssystem.processes["aggregator"]
    assert await asyncio.to_thread(aggregator.stop) == 0
    try:
        before = await sim_calls(http, ssystem)
        batch_id = await submit(sapi, 20, delay_ms=10)

        async def all_called() -> bool:
            return await sim_calls(http, ssystem) - before >= 20

        await wait_until(all_called, 60, "the workers to call all 20 rows")
        conn = await asyncpg.connect(ssystem.iso.database_url)
        try:

            async def stalled_long_or_resent() -> bool:
                idle = await conn.fetchval(
                    "SELECT extract(epoch FROM now() - last_progress_at) FROM batches"
                    " WHERE id = $1",
                    batch_id,
                )
                return float(idle) > 2 * STALL_S or logged(ssystem, "job_stalled", batch_id)

            await wait_until(stalled_long_or_resent, 60, "two stall timeouts without progress")
        finally:
            await conn.close()
    finally:
        aggregator.start()
        await aggregator.wait_ready(http)

    await wait_terminal(sapi, batch_id, 60)
    await assert_exactly_once(sapi, ssystem.iso.database_url, batch_id, custom_ids(20))
    assert await sim_calls(http, ssystem) - before == 20, "no row was run twice"
    assert not logged(ssystem, "job_stalled", batch_id)
    dispatcher_log = ssystem.processes["dispatcher"].log_path.read_text()
    assert '"action":"stall_recovery_deferred"' in dispatcher_log
