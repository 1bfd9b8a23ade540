"""Retention on the real ledger: an ended job past its retention leaves nothing behind
in any table; recent, live and template jobs stay; idempotency records go after their
24 hours; a workspace's own retention wins; two reapers at once purge each job once;
each transaction stays within its budget; settled provider batch records past the
retention go, in bounded transactions, and no record still in progress does."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg

from relay_batches.ids import new_id
from relay_batches.ledger.idempotency import IdempotencyClaim, record_response
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.offload import OffloadStore, RowState
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.ledger.pool import create_pool
from relay_batches.ledger.retention import (
    Purged,
    PurgedOffloads,
    RetentionStore,
    set_workspace_retention,
)
from relay_batches.messages import RowOutcome
from relay_batches.services.scheduler.retention import Purger
from tests.helpers.offload import ended_provider_batch
from tests.helpers.support import Isolation, relay_admin, rows_naming

ROW = '[{"content":"x","role":"user"}]'
# Far longer than any other test's jobs have been ended: only this file's (dated back
# past it) are due.
RETENTION = timedelta(days=30)


async def workspace(pool: asyncpg.Pool) -> tuple[str, str]:
    """A new workspace: (id, name)."""
    name = f"retain-{new_id()[:8]}"
    return await KeyStore(pool).ensure_workspace(name), name


async def job(pool: asyncpg.Pool, ws: str, rows: int = 3, *, cron: str | None = None) -> str:
    """A queued job of ``rows`` rows (a scheduled template with ``cron``); its id."""
    new = NewJob(new_id(), ws, "r", "gpt-4o-mini", 0, rows, None, cron, None)
    created = await JobStore(pool).create(new, [(f"c-{i}", ROW) for i in range(rows)])
    return created.id


async def ended(pool: asyncpg.Pool, ws: str, days_ago: float, rows: int = 3) -> str:
    """A job that ran to completed ``days_ago`` days ago, with a delivery, a delivery log
    entry and the idempotency record of its create."""
    batch_id = await job(pool, ws, rows)
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", batch_id)
    await OutcomeStore(pool).record(
        [RowOutcome(batch_id, i, f"answer {i}", None, 1) for i in range(rows)]
    )
    await pool.execute(
        "INSERT INTO webhook_deliveries (batch_id, url, status)"
        " VALUES ($1, 'http://h/', 'sending')",
        batch_id,
    )
    await pool.execute(
        "INSERT INTO webhook_attempts (batch_id, attempt, status) VALUES ($1, 1, 'delivered')",
        batch_id,
    )
    async with pool.acquire() as conn:
        await record_response(
            conn, IdempotencyClaim(ws, f"k-{batch_id}", b"h"), 201, f'{{"id":"{batch_id}"}}'
        )
    await pool.execute(
        "UPDATE batches SET completed_at = now() - make_interval(secs => $2)"
        " WHERE id = $1 AND status = 'completed'",
        batch_id,
        days_ago * 86400,
    )
    return batch_id


async def counts(pool: asyncpg.Pool, batch_id: str) -> dict[str, int]:
    """How many rows of each table name ``batch_id``."""
    return await rows_naming(pool, batch_id)


NOTHING = {
    "batches": 0,
    "batch_rows": 0,
    "row_results": 0,
    "deliveries": 0,
    "attempts": 0,
    "keys": 0,
}
EVERYTHING = {**NOTHING, "batches": 1, "batch_rows": 3, "row_results": 3}
EVERYTHING |= {"deliveries": 1, "attempts": 1, "keys": 1}


async def test_an_old_ended_job_is_purged_from_every_table_and_the_rest_stay(
    pool: asyncpg.Pool,
) -> None:
    ws, _ = await workspace(pool)
    old = await ended(pool, ws, days_ago=31)
    recent = await ended(pool, ws, days_ago=29)
    queued = await job(pool, ws)
    running, paused = await job(pool, ws), await job(pool, ws)
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", running)
    await pool.execute("UPDATE batches SET status = 'paused' WHERE id = $1", paused)
    template = await job(pool, ws, cron="0 * * * *")
    live = (queued, running, paused, template)
    # Canceled templates are ended jobs: one alone, and one whose queued run still runs
    # its rows (stored under the template's id).
    canceled, with_run = (
        await job(pool, ws, cron="0 * * * *"),
        await job(pool, ws, cron="0 * * * *"),
    )
    run = await JobStore(pool).create(
        NewJob(new_id(), ws, "r", "gpt-4o-mini", 0, 3, None, None, None, rows_batch_id=with_run),
        [],
    )
    await pool.execute(
        "UPDATE batches SET created_at = now() - interval '60 days',"
        " completed_at = CASE WHEN id = ANY($2::text[]) THEN now() - interval '60 days' END,"
        " status = CASE WHEN id = ANY($2::text[]) THEN 'canceled' ELSE status END"
        " WHERE id = ANY($1::text[])",
        [*live, canceled, with_run],
        [canceled, with_run],
    )
    assert await counts(pool, old) == EVERYTHING

    purged = await Purger(RetentionStore(pool, RETENTION)).purge_pass()

    assert purged == Purged(3, 9)
    assert await counts(pool, old) == NOTHING
    assert await JobStore(pool).get(ws, old) is None
    assert await counts(pool, canceled) == {**NOTHING}
    # The canceled template went; the rows its live run still runs stayed.
    assert await JobStore(pool).get(ws, with_run) is None
    assert (await counts(pool, with_run))["batch_rows"] == 3
    assert await JobStore(pool).get(ws, run.id) is not None
    assert await counts(pool, recent) == EVERYTHING
    for kept in live:
        assert (await counts(pool, kept))["batch_rows"] == 3


async def test_idempotency_records_go_after_24_hours(pool: asyncpg.Pool) -> None:
    ws, _ = await workspace(pool)
    async with pool.acquire() as conn:
        for key in ("stale", "fresh"):
            await record_response(conn, IdempotencyClaim(ws, key, b"h"), 201, '{"id":"x"}')
    await pool.execute(
        "UPDATE idempotency_keys SET created_at = now() - interval '24 hours 1 second'"
        " WHERE workspace_id = $1 AND key = 'stale'",
        ws,
    )

    await Purger(RetentionStore(pool, RETENTION)).purge_pass()

    keys = await pool.fetch("SELECT key FROM idempotency_keys WHERE workspace_id = $1", ws)
    assert [r["key"] for r in keys] == ["fresh"]


async def test_a_workspaces_own_retention_wins(pool: asyncpg.Pool) -> None:
    short, short_name = await workspace(pool)
    long, long_name = await workspace(pool)
    default, _ = await workspace(pool)
    assert await set_workspace_retention(pool, short_name, timedelta(days=7))
    assert await set_workspace_retention(pool, long_name, timedelta(days=90))
    assert not await set_workspace_retention(pool, "no-such-workspace", None)
    short_old, short_recent = await ended(pool, short, 8), await ended(pool, short, 6)
    long_kept, default_kept = await ended(pool, long, 60), await ended(pool, default, 8)

    assert await Purger(RetentionStore(pool, RETENTION)).purge_pass() == Purged(1, 3)

    assert await counts(pool, short_old) == NOTHING
    for kept in (short_recent, long_kept, default_kept):
        assert await counts(pool, kept) == EVERYTHING


async def test_two_reapers_at_once_purge_each_job_once(iso: Isolation, pool: asyncpg.Pool) -> None:
    ws, _ = await workspace(pool)
    due = [await ended(pool, ws, days_ago=31, rows=1) for _ in range(30)]
    pools = [await create_pool(iso.database_url, max_size=1) for _ in range(2)]
    try:
        purgers = [Purger(RetentionStore(p, RETENTION, jobs=4, rows=100)) for p in pools]
        passes = await asyncio.gather(*(purger.purge_pass() for purger in purgers))
    finally:
        await asyncio.gather(*(p.close() for p in pools))

    assert sum(p.jobs for p in passes) == 30  # a job deleted twice would count twice
    left = await pool.fetchval("SELECT count(*) FROM batches WHERE id = ANY($1::text[])", due)
    assert left == 0


async def test_a_job_another_transaction_holds_is_skipped_not_waited_for(
    pool: asyncpg.Pool,
) -> None:
    ws, _ = await workspace(pool)
    held, free = await ended(pool, ws, 31), await ended(pool, ws, 32)
    store = RetentionStore(pool, RETENTION)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM batches WHERE id = $1 FOR UPDATE", held)
        assert await asyncio.wait_for(store.purge_jobs(), 5) == Purged(1, 3)
        assert await counts(pool, free) == NOTHING
        assert await counts(pool, held) == EVERYTHING

    assert await store.purge_jobs() == Purged(1, 3)
    assert await counts(pool, held) == NOTHING


async def test_a_job_whose_retry_another_transaction_holds_waits_for_a_later_one(
    pool: asyncpg.Pool,
) -> None:
    ws, _ = await workspace(pool)
    original, retry = await ended(pool, ws, 32), await ended(pool, ws, 31)
    await pool.execute(
        "UPDATE batches SET retries = ARRAY[$2::text] WHERE id = $1", original, retry
    )
    await pool.execute("UPDATE batches SET retry_of = $2 WHERE id = $1", retry, original)
    store = RetentionStore(pool, RETENTION, jobs=1)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM batches WHERE id = $1 FOR UPDATE", retry)
        # The oldest due job (the original) is taken alone; its retry is held elsewhere.
        assert await asyncio.wait_for(store.purge_jobs(), 5) == Purged(0, 0)
        assert await counts(pool, original) == EVERYTHING

    both = RetentionStore(pool, RETENTION)
    assert await both.purge_jobs() == Purged(2, 6)
    assert await counts(pool, original) == NOTHING
    assert await counts(pool, retry) == NOTHING


async def test_each_transaction_stays_within_its_budget(pool: asyncpg.Pool) -> None:
    ws, _ = await workspace(pool)
    for _ in range(5):
        await ended(pool, ws, days_ago=31, rows=3)
    store = RetentionStore(pool, RETENTION, jobs=3, rows=7)

    transactions = [await store.purge_jobs() for _ in range(4)]

    # 7 rows hold two 3-row jobs; the last transaction finds nothing due.
    assert transactions == [Purged(2, 6), Purged(2, 6), Purged(1, 3), Purged(0, 0)]
    assert await RetentionStore(pool, RETENTION, jobs=1).purge_jobs() == Purged(0, 0)


async def test_a_job_larger_than_the_budget_goes_a_slice_per_transaction(
    pool: asyncpg.Pool,
) -> None:
    ws, _ = await workspace(pool)
    large = await ended(pool, ws, days_ago=31, rows=10)
    store = RetentionStore(pool, RETENTION, rows=4)  # two outcomes and two rows at a time

    transactions = [await store.purge_jobs() for _ in range(6)]

    trims = [Purged(0, 0, 4)] * 5
    assert transactions == [*trims, Purged(1, 10)]
    assert await counts(pool, large) == NOTHING
    assert await store.purge_jobs() == Purged(0, 0)


async def test_relay_workspaces_retention_sets_and_clears_the_override(
    iso: Isolation, pool: asyncpg.Pool
) -> None:
    _, name = await workspace(pool)
    stored = "SELECT retention FROM workspaces WHERE name = $1"

    done = await relay_admin(iso, "workspaces", "retention", name, "7d")
    assert (done.returncode, done.stdout) == (
        0,
        f"workspace {name}: ended jobs kept for 7d, then purged\n",
    )
    assert await pool.fetchval(stored, name) == timedelta(days=7)
    refused = await relay_admin(iso, "workspaces", "retention", name, "a week")
    assert refused.returncode == 2 and "write <n>s, <n>m, <n>h or <n>d" in refused.stderr
    back = await relay_admin(iso, "workspaces", "retention", name, "default")
    assert back.stdout == f"workspace {name}: ended jobs kept for RELAY_RETENTION, then purged\n"
    assert await pool.fetchval(stored, name) is None
    missing = await relay_admin(iso, "workspaces", "retention", "nope", "1d")
    assert missing.returncode == 1 and "no workspace named 'nope'" in missing.stderr


async def provider_batch(pool: asyncpg.Pool, total: int, *, settle: bool = True) -> tuple[str, int]:
    """An offloaded job of ``total`` rows all in one provider batch that ended 31 days ago
    (and was settled with ``settle``): rows 0 and 1 done, the others forwarded; the job's
    id and the record's."""
    deployment = f"retain-off-{new_id()[:8]}"
    store, owner = OffloadStore(pool), f"o-{deployment}"
    batch_id, _, made = await ended_provider_batch(store, pool, total, deployment, owner)
    assert await store.mark_done([(batch_id, 0), (batch_id, 1)]) == (2, 0)
    if settle:
        assert await store.settle(made, owner) == total - 2
        await pool.execute(
            "UPDATE offload_rows SET state = $2 WHERE batch_id = $1 AND state = 'forward'",
            batch_id,
            RowState.FORWARDED,
        )
    await pool.execute(
        "UPDATE offload_batches SET ended_at = now() - interval '31 days' WHERE id = $1", made
    )
    return batch_id, made


