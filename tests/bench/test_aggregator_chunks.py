"""Benchmark of the aggregator at a high outcome rate: rows per transaction, and one
aggregator per job.

Outcomes of several jobs are queued on the results shards as row-workers pack them
(64 a message, each message of one shard's jobs), then two real aggregator processes
start, each consuming half of the shards (``RELAY_AGGREGATOR_SHARDS``), at debug level so
each logs every recording transaction (``outcomes_recorded``: rows, jobs). Reported:
rows per transaction (median, mean), transactions/s, rows/s, aggregator CPU per row,
the machine's busy share, and how many jobs were recorded by more than one aggregator
(0: each job's counter row had one writer). Size: ``RELAY_BENCH_CHUNK_ROWS`` rows per job
(default 20,000) over ``RELAY_BENCH_CHUNK_JOBS`` jobs (default 8).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import Names
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
SPLIT = ("0,1", "2,3")  # the shards of each of the two aggregators (RELAY_RESULTS_SHARDS 4)


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


def _transactions(log: Path) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text().splitlines():
        if '"outcomes_recorded"' in line:
            found.append(orjson.loads(line))
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
            "RELAY_LOG_LEVEL": "DEBUG",
        }
        ticks, started = machine_ticks(), time.perf_counter()
        for n, shards in enumerate(SPLIT):
            env = {**base, "RELAY_AGGREGATOR_SHARDS": shards}
            aggregators.append(ServiceProcess("aggregator", env, tmp_path / f"agg-{n}.log"))
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
    finally:
        for aggregator in aggregators:
            aggregator.stop()
        await bus.close()
        await pool.close()
        await drop_isolation(iso)
    per_aggregator = [_transactions(tmp_path / f"agg-{n}.log") for n in range(len(SPLIT))]
    rows = [t["rows"] for found in per_aggregator for t in found]
    writers: dict[str, set[int]] = {}
    for n, found in enumerate(per_aggregator):
        for t in found:
            for job in t["jobs"]:
                writers.setdefault(job, set()).add(n)
    figures = {
        "aggregator_rows_per_transaction_median": statistics.median(rows),
        "aggregator_rows_per_transaction_mean": round(statistics.mean(rows), 1),
        "aggregator_transactions_per_s": round(len(rows) / elapsed, 1),
        "aggregator_rows_per_s": round(ROWS * JOBS / elapsed),
        "aggregator_cpu_us_per_row": round(cpu / (ROWS * JOBS) * 1e6, 1),
        "aggregator_machine_busy_share": round(busy, 3),
        "aggregator_jobs_with_two_writers": sum(len(w) > 1 for w in writers.values()),
    }
    report.update(figures)
    print(f"aggregators at a high rate, {JOBS} jobs x {ROWS} rows: {figures}")
    assert sum(rows) >= ROWS * JOBS
    assert figures["aggregator_jobs_with_two_writers"] == 0
