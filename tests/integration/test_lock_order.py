"""Lock order on job rows, against the real Postgres: statements that lock several jobs
(dispatcher lease renewal, release, stall claim, the outbox flag) take them in id order,
as the aggregator does, so they can never deadlock with it.

Each round interleaves three connections deterministically: an aggregator transaction
holds the lowest-id job (its first lock in id order), a dispatcher statement over the
three jobs starts and is seen waiting for a lock (third connection, pg_stat_activity),
then the aggregator locks the other two and commits. The jobs are inserted in reverse
id order and the dispatcher's connection plans without index scans (what the planner
picks on a big batches table: a bitmap or sequential scan, which meets rows in physical
order). A statement that locked in physical order would hold the two higher ids while
waiting for the lowest one, and Postgres would abort a side with ``deadlock detected``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outbox import mark_finished_published
from relay_batches.ledger.outcomes import _LOCK_RUNNING
from relay_batches.model import JobStatus, allowed_from
from tests.helpers.support import Isolation, wait_until

OWNER = "dispatcher-locks"
ROUNDS = 8

Statement = Callable[[asyncpg.Pool, list[str]], Awaitable[object]]


async def _renew(pool: asyncpg.Pool, ids: list[str]) -> object:
    return await DispatchStore(pool).renew(OWNER, ids, 30)


async def _release(pool: asyncpg.Pool, ids: list[str]) -> object:
    return await DispatchStore(pool).release(OWNER, ids)


async def _claim_stalled(pool: asyncpg.Pool, ids: list[str]) -> object:
    return await DispatchStore(pool).claim_stalled(OWNER, ids, 60)


async def _mark_published(pool: asyncpg.Pool, ids: list[str]) -> object:
    return await mark_finished_published(pool, ids)


@pytest.fixture
async def planless_pool(iso: Isolation) -> AsyncIterator[asyncpg.Pool]:
    """One connection that never plans an index scan (rows met in physical order)."""
    created = await asyncpg.create_pool(
        iso.database_url,
        min_size=1,
        max_size=1,
        server_settings={"enable_indexscan": "off", "enable_indexonlyscan": "off"},
    )
    assert created is not None
    yield created
    await created.close()


async def _running_jobs_in_reverse_id_order(pool: asyncpg.Pool) -> list[str]:
    """Three running jobs of ours without progress for an hour; ids ascending, but
    inserted (and so stored) highest id first."""
    workspace = await KeyStore(pool).ensure_workspace(f"locks-{new_id()[:6]}")
    ids = sorted(new_id() for _ in range(3))
    for batch_id in reversed(ids):
        await JobStore(pool).create(
            NewJob(batch_id, workspace, "locks", "gpt-4o-mini", 0, 1, None, None, None),
            [("c-0", '[{"role":"user","content":"hi"}]')],
        )
    await pool.execute(
        "UPDATE batches SET status = $2, lease_owner = $3, started_at = now(),"
        " last_progress_at = now() - interval '1 hour',"
        " lease_expires_at = now() + interval '1 minute' WHERE id = ANY($1::text[])",
        ids,
        JobStatus.RUNNING,
        OWNER,
    )
    return ids


async def _waiting_for_a_lock(observer: asyncpg.Connection, pid: int) -> bool:
    event = await observer.fetchval(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
    )
    return bool(event == "Lock")


@pytest.mark.parametrize(
    "statement",
    [_renew, _release, _claim_stalled, _mark_published],
    ids=["renew", "release", "claim_stalled", "mark_finished_published"],
)
async def test_multi_job_statements_never_deadlock_with_the_aggregator(
    pool: asyncpg.Pool, iso: Isolation, planless_pool: asyncpg.Pool, statement: Statement
) -> None:
    dispatcher_pid = await planless_pool.fetchval("SELECT pg_backend_pid()")
    aggregator = await asyncpg.connect(iso.database_url)
    observer = await asyncpg.connect(iso.database_url)
    statuses = allowed_from(JobStatus.COMPLETED)
    try:
        for _ in range(ROUNDS):
            ids = await _running_jobs_in_reverse_id_order(pool)
            async with aggregator.transaction():
                assert await aggregator.fetch(_LOCK_RUNNING, ids[:1], statuses)
                dispatching = asyncio.create_task(statement(planless_pool, ids))
                await wait_until(
                    lambda: _waiting_for_a_lock(observer, dispatcher_pid),
                    10,
                    "the dispatcher statement to wait for the aggregator's lock",
                )
                locked = await aggregator.fetch(_LOCK_RUNNING, ids, statuses)
                assert [r[0] for r in locked] == ids
            await asyncio.wait_for(dispatching, 10)
    finally:
        await aggregator.close()
        await observer.close()
