"""The backlog gauges' reading on a ledger of its own: the rows waiting and released per
unfinished job status, from the jobs' counters and the rows handed back; the oldest
queued job's age; one reader at a time under the ``backlog`` lease; and a plan that
reads the unfinished jobs by their partial index however many ended jobs the ledger has."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from relay_batches.ids import new_id
from relay_batches.ledger.backlog import _COUNTERS, BacklogStore
from relay_batches.ledger.pool import create_pool
from relay_batches.metrics import BacklogGauges
from relay_batches.services.dispatcher.backlog import backlog_pass
from tests.helpers.support import create_isolation, drop_isolation

ENDED_JOBS = 20_000


@pytest.fixture
async def pool() -> AsyncIterator[asyncpg.Pool]:
    """A pool on a fresh ledger."""
    iso = await create_isolation("backlog")
    created = await create_pool(iso.database_url, max_size=3)
    try:
        yield created
    finally:
        await created.close()
        await drop_isolation(iso)


async def add_job(
    pool: asyncpg.Pool,
    status: str,
    total: int,
    *,
    released: int = 0,
    completed: int = 0,
    failed: int = 0,
    age_s: float = 0.0,
) -> str:
    """A job with these counters, created ``age_s`` ago (no rows stored: the backlog
    never reads them)."""
    job = new_id()
    await pool.execute(
        "INSERT INTO workspaces (id, name) VALUES ($1, $1) ON CONFLICT DO NOTHING", "a" * 32
    )
    await pool.execute(
        "INSERT INTO batches (id, workspace_id, name, model, status, total, rows_batch_id,"
        " dispatched_upto, completed, failed, created_at)"
        " VALUES ($1, $2, 'j', 'm', $3, $4, $1, $5, $6, $7, now() - make_interval(secs => $8))",
        job,
        "a" * 32,
        status,
        total,
        released,
        completed,
        failed,
        age_s,
    )
    return job


async def test_the_reading_counts_rows_waiting_and_released_per_status(
    pool: asyncpg.Pool,
) -> None:
    await add_job(pool, "queued", 100, age_s=60)
    await add_job(pool, "queued", 7, age_s=5)
    running = await add_job(pool, "running", 50, released=30, completed=10, failed=5)
    await add_job(pool, "paused", 20, released=20, completed=12)
    await add_job(pool, "completed", 40, released=40, completed=40)
    await add_job(pool, "scheduled", 9)  # a template: its runs are the jobs
    # Three rows handed back by a pause wait to go out again; one already went.
    await pool.execute(
        "INSERT INTO returned_rows (batch_id, row_index, pauses, taken)"
        " SELECT $1, i, 1, i = 3 FROM generate_series(0, 3) AS i",
        running,
    )
    reading = await BacklogStore(pool).read("dispatcher-a", 30)
    assert reading is not None
    assert reading.rows == {
        ("queued", "waiting"): 107,
        ("queued", "released"): 0,
        ("running", "waiting"): 20 + 3,
        ("running", "released"): 15 - 3,
        ("paused", "waiting"): 0,
        ("paused", "released"): 8,
    }
    assert reading.jobs == {"queued": 2, "running": 1, "paused": 1}
    assert 59 <= reading.oldest_queued_s <= 120


async def test_one_reader_at_a_time_and_a_lapsed_lease_passes_on(pool: asyncpg.Pool) -> None:
    store = BacklogStore(pool)
    await add_job(pool, "queued", 3)
    assert await store.read("a", 0.5) is not None
    assert await store.read("b", 0.5) is None
    assert await store.read("a", 0.5) is not None  # renewed by its holder
    await asyncio.sleep(0.7)
    assert await store.read("b", 30) is not None  # a's lapsed
    assert await store.read("a", 30) is None
    await store.give_back("b")
    assert await store.read("a", 30) is not None


async def test_only_the_lease_holder_serves_the_gauges(pool: asyncpg.Pool) -> None:
    await add_job(pool, "queued", 4, age_s=2)
    store = BacklogStore(pool)
    served: list[set[str]] = []
    for owner in ("a", "b"):
        gauges = BacklogGauges()
        registry = CollectorRegistry()
        registry.register(gauges)
        await backlog_pass(store, owner, 5.0, gauges).run()
        served.append({m.name for m in registry.collect()})
        if owner == "a":
            value = registry.get_sample_value(
                "relay_backlog_rows", {"status": "queued", "state": "waiting"}
            )
            assert value == 4
    assert served == [
        {"relay_backlog_rows", "relay_backlog_jobs", "relay_backlog_oldest_queued_seconds"},
        set(),
    ]


async def test_the_read_uses_the_unfinished_jobs_index_on_a_big_ledger(
    pool: asyncpg.Pool,
) -> None:
    await pool.execute(
        "INSERT INTO workspaces (id, name) VALUES ($1, $1) ON CONFLICT DO NOTHING", "e" * 32
    )
    await pool.execute(
        "INSERT INTO batches (id, workspace_id, name, model, status, total, rows_batch_id,"
        " dispatched_upto, completed)"
        " SELECT md5(i::text), $1, 'j', 'm', 'completed', 10, md5(i::text), 10, 10"
        " FROM generate_series(1, $2) AS i",
        "e" * 32,
        ENDED_JOBS,
    )
    await add_job(pool, "running", 10, released=5)
    await pool.execute("ANALYZE batches")
    plan = "\n".join(r[0] for r in await pool.fetch(f"EXPLAIN {_COUNTERS}"))
    assert "batches_unfinished" in plan, plan
    assert "Seq Scan" not in plan, plan
