"""Controls on rows not yet started, against the real ledger: a pause counts itself (the
slices of the job's next release carry the count); the rows a row-worker hands back are
recorded once (released, without an outcome, of a live job only), are never lost to
stall recovery, and go out again once, first, when the job's dispatcher has it running;
rows a worker withheld from a budget-stopped job end it ``failed`` with
``budget_exceeded``, and the chunk whose cost reached the budget says so once."""

from __future__ import annotations

import asyncpg

from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.messages import RowOutcome
from relay_batches.model import BUDGET_HELD_ERROR
from tests.integration.test_budget import OWNER, answer, job, results, running_job, settle_all


async def workspace_of(pool: asyncpg.Pool, batch_id: str) -> str:
    return str(await pool.fetchval("SELECT workspace_id FROM batches WHERE id = $1", batch_id))


async def test_rows_handed_back_on_a_pause_go_out_again_once_after_the_resume(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await running_job(pool, 10, released=8)
    jobs, store, dispatch = JobStore(pool), OutcomeStore(pool), DispatchStore(pool)
    await store.record([answer(batch_id, 0, None), answer(batch_id, 1, None)])
    workspace = await workspace_of(pool, batch_id)

    paused = await jobs.pause(workspace, batch_id)
    assert paused.pauses == 1
    # rows 4..7 handed back; 1 has an outcome and 9 was never released: neither is kept
    handed = [(batch_id, i, 0) for i in (1, 4, 5, 6, 7, 9)]
    assert await store.record_returned(handed) == 4
    assert await store.record_returned(handed) == 0  # a redelivered hand-back
    # not ours while paused: nothing is taken
    assert await dispatch.take_returned(OWNER, batch_id) == []

    await jobs.resume(workspace, batch_id)
    [claimed] = [j for j in await dispatch.claim_queued(OWNER, 100, 30) if j.id == batch_id]
    assert (claimed.pauses, claimed.returned, claimed.dispatched_upto) == (1, True, 8)
    # stall recovery counts rows 2 and 3 (out, no outcome) lost, never the handed back
    assert await dispatch.unfinished_rows(batch_id, 0, 8) == [2, 3]

    taken = await dispatch.take_returned(OWNER, batch_id)
    assert [i for i, _ in taken] == [4, 5, 6, 7]
    assert all(request.startswith("[") for _, request in taken)
    assert await dispatch.take_returned(OWNER, batch_id) == []
    [renewed] = await dispatch.renew(OWNER, [batch_id], 30)
    assert renewed.returned is False
    assert await dispatch.unfinished_rows(batch_id, 0, 8) == [2, 3, 4, 5, 6, 7]
    # the hand-back delivered again once they went out again: nothing goes out twice
    assert await store.record_returned(handed) == 0
    [renewed] = await dispatch.renew(OWNER, [batch_id], 30)
    assert renewed.returned is False

    # a second pause hands row 4 back from the release after the first: it goes out again
    await jobs.pause(workspace, batch_id)
    assert await store.record_returned([(batch_id, 4, 1)]) == 1
    await jobs.resume(workspace, batch_id)
    [claimed] = [j for j in await dispatch.claim_queued(OWNER, 100, 30) if j.id == batch_id]
    assert (claimed.pauses, claimed.returned) == (2, True)
    assert [i for i, _ in await dispatch.take_returned(OWNER, batch_id)] == [4]


async def test_rows_of_an_ended_job_are_not_kept(pool: asyncpg.Pool) -> None:
    batch_id = await running_job(pool, 4, released=4)
    await JobStore(pool).cancel(await workspace_of(pool, batch_id), batch_id)
    assert await OutcomeStore(pool).record_returned([(batch_id, 2, 0)]) == 0


async def test_withheld_rows_end_a_budget_stopped_job_failed(pool: asyncpg.Pool) -> None:
    batch_id = await running_job(pool, 6, budget_usd=1.0, released=6)
    store = OutcomeStore(pool)

    [under] = await store.record([answer(batch_id, 0, 0.5)])
    [tripped] = await store.record([answer(batch_id, 1, 0.5), answer(batch_id, 2, 0.5)])
    [again] = await store.record([answer(batch_id, 3, 0.5)])
    assert (under.budget_stopped, tripped.budget_stopped, again.budget_stopped) == (
        False,
        True,
        True,
    )

    held = [RowOutcome(batch_id, i, None, BUDGET_HELD_ERROR, 0) for i in (4, 5)]
    [ended] = await store.record(held)

    assert (ended.status, ended.completed, ended.failed) == ("failed", 4, 2)
    stored = await job(pool, batch_id)
    assert stored.error is not None and stored.error.startswith("budget_exceeded")
    assert "not yet started" in stored.error
    assert (await results(pool, batch_id))[5] == (BUDGET_HELD_ERROR, 0)


async def test_rows_handed_back_of_a_job_its_budget_stopped_while_paused_are_settled(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await running_job(pool, 4, budget_usd=1.0, released=4)
    jobs, store = JobStore(pool), OutcomeStore(pool)
    await jobs.pause(await workspace_of(pool, batch_id), batch_id)
    assert await store.record_returned([(batch_id, 2, 0), (batch_id, 3, 0)]) == 2

    # the rows started before the pause reach the budget while the job is paused
    [stopped] = await store.record([answer(batch_id, 0, 0.5), answer(batch_id, 1, 0.5)])
    assert (stopped.status, stopped.budget_stopped) == ("paused", True)
    [settled] = [step for step in await settle_all(store) if step.id == batch_id]

    assert (settled.id, settled.status, settled.failed, settled.new_failed) == (
        batch_id,
        "failed",
        2,
        2,
    )
    assert {i for i, (error, _) in (await results(pool, batch_id)).items() if error} == {2, 3}
    assert [step for step in await settle_all(store) if step.id == batch_id] == []
