"""Deleting an ended job on the real ledger: everything stored for it goes, rows another
job still runs stay, a live job or another workspace's is left untouched."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from relay_batches.ids import new_id
from relay_batches.ledger.deletion import Deleted, JobDeletion, StillLive, delete_job
from relay_batches.ledger.idempotency import IdempotencyClaim, record_response
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.messages import RowOutcome
from relay_batches.model import Job, JobStatus
from tests.helpers.support import rows_naming, wait_until

ROW = '[{"content":"x","role":"user"}]'


async def workspace(pool: asyncpg.Pool) -> str:
    return await KeyStore(pool).ensure_workspace(f"delete-{new_id()[:8]}")


async def job(
    pool: asyncpg.Pool,
    workspace_id: str,
    rows: int = 3,
    *,
    cron: str | None = None,
    rows_batch_id: str | None = None,
) -> Job:
    """A queued job (a scheduled template with ``cron``) with ``rows`` rows of its own, or
    running the rows stored under ``rows_batch_id``."""
    new = NewJob(
        new_id(),
        workspace_id,
        "d",
        "gpt-4o-mini",
        0,
        rows,
        None,
        cron,
        None,
        rows_batch_id=rows_batch_id,
    )
    own_rows = [] if rows_batch_id else [(f"c-{i}", ROW) for i in range(rows)]
    return await JobStore(pool).create(new, own_rows)


async def finish(pool: asyncpg.Pool, target: Job) -> None:
    """Run ``target`` to completed: one row fails, the others answer."""
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", target.id)
    await OutcomeStore(pool).record(
        [
            RowOutcome(target.id, i, None, "upstream_error: HTTP 500", 1, True)
            if i == 0
            else RowOutcome(target.id, i, f"answer {i}", None, 1)
            for i in range(target.total)
        ]
    )


async def counts(pool: asyncpg.Pool, batch_id: str) -> dict[str, int]:
    """How many rows of each table but the webhook attempts name ``batch_id``."""
    named = await rows_naming(pool, batch_id)
    del named["attempts"]
    return named


NOTHING = {"batches": 0, "batch_rows": 0, "row_results": 0, "deliveries": 0, "keys": 0}


async def test_an_ended_job_leaves_nothing_behind(pool: asyncpg.Pool) -> None:
    ws = await workspace(pool)
    target = await job(pool, ws)
    bystander = await job(pool, ws)
    await finish(pool, target)
    await pool.execute(
        "INSERT INTO webhook_deliveries (batch_id, url, status)"
        " VALUES ($1, 'http://h/', 'sending')",
        target.id,
    )
    async with pool.acquire() as conn:
        await record_response(
            conn, IdempotencyClaim(ws, "k1", b"h"), 201, f'{{"id":"{target.id}"}}'
        )
        await record_response(
            conn, IdempotencyClaim(ws, "k2", b"h"), 200, f'{{"id":"msgbatch_{target.id}"}}'
        )
        await record_response(
            conn, IdempotencyClaim(ws, "k3", b"h"), 201, f'{{"id":"{bystander.id}"}}'
        )
    assert await counts(pool, target.id) == {
        "batches": 1,
        "batch_rows": 3,
        "row_results": 3,
        "deliveries": 1,
        "keys": 2,
    }

    assert await JobDeletion(pool).delete(ws, target.id) is Deleted.DELETED

    assert await counts(pool, target.id) == NOTHING
    assert await JobStore(pool).get(ws, target.id) is None
    assert await counts(pool, bystander.id) == {**NOTHING, "batches": 1, "batch_rows": 3, "keys": 1}
    assert await JobDeletion(pool).delete(ws, target.id) is Deleted.NOT_FOUND


async def test_a_live_job_is_not_deleted(pool: asyncpg.Pool) -> None:
    ws = await workspace(pool)
    queued = await job(pool, ws)
    running = await job(pool, ws)
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", running.id)
    template = await job(pool, ws, cron="0 * * * *")

    for live, status in ((queued, "queued"), (running, "running"), (template, "scheduled")):
        with pytest.raises(StillLive) as caught:
            await JobDeletion(pool).delete(ws, live.id)
        assert caught.value.status == status
        assert (await counts(pool, live.id))["batch_rows"] == 3


async def test_another_workspace_cannot_delete_a_job(pool: asyncpg.Pool) -> None:
    owner, other = await workspace(pool), await workspace(pool)
    target = await job(pool, owner)
    await JobStore(pool).cancel(owner, target.id)

    assert await JobDeletion(pool).delete(other, target.id) is Deleted.NOT_FOUND
    assert (await counts(pool, target.id))["batches"] == 1


async def test_a_templates_rows_stay_while_a_run_uses_them(pool: asyncpg.Pool) -> None:
    ws = await workspace(pool)
    template = await job(pool, ws, cron="0 * * * *")
    run = await job(pool, ws, rows_batch_id=template.id)
    await pool.execute("UPDATE batches SET template_id = $1 WHERE id = $2", template.id, run.id)
    await finish(pool, run)
    await JobStore(pool).cancel(ws, template.id)

    assert await JobDeletion(pool).delete(ws, template.id) is Deleted.DELETED

    assert await counts(pool, template.id) == {**NOTHING, "batch_rows": 3}  # the run's rows
    detached = await JobStore(pool).get(ws, run.id)
    assert detached is not None and detached.template_id is None
    assert [r.content async for page in JobStore(pool).result_pages(detached) for r in page] == [
        None,
        "answer 1",
        "answer 2",
    ]


async def test_deleting_a_run_keeps_its_templates_rows_and_then_the_template_takes_them(
    pool: asyncpg.Pool,
) -> None:
    ws = await workspace(pool)
    template = await job(pool, ws, cron="0 * * * *")
    run = await job(pool, ws, rows_batch_id=template.id)
    await pool.execute("UPDATE batches SET template_id = $1 WHERE id = $2", template.id, run.id)
    await finish(pool, run)

    assert await JobDeletion(pool).delete(ws, run.id) is Deleted.DELETED
    assert await counts(pool, run.id) == NOTHING
    assert (await counts(pool, template.id))["batch_rows"] == 3

    canceled = await JobStore(pool).cancel(ws, template.id)
    assert canceled.status == JobStatus.CANCELED
    assert await JobDeletion(pool).delete(ws, template.id) is Deleted.DELETED
    assert await counts(pool, template.id) == NOTHING


async def test_rows_stored_under_another_id_are_never_touched(pool: asyncpg.Pool) -> None:
    ws = await workspace(pool)
    file_id = new_id()  # rows stored under an id that is no job's, as an uploaded file's
    await pool.executemany(
        "INSERT INTO batch_rows (batch_id, row_index, custom_id, request) VALUES ($1, $2, $3, $4)",
        [(file_id, i, f"f-{i}", ROW) for i in range(3)],
    )
    first = await job(pool, ws, rows_batch_id=file_id)
    second = await job(pool, ws, rows_batch_id=file_id)
    await finish(pool, first)

    assert await JobDeletion(pool).delete(ws, first.id) is Deleted.DELETED

    assert await counts(pool, first.id) == NOTHING
    assert (await counts(pool, file_id))["batch_rows"] == 3
    assert (await counts(pool, second.id))["batches"] == 1


async def _job_with_id(
    pool: asyncpg.Pool, workspace_id: str, batch_id: str, cron: str | None
) -> Job:
    new = NewJob(batch_id, workspace_id, "d", "gpt-4o-mini", 0, 1, None, cron, None)
    return await JobStore(pool).create(new, [("c-0", ROW)])


async def _waiting_for_a_lock(observer: asyncpg.Pool, pid: int) -> bool:
    event = await observer.fetchval(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
    )
    return bool(event == "Lock")


async def test_deleting_a_template_locks_it_and_its_runs_in_id_order(
    pool: asyncpg.Pool,
) -> None:
    """While the aggregator holds a run whose id is below the template's, the deletion
    waits for that run before it locks the template (id order, as the aggregator locks),
    so the aggregator can still lock the template and no deadlock can close."""
    ws = await workspace(pool)
    template = await _job_with_id(pool, ws, "f" + new_id()[1:], "0 * * * *")
    run = await _job_with_id(pool, ws, "0" + new_id()[1:], None)
    await pool.execute("UPDATE batches SET template_id = $1 WHERE id = $2", template.id, run.id)
    await JobStore(pool).cancel(ws, template.id)
    aggregator = await pool.acquire()
    deleter = await pool.acquire()
    try:
        deleter_pid = await deleter.fetchval("SELECT pg_backend_pid()")
        async with aggregator.transaction():
            await aggregator.execute("SELECT 1 FROM batches WHERE id = $1 FOR UPDATE", run.id)
            deleting = asyncio.create_task(delete_job(deleter, ws, template.id))
            await wait_until(
                lambda: _waiting_for_a_lock(pool, deleter_pid),
                10,
                "the deletion to wait for the run's lock",
            )
            # The template is not locked yet: the aggregator's next lock goes through.
            assert (
                await aggregator.fetchval(
                    "SELECT id FROM batches WHERE id = $1 FOR UPDATE NOWAIT", template.id
                )
                == template.id
            )
        assert await asyncio.wait_for(deleting, 10) is Deleted.DELETED
    finally:
        await pool.release(aggregator)
        await pool.release(deleter)
    detached = await pool.fetchrow("SELECT template_id FROM batches WHERE id = $1", run.id)
    assert detached is not None and detached["template_id"] is None
