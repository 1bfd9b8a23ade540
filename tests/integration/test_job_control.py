"""Pause, resume and retry against the real ledger: a paused job holds no running slot
and keeps its place, a resumed one its start and a fresh rate window; a retry is a new
job of exactly the failed rows, made once."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import orjson
import pytest

from relay_batches.errors import ConflictError
from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.idempotency import IdempotencyClaim, IdempotencyStore, KeyTaken
from relay_batches.ledger.job_retry import NothingToRetry
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.messages import RowOutcome
from relay_batches.model import Job

OWNER = "control-test"


async def workspace(pool: asyncpg.Pool) -> str:
    return await KeyStore(pool).ensure_workspace(f"ctl-{new_id()[:8]}")


async def job_of(
    pool: asyncpg.Pool,
    space: str,
    n: int,
    window: timedelta | None = None,
    budget_usd: float | None = None,
) -> Job:
    """A queued job of ``n`` rows ``c-0``… whose requests say ``x<i>``."""
    new = NewJob(
        new_id(),
        space,
        "ctl",
        "gpt-4o-mini",
        3,
        n,
        None,
        None,
        None,
        completion_window=window,
        budget_usd=budget_usd,
    )
    return await JobStore(pool).create(
        new, ((f"c-{i}", f'[{{"role":"user","content":"x{i}"}}]') for i in range(n))
    )


async def claim_only(pool: asyncpg.Pool, batch_id: str, per_workspace: int = 0) -> list[str]:
    """Claim queued jobs of the session's ledger; the ids claimed among ``batch_id``'s
    workspace's jobs."""
    space = await pool.fetchval("SELECT workspace_id FROM batches WHERE id = $1", batch_id)
    claimed = await DispatchStore(pool).claim_queued(OWNER, 1000, 30, per_workspace)
    return sorted(j.id for j in claimed if j.workspace_id == space)


async def test_a_paused_job_holds_no_running_slot(pool: asyncpg.Pool) -> None:
    space = await workspace(pool)
    first = await job_of(pool, space, 4)
    second = await job_of(pool, space, 4)
    assert await claim_only(pool, first.id, per_workspace=1) == [first.id]
    assert await claim_only(pool, first.id, per_workspace=1) == []  # the cap holds

    await JobStore(pool).pause(space, first.id)

    assert await claim_only(pool, first.id, per_workspace=1) == [second.id]
    lease = await pool.fetchval("SELECT lease_owner FROM batches WHERE id = $1", first.id)
    assert lease is None
    # Neither a lease takeover nor a renewal touches a paused job.
    dispatch = DispatchStore(pool)
    await pool.execute("UPDATE batches SET lease_expires_at = now() WHERE id = $1", first.id)
    assert first.id not in {j.id for j in await dispatch.claim_expired(OWNER, 1000, 30)}
    assert await dispatch.renew(OWNER, [first.id], 30) == []
    assert not await dispatch.advance(OWNER, first.id, 4)


async def test_a_resumed_job_keeps_its_start_and_place_and_restarts_its_rate_window(
    pool: asyncpg.Pool,
) -> None:
    space = await workspace(pool)
    jobs, dispatch = JobStore(pool), DispatchStore(pool)
    job = await job_of(pool, space, 4)
    assert await claim_only(pool, job.id) == [job.id]
    assert await dispatch.advance(OWNER, job.id, 2)
    await OutcomeStore(pool).record([RowOutcome(job.id, 0, "ok", None, attempts=1)])
    await pool.execute(
        "UPDATE batches SET started_at = started_at - interval '1 hour',"
        " rate_rows_per_s = 9.5 WHERE id = $1",
        job.id,
    )
    started = await pool.fetchval("SELECT started_at FROM batches WHERE id = $1", job.id)

    paused = await jobs.pause(space, job.id)
    assert (paused.status, paused.rows_per_s(), paused.eta_s()) == ("paused", None, None)
    with pytest.raises(ConflictError):
        await jobs.pause(space, job.id)
    resumed = await jobs.resume(space, job.id)
    assert resumed.status == "queued"
    assert (resumed.rate_rows_per_s, resumed.rate_window_done) == (None, 1)
    assert resumed.rate_window_at is not None
    with pytest.raises(ConflictError):
        await jobs.resume(space, job.id)

    claimed = [j for j in await dispatch.claim_queued(OWNER, 1000, 30) if j.id == job.id]
    assert [(j.dispatched_upto, j.done) for j in claimed] == [(2, 1)]
    again = await jobs.get(space, job.id)
    assert again is not None
    assert (again.status, again.started_at) == ("running", started)


