"""Statuses against the real ledger: every allowed transition of model.py is made by a
ledger function and no other one is, and the database refuses a status the enums lack."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TypeVar

import asyncpg
import pytest

from relay_batches.errors import ConflictError
from relay_batches.ids import new_id
from relay_batches.ledger.deliveries import MAX_CLAIMS, Claim, DeliveryStore
from relay_batches.ledger.delivery_log import DeliveryLog
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.expiry import ExpiryStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.migrate import migration_files
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.ledger.schedule import DueTemplate, Plan, PlannedTick, ScheduleStore
from relay_batches.messages import RowOutcome
from relay_batches.model import (
    DELIVERY_INITIAL,
    DELIVERY_STATUS_TRANSITIONS,
    JOB_INITIAL,
    JOB_STATUS_TRANSITIONS,
    DeliveryStatus,
    JobStatus,
)
from tests.helpers.support import expire_delivery_claim

HOOK = "http://127.0.0.1:9/hook"  # never connected to
FAR = datetime(2100, 1, 1, tzinfo=UTC)
ROWS = 2

Move = tuple[str | None, str]
S = TypeVar("S", bound=StrEnum)


def table_pairs(transitions: Mapping[S, frozenset[S]]) -> set[Move]:
    """Every (from, to) pair a transition table allows."""
    return {(src.value, dst.value) for src, targets in transitions.items() for dst in targets}


async def job_status(pool: asyncpg.Pool, batch_id: str) -> str | None:
    return await pool.fetchval("SELECT status FROM batches WHERE id = $1", batch_id)


async def delivery_status(pool: asyncpg.Pool, batch_id: str) -> str | None:
    return await pool.fetchval(
        "SELECT status FROM webhook_deliveries WHERE batch_id = $1", batch_id
    )


class Observed:
    """The status moves the ledger made, read from the database around each call."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.jobs: set[Move] = set()
        self.deliveries: set[Move] = set()

    async def job(self, batch_ids: Sequence[str], call: Awaitable[object]) -> None:
        before = [await job_status(self.pool, b) for b in batch_ids]
        await call
        after = [await job_status(self.pool, b) for b in batch_ids]
        self.jobs |= {(b, a) for b, a in zip(before, after, strict=True) if a != b and a}

    async def delivery(self, batch_id: str, call: Awaitable[object]) -> None:
        before = await delivery_status(self.pool, batch_id)
        await call
        after = await delivery_status(self.pool, batch_id)
        if after is not None and after != before:
            self.deliveries.add((before, after))


async def new_job(pool: asyncpg.Pool, workspace: str, cron: str | None = None) -> str:
    """A batch of ``ROWS`` rows: queued, or a scheduled template when ``cron`` is given."""
    batch = await JobStore(pool).create(
        NewJob(
            new_id(), workspace, "st", "gpt-4o-mini", 0, ROWS, HOOK, cron, FAR if cron else None
        ),
        ((f"c-{i}", '[{"role":"user","content":"x"}]') for i in range(ROWS)),
    )
    return batch.id


def plan_only(template_id: str) -> Plan:
    """A scheduler plan that spawns the tick of ``template_id`` alone."""

    def plan(due: Sequence[DueTemplate]) -> list[PlannedTick]:
        return [
            PlannedTick(t.id, f"{t.name} run", t.next_run_at, t.next_run_at + timedelta(days=1))
            for t in due
            if t.id == template_id
        ]

    return plan