async def records(pool: asyncpg.Pool, ids: list[int]) -> set[int]:
    """Which of the provider batch records ``ids`` are left."""
    left = await pool.fetch("SELECT id FROM offload_batches WHERE id = ANY($1::bigint[])", ids)
    return {r[0] for r in left}


async def test_settled_provider_batch_records_past_the_retention_go_and_the_rest_stay(
    pool: asyncpg.Pool,
) -> None:
    done_job, done = await provider_batch(pool, 5)
    gone_job, gone = await provider_batch(pool, 3)
    await pool.execute("DELETE FROM batches WHERE id = $1", gone_job)  # its rows go with it
    waiting_job, waiting = await provider_batch(pool, 3)
    await pool.execute(
        "UPDATE offload_rows SET state = 'forward' WHERE batch_id = $1 AND row_index = 2",
        waiting_job,
    )
    _, recent = await provider_batch(pool, 3)
    await pool.execute("UPDATE offload_batches SET ended_at = now() WHERE id = $1", recent)
    _, unsettled = await provider_batch(pool, 3, settle=False)
    ids = [done, gone, waiting, recent, unsettled]

    await Purger(RetentionStore(pool, RETENTION)).purge_pass()

    assert await records(pool, ids) == {waiting, recent, unsettled}
    # The running job keeps its offload rows, which no longer name the record.
    kept = await pool.fetch(
        "SELECT state, provider_batch FROM offload_rows WHERE batch_id = $1 ORDER BY row_index",
        done_job,
    )
    assert [tuple(r) for r in kept] == [("done", None)] * 2 + [("forwarded", None)] * 3
    named = await pool.fetchval(
        "SELECT count(*) FROM offload_rows WHERE provider_batch = $1", waiting
    )
    assert named == 3


async def test_provider_batch_records_go_within_the_row_budget(pool: asyncpg.Pool) -> None:
    _, made = await provider_batch(pool, 5)
    store = RetentionStore(pool, RETENTION, jobs=10, rows=2)

    transactions = [await store.purge_offload_batches() for _ in range(4)]

    assert transactions == [
        PurgedOffloads(0, 2),
        PurgedOffloads(0, 2),
        PurgedOffloads(1, 1),
        PurgedOffloads(0, 0),
    ]
    assert await records(pool, [made]) == set()