async def ended_with_failures(pool: asyncpg.Pool, space: str) -> Job:
    """A completed job of 5 rows: 1 and 3 dead-lettered, 4 failed (not dead-lettered)."""
    job = await job_of(pool, space, 5, timedelta(hours=2), budget_usd=7.5)
    await JobStore(pool).pause(space, job.id)  # a paused job takes outcomes (no claim)
    outcomes = [
        RowOutcome(job.id, 0, "ok", None, attempts=1),
        RowOutcome(job.id, 1, None, "upstream_error: 503", attempts=4, dead_letter=True),
        RowOutcome(job.id, 2, "ok", None, attempts=1),
        RowOutcome(job.id, 3, None, "upstream_error: 503", attempts=4, dead_letter=True),
        RowOutcome(job.id, 4, None, "invalid_request: 400", attempts=1),
    ]
    await OutcomeStore(pool).record(outcomes)
    ended = await JobStore(pool).get(space, job.id)
    assert ended is not None and ended.status == "completed"
    return ended


async def retry_rows(pool: asyncpg.Pool, batch_id: str) -> list[tuple[int, str, str]]:
    records = await pool.fetch(
        "SELECT row_index, custom_id, request FROM batch_rows WHERE batch_id = $1"
        " ORDER BY row_index",
        batch_id,
    )
    return [tuple(r) for r in records]


async def test_a_retry_is_a_new_job_of_exactly_the_failed_rows_in_order(
    pool: asyncpg.Pool,
) -> None:
    space = await workspace(pool)
    jobs = JobStore(pool)
    original = await ended_with_failures(pool, space)

    failed = await jobs.create_retry(space, original, "failed", new_id())
    dead = await jobs.create_retry(space, original, "dead_letter", new_id())

    assert await retry_rows(pool, failed.id) == [
        (0, "c-1", '[{"role":"user","content":"x1"}]'),
        (1, "c-3", '[{"role":"user","content":"x3"}]'),
        (2, "c-4", '[{"role":"user","content":"x4"}]'),
    ]
    assert [r[1] for r in await retry_rows(pool, dead.id)] == ["c-1", "c-3"]
    for retry, total in ((failed, 3), (dead, 2)):
        assert (retry.status, retry.total, retry.retry_of) == ("queued", total, original.id)
        assert (retry.name, retry.model, retry.priority) == ("ctl", "gpt-4o-mini", 3)
        assert (retry.budget_usd, retry.cost_usd) == (7.5, 0.0)  # capped as the original
        assert retry.rows_batch_id == retry.id
        assert retry.expires_at is not None and original.expires_at is not None
        assert retry.expires_at > original.expires_at  # a new deadline from now
    listed = await jobs.get(space, original.id)
    assert listed is not None and listed.retries == (failed.id, dead.id)


async def test_a_retry_keeps_each_rows_own_model(pool: asyncpg.Pool) -> None:
    """batch_rows.model is copied with the row (the offload intake routes by it)."""
    space = await workspace(pool)
    original = await ended_with_failures(pool, space)
    await pool.execute(
        "UPDATE batch_rows SET model = 'own-alias' WHERE batch_id = $1 AND row_index = 3",
        original.rows_batch_id,
    )
    retry = await JobStore(pool).create_retry(space, original, "failed", new_id())
    models = await pool.fetch(
        "SELECT model FROM batch_rows WHERE batch_id = $1 ORDER BY row_index", retry.id
    )
    assert [r[0] for r in models] == [None, "own-alias", None]


async def test_a_retry_refuses_a_live_job_and_one_without_such_rows(pool: asyncpg.Pool) -> None:
    space = await workspace(pool)
    jobs = JobStore(pool)
    live = await job_of(pool, space, 2)
    with pytest.raises(ConflictError):
        await jobs.create_retry(space, live, "failed", new_id())
    clean = await job_of(pool, space, 2)
    await jobs.pause(space, clean.id)
    await OutcomeStore(pool).record([RowOutcome(clean.id, i, "ok", None, 1) for i in range(2)])
    ended = await jobs.get(space, clean.id)
    assert ended is not None and ended.status == "completed"
    retry_id = new_id()
    with pytest.raises(NothingToRetry):
        await jobs.create_retry(space, ended, "dead_letter", retry_id)
    assert await jobs.get(space, retry_id) is None
    assert await retry_rows(pool, retry_id) == []
    unchanged = await jobs.get(space, clean.id)
    assert unchanged is not None and unchanged.retries == ()


async def test_a_retry_with_an_idempotency_key_is_made_once(pool: asyncpg.Pool) -> None:
    space = await workspace(pool)
    jobs = JobStore(pool)
    original = await ended_with_failures(pool, space)
    claim = IdempotencyClaim(space, f"retry-{new_id()}", b"hash")

    first = await jobs.create_retry(space, original, "failed", new_id(), claim)
    with pytest.raises(KeyTaken):
        await jobs.create_retry(space, original, "failed", new_id(), claim)

    stored = await IdempotencyStore(pool).find(space, claim.key)
    assert stored is not None and stored.status == 201
    assert orjson.loads(stored.body)["id"] == first.id
    listed = await jobs.get(space, original.id)
    assert listed is not None and listed.retries == (first.id,)
