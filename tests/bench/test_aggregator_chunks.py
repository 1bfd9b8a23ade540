"""Benchmark of the aggregator at a high outcome rate: rows per transaction, and one
aggregator per job.

Outcomes of several jobs are queued on the results shards as row-workers pack them
(64 a message, each message of one shard's jobs), then two real aggregator processes
start, one after the other, both consuming every shard (the default), at info level.
Each shard's single active consumer decides who records it: each aggregator's
``/metrics`` says how many rows it recorded (``relay_rows_recorded_total``) and in how
many transactions (``relay_aggregator_transaction_rows``). Reported: rows per
transaction (mean), transactions/s, rows/s, aggregator CPU per row, the machine's busy
share, and the rows each aggregator recorded; checked: every row was recorded exactly
once, and every job by one aggregator only (each aggregator's rows are those of the
jobs of some of the shards; which ones depends on who subscribed to each shard first).
Size: ``RELAY_BENCH_CHUNK_ROWS`` rows per job (default 20,000) over
``RELAY_BENCH_CHUNK_JOBS`` jobs (default 8).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import Names, results_shard
from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.pool import create_pool
from relay_batches.messages import RowOutcome
from relay_batches.services.row_worker.outcomes import OutcomePublisher
from tests.bench.harness import busy_share, machine_ticks, process_cpu_s
from tests.helpers.processes import ServiceProcess
from tests.helpers.support import AMQP_URL, create_isolation, drop_isolation, wait_until

ROWS = int(os.environ.get("RELAY_BENCH_CHUNK_ROWS", "20000"))
JOBS = int(os.environ.get("RELAY_BENCH_CHUNK_JOBS", "8"))
AGGREGATORS = 2


async def _running_jobs(pool: asyncpg.Pool) -> list[str]:
    workspace = await KeyStore(pool).ensure_workspace(f"aggchunk-{new_id()[:6]}")
    ids = []
    for _ in range(JOBS):
        batch = await JobStore(pool).create(
            NewJob(new_id(), workspace, "aggchunk", "gpt-4o-mini", 0, ROWS, None, None, None),
            ((f"c-{i}", '[{"role":"user","content":"x"}]') for i in range(ROWS)),
        )
        ids.append(batch.id)
    await DispatchStore(pool).claim_queued("bench-owner", 1000, 3600)
    return ids


async def _queue_outcomes(bus: Bus, jobs: list[str]) -> None:
    publisher = OutcomePublisher(
        lambda shard, body: bus.publish(bus.names.results_shard(shard), body, kind="results"),
        max_rows=64,
        flush_s=3600,
        shards=bus.names.shards,
    )
    step = 4096
    for start in range(0, ROWS, step):
        adding = [
            asyncio.create_task(publisher.add(RowOutcome(job, i, "ok", None, 1)))
            for i in range(start, min(ROWS, start + step))
            for job in jobs
        ]
        await asyncio.sleep(0)
        await publisher.drain()
        await asyncio.gather(*adding)


async def _scrape(session: aiohttp.ClientSession, aggregator: ServiceProcess) -> dict[str, float]:
    """The aggregator's recorded rows and recording transactions (rows, count)."""
    port = aggregator.health_port()
    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    found = {"recorded": 0.0, "rows": 0.0, "transactions": 0.0}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("relay_rows_recorded_total{"):
            found["recorded"] += float(value)
        elif name == "relay_aggregator_transaction_rows_sum":
            found["rows"] = float(value)
        elif name == "relay_aggregator_transaction_rows_count":
            found["transactions"] = float(value)
    return found


async def test_aggregator_rows_per_transaction_at_a_high_rate(
    report: dict[str, Any], tmp_path: Path
) -> None:
    iso = await create_isolation("aggchunk")
    pool = await create_pool(iso.database_url, max_size=4)
    bus = Bus(AMQP_URL, Names(iso.namespace), "bench-worker")
    await bus.connect()
    aggregators: list[ServiceProcess] = []
    try:
        jobs = await _running_jobs(pool)
        await _queue_outcomes(bus, jobs)
        base = {
            **os.environ,
            "RELAY_DATABASE_URL": iso.database_url,
            "RELAY_NAMESPACE": iso.namespace,
            "RELAY_HEALTH_PORT": "0",
            "RELAY_LOG_LEVEL": "INFO",
        }
        ticks, started = machine_ticks(), time.perf_counter()
        for n in range(AGGREGATORS):
            aggregators.append(ServiceProcess("aggregator", base, tmp_path / f"agg-{n}.log"))
            aggregators[-1].start()

        async def recorded() -> bool:
            done = await pool.fetchval(
                "SELECT sum(completed) FROM batches WHERE id = ANY($1::text[])", jobs
            )
            return bool(done == ROWS * JOBS)

        await wait_until(recorded, 1800, "every outcome to be recorded", every=0.2)
        elapsed = time.perf_counter() - started
        busy = busy_share(ticks, machine_ticks())
        cpu = sum(process_cpu_s(a.pid) for a in aggregators)
        async with aiohttp.ClientSession() as session:
            for aggregator in aggregators:
                await aggregator.wait_ready(session)
            each = [await _scrape(session, a) for a in aggregators]
    finally:
        for aggregator in aggregators:
            aggregator.stop()
        await bus.close()
        await pool.close()
        await drop_isolation(iso)
    rows = sum(e["rows"] for e in each)
    transactions = sum(e["transactions"] for e in each)
    recorded = [round(e["recorded"]) for e in each]
    figures = {
        "aggregator_rows_per_transaction_mean": round(rows / transactions, 1),
        "aggregator_transactions_per_s": round(transactions / elapsed, 1),
        "aggregator_rows_per_s": round(ROWS * JOBS / elapsed),
        "aggregator_cpu_us_per_row": round(cpu / (ROWS * JOBS) * 1e6, 1),
        "aggregator_machine_busy_share": round(busy, 3),
        "aggregator_rows_recorded_by_each": recorded,
    }
    report.update(figures)
    print(f"aggregators at a high rate, {JOBS} jobs x {ROWS} rows: {figures}")
    assert sum(recorded) == ROWS * JOBS  # every row once
    # Each shard had one active aggregator (which one depends on who subscribed first), so
    # each aggregator recorded the whole rows of the jobs of some shards: its count is the
    # rows of some assignment of the shards to aggregators, which a job split between
    # them would break.
    assert recorded in _shard_splits(jobs, Names(iso.namespace).shards), recorded


def _shard_splits(jobs: list[str], shards: int) -> list[list[int]]:
    """Rows each aggregator records, for every assignment of the shards to aggregators."""
    per_shard = [
        ROWS * sum(1 for j in jobs if results_shard(j, shards) == s) for s in range(shards)
    ]
    splits = []
    for owners in itertools.product(range(AGGREGATORS), repeat=shards):
        pairs = list(zip(per_shard, owners, strict=True))
        splits.append([sum(r for r, o in pairs if o == a) for a in range(AGGREGATORS)])
    return splits