async def test_every_job_transition_is_made_by_a_ledger_function(pool: asyncpg.Pool) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"st-{new_id()[:6]}")
    jobs, dispatch, outcomes = JobStore(pool), DispatchStore(pool), OutcomeStore(pool)
    expiry = ExpiryStore(pool)
    seen = Observed(pool)
    queued = [await new_job(pool, workspace) for _ in range(6)]
    template = await new_job(pool, workspace, cron="0 0 * * *")
    _, runs = await ScheduleStore(pool).spawn_due(FAR, 100, plan_only(template))
    created = [*queued, template, runs[0].id]
    initial = {await job_status(pool, b) for b in created}
    assert initial == {s.value for s in JOB_INITIAL}

    await seen.job([queued[0]], dispatch.fail(queued[0], "model gone"))
    await seen.job([queued[1]], jobs.cancel(workspace, queued[1]))
    await seen.job(queued[2:], dispatch.claim_queued("status-test", 1000, 30))
    done = [RowOutcome(queued[2], i, "ok", None, attempts=1) for i in range(ROWS)]
    await seen.job([queued[2]], outcomes.record(done))
    await seen.job([queued[3]], dispatch.fail(queued[3], "model gone"))
    await seen.job([queued[4]], jobs.cancel(workspace, queued[4]))
    late = await new_job(pool, workspace)  # queued after the claim
    await pool.execute(
        "UPDATE batches SET expires_at = now() WHERE id = ANY($1::text[])", [late, queued[5]]
    )
    await seen.job([late, queued[5]], expiry.expire_due())  # queued and running -> expired
    await seen.job([template], jobs.cancel(workspace, template))
    await jobs.cancel(workspace, runs[0].id)  # claimed above with the others; ends here
    await paused_moves(pool, workspace, seen)

    assert seen.jobs == table_pairs(JOB_STATUS_TRANSITIONS)


async def paused_moves(pool: asyncpg.Pool, workspace: str, seen: Observed) -> None:
    """Pause from queued and from running, resume, and every end of a paused job: its
    rows already released complete it, fail it on its budget, or it is canceled or
    expires."""
    jobs, dispatch, outcomes = JobStore(pool), DispatchStore(pool), OutcomeStore(pool)
    expiry = ExpiryStore(pool)
    paused = [await new_job(pool, workspace) for _ in range(4)]
    budget = await jobs.create(
        NewJob(new_id(), workspace, "st", "gpt-4o-mini", 0, ROWS, HOOK, None, None, budget_usd=0.5),
        ((f"c-{i}", '[{"role":"user","content":"x"}]') for i in range(ROWS)),
    )
    await seen.job([paused[0]], jobs.pause(workspace, paused[0]))
    await dispatch.claim_queued("status-test", 1000, 30)
    assert await dispatch.advance("status-test", budget.id, 1)  # row 0 released, row 1 not
    for batch_id in [*paused[1:], budget.id]:
        await seen.job([batch_id], jobs.pause(workspace, batch_id))
    assert {await job_status(pool, b) for b in [*paused, budget.id]} == {"paused"}
    await seen.job([paused[0]], jobs.resume(workspace, paused[0]))
    done = [RowOutcome(paused[1], i, "ok", None, attempts=1) for i in range(ROWS)]
    await seen.job([paused[1]], outcomes.record(done))
    await seen.job([paused[2]], jobs.cancel(workspace, paused[2]))
    await pool.execute("UPDATE batches SET expires_at = now() WHERE id = $1", paused[3])
    await seen.job([paused[3]], expiry.expire_due())
    # Row 0 costs more than the budget: the job stops, and the budget settle gives row 1,
    # never released, budget_exceeded, which ends it.
    costly = RowOutcome(budget.id, 0, "ok", None, attempts=1, cost_usd=1.0)
    await seen.job([budget.id], outcomes.record([costly]))

    async def settle() -> None:
        while await outcomes.settle_budget_stops():
            pass

    await seen.job([budget.id], settle())
    ended = await jobs.get(workspace, budget.id)
    assert ended is not None
    assert (ended.status, ended.completed, ended.failed) == ("failed", 1, 1)
    assert ended.error is not None and ended.error.startswith("budget_exceeded")
    # Resumed and queued again: the rows in flight at its pause still count, and the
    # last of them completes it before any dispatcher claims it again.
    last = [RowOutcome(paused[0], i, "ok", None, attempts=1) for i in range(ROWS)]
    await seen.job([paused[0]], outcomes.record(last))
    assert await job_status(pool, paused[0]) == "completed"


async def test_a_move_the_table_forbids_is_refused(pool: asyncpg.Pool) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"st-{new_id()[:6]}")
    jobs, dispatch = JobStore(pool), DispatchStore(pool)
    batch_id = await new_job(pool, workspace)
    template = await new_job(pool, workspace, cron="0 0 * * *")
    await jobs.cancel(workspace, batch_id)
    with pytest.raises(ConflictError):
        await jobs.cancel(workspace, batch_id)
    assert not await dispatch.fail(batch_id, "late")
    assert not await dispatch.fail(template, "a template never fails")
    assert await job_status(pool, batch_id) == "canceled"
    assert await job_status(pool, template) == "scheduled"
    await jobs.cancel(workspace, template)


