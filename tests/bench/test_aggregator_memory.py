"""Benchmark of the aggregator's memory under a backlog of large outcomes.

A backlog of outcome messages is queued on the results shards before a real aggregator process
starts (at its default prefetch of 256); its peak RSS (``VmHWM``) is read once every row
is recorded. The same outcomes are packed as the row-worker packs them, once with the
old 4 MiB message cap and once with the new default ``RELAY_RESULTS_MESSAGE_BYTES``
(256 KiB): the prefetch counts messages, so the cap is what bounds the bytes it holds.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import Names
from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.pool import create_pool
from relay_batches.messages import RowOutcome
from relay_batches.services.row_worker.outcomes import MAX_MESSAGE_BYTES, OutcomePublisher
from tests.bench.harness import MIB, rss_mib
from tests.helpers.processes import ServiceProcess
from tests.helpers.support import AMQP_URL, create_isolation, drop_isolation, wait_until

ROWS = 2048
CONTENT_BYTES = 128 * 1024  # 256 MiB of replies in all
OLD_CAP = 4 * MIB


async def _running_job(pool: asyncpg.Pool) -> str:
    workspace = await KeyStore(pool).ensure_workspace(f"aggmem-{new_id()[:6]}")
    batch = await JobStore(pool).create(
        NewJob(new_id(), workspace, "aggmem", "gpt-4o-mini", 0, ROWS, None, None, None),
        ((f"c-{i}", '[{"role":"user","content":"x"}]') for i in range(ROWS)),
    )
    await DispatchStore(pool).claim_queued("bench-owner", 1000, 3600)
    return batch.id


async def _peak_with_cap(http: aiohttp.ClientSession, log_dir: Path, cap: int) -> float:
    iso = await create_isolation("aggmem")
    pool = await create_pool(iso.database_url, max_size=4)
    bus = Bus(AMQP_URL, Names(iso.namespace), "bench-worker")
    await bus.connect()
    try:
        batch_id = await _running_job(pool)
        publisher = OutcomePublisher(
            lambda shard, body: bus.publish(bus.names.results_shard(shard), body, kind="results"),
            max_rows=64,
            flush_s=3600,
            max_bytes=cap,
            shards=bus.names.shards,
        )
        content = "r" * CONTENT_BYTES
        adding = [
            asyncio.create_task(publisher.add(RowOutcome(batch_id, i, content, None, 1)))
            for i in range(ROWS)
        ]
        await asyncio.sleep(0)
        await publisher.drain()
        await asyncio.gather(*adding)
        env = {
            **os.environ,
            "RELAY_DATABASE_URL": iso.database_url,
            "RELAY_NAMESPACE": iso.namespace,
            "RELAY_HEALTH_PORT": "0",
        }
        aggregator = ServiceProcess("aggregator", env, log_dir / f"aggregator-{cap}.log")
        aggregator.start()
        try:

            async def recorded() -> bool:
                done = await pool.fetchval("SELECT completed FROM batches WHERE id = $1", batch_id)
                return bool(done == ROWS)

            await wait_until(recorded, 600, "every outcome to be recorded", every=0.5)
            return round(rss_mib(aggregator.pid, "VmHWM"), 1)
        finally:
            aggregator.stop()
    finally:
        await bus.close()
        await pool.close()
        await drop_isolation(iso)


async def test_aggregator_peak_rss_with_a_backlog_of_large_outcomes(
    http: aiohttp.ClientSession, report: dict[str, Any], tmp_path: Path
) -> None:
    before = await _peak_with_cap(http, tmp_path, OLD_CAP)
    after = await _peak_with_cap(http, tmp_path, MAX_MESSAGE_BYTES)
    report["aggregator_peak_rss_mib_256mib_backlog_4mib_messages"] = before
    report["aggregator_peak_rss_mib_256mib_backlog"] = after
    print(
        f"aggregator peak RSS, 256 MiB backlog: 4 MiB messages {before} MiB, "
        f"{MAX_MESSAGE_BYTES // 1024} KiB messages {after} MiB"
    )
    assert after < before
