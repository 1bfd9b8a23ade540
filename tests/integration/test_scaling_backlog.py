"""The row-worker ScaledObject's backlog query, run as KEDA runs it, on a real ledger with
our migrations: it counts the unfinished rows of queued and running jobs only, and reads
them through the partial indexes of live jobs, whatever the number of ended ones."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from relay_batches.ids import new_id
from tests.deploy.manifests import backlog_query
from tests.helpers.support import Isolation, create_isolation, drop_isolation

# (status, total, completed, failed) of each job, and the backlog KEDA should see.
JOBS = [
    ("queued", 100, 0, 0),  # 100
    ("queued", 7, 0, 0),  # 7 (a retry or a run: queued like any job)
    ("running", 50, 10, 5),  # 35
    ("running", 3, 2, 1),  # 0: every row has an outcome, not yet finalised
    ("paused", 30, 4, 0),  # not released until resumed
    ("scheduled", 40, 0, 0),  # a cron template never runs itself
    ("completed", 20, 19, 1),
    ("failed", 9, 0, 0),
    ("canceled", 60, 12, 0),
    ("expired", 25, 5, 0),
]
BACKLOG = 100 + 7 + 35


@pytest.fixture
async def ledger() -> AsyncIterator[asyncpg.Connection]:
    """A connection to a fresh migrated database of its own (the session's has other jobs)."""
    iso: Isolation = await create_isolation("backlog")
    conn = await asyncpg.connect(iso.database_url)
    try:
        workspace = new_id()
        await conn.execute("INSERT INTO workspaces (id, name) VALUES ($1, 'backlog')", workspace)
        yield conn
    finally:
        await conn.close()
        await drop_isolation(iso)


async def _insert(conn: asyncpg.Connection, jobs: list[tuple[str, int, int, int]]) -> None:
    workspace = await conn.fetchval("SELECT id FROM workspaces")
    ids = [new_id() for _ in jobs]
    await conn.execute(
        "INSERT INTO batches (id, workspace_id, name, model, status, total, completed, failed,"
        " rows_batch_id)"
        " SELECT id, $1, 'j', 'sim', status, total, completed, failed, id"
        " FROM unnest($2::text[], $3::text[], $4::int[], $5::int[], $6::int[])"
        " AS j (id, status, total, completed, failed)",
        workspace,
        ids,
        [j[0] for j in jobs],
        [j[1] for j in jobs],
        [j[2] for j in jobs],
        [j[3] for j in jobs],
    )


async def test_the_backlog_query_counts_the_unfinished_rows_of_live_jobs(
    ledger: asyncpg.Connection,
) -> None:
    query = backlog_query()
    assert await ledger.fetchval(query) == 0  # an empty ledger: no NULL for KEDA
    await _insert(ledger, JOBS)
    assert await ledger.fetchval(query) == BACKLOG
    # A row recorded moves it by one; a job that ends leaves it.
    await ledger.execute(
        "UPDATE batches SET completed = completed + 1 WHERE status = 'running' AND total = 50"
    )
    assert await ledger.fetchval(query) == BACKLOG - 1


async def test_the_backlog_query_reads_only_live_jobs_through_their_indexes(
    ledger: asyncpg.Connection,
) -> None:
    # Many ended jobs and a few live ones: the planner must not scan them all.
    await ledger.execute(
        "INSERT INTO batches (id, workspace_id, name, model, status, total, completed,"
        " rows_batch_id)"
        " SELECT md5(n::text), (SELECT id FROM workspaces), 'old', 'sim', 'completed', 10, 10,"
        " md5(n::text) FROM generate_series(1, 20000) AS n"
    )
    await _insert(ledger, JOBS)
    await ledger.execute("ANALYZE batches")
    plan = "\n".join(r[0] for r in await ledger.fetch(f"EXPLAIN {backlog_query()}"))
    assert "Seq Scan" not in plan, plan
    # Through the index of unfinished jobs (0034), or those of queued and running ones.
    assert "batches_unfinished" in plan or (
        "batches_queued_order" in plan and "batches_running" in plan
    ), plan
    assert await ledger.fetchval(backlog_query()) == BACKLOG