async def test_every_delivery_transition_is_made_by_a_ledger_function(
    pool: asyncpg.Pool,
) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"st-{new_id()[:6]}")
    store = DeliveryStore(pool, claim_s=30)
    redeliveries = DeliveryLog(pool)
    seen = Observed(pool)
    ends = [DeliveryStatus.DELIVERED, DeliveryStatus.REFUSED, DeliveryStatus.FAILED]
    for end in ends:
        for lost in (False, True):  # ended by the holder while posting, or once unknown
            batch_id = await new_job(pool, workspace)
            claim = Claim(batch_id, 1)
            await seen.delivery(batch_id, store.claim(batch_id, HOOK, f"msg_{batch_id}"))
            await seen.delivery(batch_id, store.start_post(claim))
            if lost:
                await expire_delivery_claim(pool, batch_id)
                await seen.delivery(batch_id, store.mark_unknown())
                assert await delivery_status(pool, batch_id) == DeliveryStatus.UNKNOWN
            await seen.delivery(batch_id, store.finish(claim, end, None, None))
            assert not await store.finish(claim, DeliveryStatus.DELIVERED, 204, None)
            assert await delivery_status(pool, batch_id) == end
            job = await store.job(batch_id)
            assert job is not None
            # A redelivery asked for re-arms however it ended (once the last attempt
            # ended 10 s ago); due now, it is claimed.
            await pool.execute(
                "UPDATE webhook_deliveries SET finished_at = now() - interval '11s'"
                " WHERE batch_id = $1",
                batch_id,
            )
            await seen.delivery(batch_id, redeliveries.request_redelivery(job))
            assert await delivery_status(pool, batch_id) == DeliveryStatus.RETRYING
            await seen.delivery(batch_id, store.claim_deferred(batch_id))
            assert await delivery_status(pool, batch_id) == DeliveryStatus.SENDING
    unknown = await new_job(pool, workspace)
    await store.claim(unknown, HOOK, f"msg_{unknown}")
    await store.start_post(Claim(unknown, 1))
    await expire_delivery_claim(pool, unknown)
    await store.mark_unknown()
    unknown_job = await store.job(unknown)
    assert unknown_job is not None
    await seen.delivery(unknown, redeliveries.request_redelivery(unknown_job))
    assert await delivery_status(pool, unknown) == DeliveryStatus.RETRYING
    # An automatic retry: scheduled by the holder, given up once its 24 h are over.
    retried = await new_job(pool, workspace)
    await store.claim(retried, HOOK, f"msg_{retried}")
    await store.start_post(Claim(retried, 1))
    finish = store.finish(Claim(retried, 1), DeliveryStatus.RETRYING, 500, None, retry_in_s=0)
    await seen.delivery(retried, finish)
    await pool.execute(
        "UPDATE webhook_deliveries SET retry_until = now() - interval '1s' WHERE batch_id = $1",
        retried,
    )
    await seen.delivery(retried, store.reclaim_expired())
    assert await delivery_status(pool, retried) == DeliveryStatus.FAILED
    gone = await new_job(pool, workspace)
    await store.claim(gone, HOOK, f"msg_{gone}")
    await seen.delivery(gone, store.finish(Claim(gone, 1), DeliveryStatus.FAILED, None, "gone"))
    hopeless = await new_job(pool, workspace)
    await store.claim(hopeless, HOOK, f"msg_{hopeless}")
    await pool.execute(
        "UPDATE webhook_deliveries SET claims = $2 WHERE batch_id = $1", hopeless, MAX_CLAIMS
    )
    await expire_delivery_claim(pool, hopeless)
    await seen.delivery(hopeless, store.reclaim_expired())
    assert await delivery_status(pool, hopeless) == DeliveryStatus.FAILED

    initial = {(None, s.value) for s in DELIVERY_INITIAL}
    assert seen.deliveries == initial | table_pairs(DELIVERY_STATUS_TRANSITIONS)
    # Claimed or due deliveries left here would be POSTed by another test's passes.
    await pool.execute(
        "DELETE FROM webhook_deliveries WHERE batch_id IN"
        " (SELECT id FROM batches WHERE workspace_id = $1)",
        workspace,
    )


