"""The statistics keeper on a ledger of its own (this Postgres runs without autovacuum):
it analyzes the row tables Relay filled or changed enough, nothing else, one process at
a time; and the migration gives autovacuum the same bound on the row tables."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from relay_batches.ids import new_id
from relay_batches.ledger.pool import create_pool
from relay_batches.ledger.statistics import LOCK_KEY, StatisticsKeeper
from tests.helpers.support import create_isolation, drop_isolation, wait_until

AFTER_ROWS = 5_000  # the keeper's bound in these tests (50,000 in production)
ROW_TABLES = ("batch_rows", "row_results")


@pytest.fixture
async def pool() -> AsyncIterator[asyncpg.Pool]:
    """A pool on a fresh ledger whose tables were never analyzed."""
    iso = await create_isolation("keeper")
    created = await create_pool(iso.database_url, max_size=3)
    try:
        yield created
    finally:
        await created.close()
        await drop_isolation(iso)


async def add_job(pool: asyncpg.Pool, rows: int, answered: int) -> str:
    """A stored job of ``rows`` rows, ``answered`` of them with an outcome (set based)."""
    job, workspace = new_id(), new_id()
    await pool.execute("INSERT INTO workspaces (id, name) VALUES ($1, $1)", workspace)
    await pool.execute(
        "INSERT INTO batches (id, workspace_id, name, model, status, total, rows_batch_id)"
        " VALUES ($1, $2, 'j', 'gpt-4o-mini', 'running', $3, $1)",
        job,
        workspace,
        rows,
    )
    await pool.execute(
        "INSERT INTO batch_rows (batch_id, row_index, custom_id, request)"
        " SELECT $1, i, 'c-' || i, '[]' FROM generate_series(0, $2 - 1) AS i",
        job,
        rows,
    )
    await answer(pool, job, 0, answered)
    return job


async def answer(pool: asyncpg.Pool, job: str, start: int, end: int) -> None:
    """Outcomes for rows ``start <= index < end`` of ``job``."""
    await pool.execute(
        "INSERT INTO row_results (batch_id, row_index, content, attempts)"
        " SELECT $1, i, 'ok', 1 FROM generate_series($2, $3 - 1) AS i",
        job,
        start,
        end,
    )


async def analyzed_at(pool: asyncpg.Pool) -> dict[str, object]:
    """Each kept table's last manual analyze (None: never)."""
    records = await pool.fetch(
        "SELECT relname, last_analyze FROM pg_stat_user_tables WHERE relname = ANY($1::text[])",
        ["batch_rows", "row_results", "batches"],
    )
    return {r[0]: r[1] for r in records}


async def refreshed(keeper: StatisticsKeeper, tables: set[str]) -> None:
    """Passes of ``keeper`` until it has analyzed ``tables`` (the activity counters it
    reads reach pg_stat within a second or so of a commit)."""
    done: set[str] = set()

    async def all_done() -> bool:
        done.update(await keeper.refresh())
        assert done <= tables, done
        return done == tables

    await wait_until(all_done, 15, f"the keeper to analyze {sorted(tables)}", every=0.3)


async def test_the_keeper_analyzes_what_relay_filled_and_changed_and_nothing_else(
    pool: asyncpg.Pool,
) -> None:
    keeper = StatisticsKeeper(pool, after_rows=AFTER_ROWS)
    assert await keeper.refresh() == []  # empty tables: nothing to learn
    job = await add_job(pool, 20_000, 1_000)
    await refreshed(keeper, {"batch_rows", "row_results", "batches"})
    planned = await pool.fetchval(
        "SELECT count(*) FROM pg_stats WHERE tablename = 'batch_rows' AND attname = 'batch_id'"
        " AND $1 = ANY(most_common_vals::text::text[])",
        job,
    )
    assert planned == 1  # the planner now knows the job's rows
    before = await analyzed_at(pool)
    assert await keeper.refresh() == []

    await answer(pool, job, 1_000, 1_000 + AFTER_ROWS // 2)  # below the bound

    async def counted() -> bool:
        changed = await pool.fetchval(
            "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'row_results'"
        )
        return bool(changed >= AFTER_ROWS // 2)

    await wait_until(counted, 15, "the outcomes counted in pg_stat")
    assert await keeper.refresh() == []
    await answer(pool, job, 1_000 + AFTER_ROWS // 2, 1_000 + 2 * AFTER_ROWS)
    await refreshed(keeper, {"row_results"})
    after = await analyzed_at(pool)
    assert after["batch_rows"] == before["batch_rows"]
    assert after["row_results"] != before["row_results"]


async def test_one_process_at_a_time(pool: asyncpg.Pool) -> None:
    keeper = StatisticsKeeper(pool, after_rows=AFTER_ROWS)
    await add_job(pool, 10_000, 100)
    async with pool.acquire() as other:
        assert await other.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY)
        for _ in range(3):
            assert await keeper.refresh() == []
        await other.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)
    await refreshed(keeper, {"batch_rows", "row_results", "batches"})
    held = await pool.fetchval(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
        " WHERE l.locktype = 'advisory' AND d.datname = current_database()"
    )
    assert held == 0  # the keeper let its lock go


async def test_autovacuum_analyzes_the_row_tables_at_the_keepers_bound(
    pool: asyncpg.Pool,
) -> None:
    options = await pool.fetch(
        "SELECT relname, reloptions FROM pg_class WHERE relname = ANY($1::text[])",
        list(ROW_TABLES),
    )
    for table, settings in options:
        assert "autovacuum_analyze_scale_factor=0.02" in settings, table
        assert "autovacuum_analyze_threshold=50000" in settings, table