async def check_values(pool: asyncpg.Pool, table: str) -> list[str]:
    """The values the live database's CHECK on ``table.status`` allows."""
    definition = await pool.fetchval(
        "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c"
        " WHERE c.conrelid = $1::regclass AND c.contype = 'c'"
        " AND pg_get_constraintdef(c.oid) LIKE '%status%'",
        table,
    )
    assert definition is not None
    # e.g. CHECK ((status = ANY (ARRAY['queued'::text, 'scheduled'::text, ...])))
    return [part.split("'")[1] for part in definition.split("ARRAY[")[1].split(",")]


async def test_the_database_checks_exactly_the_enum_values(pool: asyncpg.Pool) -> None:
    assert sorted(await check_values(pool, "batches")) == sorted(JobStatus)
    assert sorted(await check_values(pool, "webhook_deliveries")) == sorted(DeliveryStatus)


async def test_the_database_refuses_a_status_outside_the_enums(pool: asyncpg.Pool) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"st-{new_id()[:6]}")
    batch_id = await new_job(pool, workspace)
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute("UPDATE batches SET status = 'sleeping' WHERE id = $1", batch_id)
    await DeliveryStore(pool).claim(batch_id, HOOK, f"msg_{batch_id}")
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute(
            "UPDATE webhook_deliveries SET status = 'bounced' WHERE batch_id = $1", batch_id
        )
    assert await job_status(pool, batch_id) == "queued"
    assert await delivery_status(pool, batch_id) == "sending"
    await JobStore(pool).cancel(workspace, batch_id)


async def test_the_status_migration_runs_again_on_a_database_with_data(
    pool: asyncpg.Pool,
) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"st-{new_id()[:6]}")
    batch_id = await new_job(pool, workspace)
    await DeliveryStore(pool).claim(batch_id, HOOK, f"msg_{batch_id}")
    # Every migration that sets the delivery status CHECK, again, in order.
    again = [sql for name, sql in migration_files() if name[:4] in ("0006", "0015")]
    assert len(again) == 2
    async with pool.acquire() as conn, conn.transaction():
        assert await conn.fetchval("SELECT count(*) FROM webhook_deliveries") > 0
        for sql in again:
            await conn.execute(sql)
    assert sorted(await check_values(pool, "webhook_deliveries")) == sorted(DeliveryStatus)
    assert await delivery_status(pool, batch_id) == "sending"
    await JobStore(pool).cancel(workspace, batch_id)


async def allowed_moves(pool: asyncpg.Pool, table: str) -> set[tuple[str, str]]:
    """The ``(from, to)`` pairs a transitions table of migration 0008 allows."""
    rows = await pool.fetch(f"SELECT from_status, to_status FROM {table}")
    return {(r["from_status"], r["to_status"]) for r in rows}


def moves(transitions: Mapping[S, frozenset[S]]) -> set[tuple[str, str]]:
    return {(str(a), str(b)) for a, targets in transitions.items() for b in targets}


async def test_the_database_allows_exactly_the_transitions_of_the_model(
    pool: asyncpg.Pool,
) -> None:
    jobs = await allowed_moves(pool, "job_status_transitions")
    assert jobs == moves(JOB_STATUS_TRANSITIONS)
    deliveries = await allowed_moves(pool, "delivery_status_transitions")
    assert deliveries == moves(DELIVERY_STATUS_TRANSITIONS)


async def test_the_database_refuses_a_move_the_model_forbids(pool: asyncpg.Pool) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"st-{new_id()[:6]}")
    batch_id = await new_job(pool, workspace)
    await JobStore(pool).cancel(workspace, batch_id)
    for back in ("queued", "running", "completed"):
        with pytest.raises(asyncpg.CheckViolationError, match="may not move from canceled"):
            await pool.execute("UPDATE batches SET status = $2 WHERE id = $1", batch_id, back)
    # Setting the status it already has is no move: allowed, and nothing changes.
    await pool.execute("UPDATE batches SET status = 'canceled' WHERE id = $1", batch_id)
    assert await job_status(pool, batch_id) == "canceled"
    await DeliveryStore(pool).claim(batch_id, HOOK, f"msg_{batch_id}")
    with pytest.raises(asyncpg.CheckViolationError, match="may not move from sending"):
        await pool.execute(
            "UPDATE webhook_deliveries SET status = 'delivered' WHERE batch_id = $1", batch_id
        )
    assert await delivery_status(pool, batch_id) == "sending"
