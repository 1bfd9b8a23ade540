"""A job's cost, budget and rate against the real ledger: the aggregator's outcome insert
sums each row's cost once, stops the job at its budget (no row is released after; the
rows in flight still count) and measures the job's recent rate; the budget settle gives
the rows never released ``budget_exceeded`` in bounded steps."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from relay_batches.bus.topology import EVENT_FINISHED, progress_key
from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outcomes import BUDGET_ROW_ERROR, JobProgress, OutcomeStore
from relay_batches.messages import JobEvent, RowOutcome
from relay_batches.model import RATE_DIGITS, RATE_WINDOW_S, Job, shown
from relay_batches.services.aggregator.core import Aggregator

OWNER = "budget-test"


async def running_job(
    pool: asyncpg.Pool, total: int, budget_usd: float | None = None, released: int = 0
) -> str:
    """A running job of ``total`` rows (its own workspace) whose first ``released`` rows
    are released."""
    workspace = await KeyStore(pool).ensure_workspace(f"cost-{new_id()[:6]}")
    batch = await JobStore(pool).create(
        NewJob(
            new_id(),
            workspace,
            "cost",
            "gpt-4o-mini",
            0,
            total,
            None,
            None,
            None,
            budget_usd=budget_usd,
        ),
        ((f"c-{i}", '[{"role":"user","content":"x"}]') for i in range(total)),
    )
    dispatch = DispatchStore(pool)
    claimed = await dispatch.claim_queued(OWNER, 1000, 30)
    assert batch.id in {job.id for job in claimed}
    if released:
        assert await dispatch.advance(OWNER, batch.id, released)
    return batch.id


def answer(batch_id: str, index: int, cost: float | None) -> RowOutcome:
    return RowOutcome(batch_id, index, "ok", None, attempts=1, deployment="d", cost_usd=cost)


def failure(batch_id: str, index: int) -> RowOutcome:
    return RowOutcome(batch_id, index, None, "upstream_error: boom", attempts=4)


async def job(pool: asyncpg.Pool, batch_id: str) -> Job:
    record = await pool.fetchrow("SELECT * FROM batches WHERE id = $1", batch_id)
    return Job.from_record(record)


async def settle_all(store: OutcomeStore, step_rows: int = 10_000) -> list[JobProgress]:
    """Budget settle steps until none is left (of any job of the session's database)."""
    steps: list[JobProgress] = []
    while moved := await store.settle_budget_stops(step_rows):
        steps += moved
    return steps


def of(steps: list[JobProgress], batch_id: str) -> list[tuple[str, int, int]]:
    """(status, failed, new_failed) of each settle step of ``batch_id``."""
    return [(p.status, p.failed, p.new_failed) for p in steps if p.id == batch_id]


async def results(pool: asyncpg.Pool, batch_id: str) -> dict[int, tuple[str | None, int]]:
    """row index -> (error, attempts) of every stored outcome."""
    records = await pool.fetch(
        "SELECT row_index, error, attempts FROM row_results WHERE batch_id = $1", batch_id
    )
    return {r[0]: (r[1], r[2]) for r in records}


async def test_cost_is_the_exact_sum_of_the_rows_costs_and_a_redelivery_adds_none(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await running_job(pool, 5)
    store = OutcomeStore(pool)
    # binary fractions: their sum is exact in any order
    await store.record([answer(batch_id, 0, 0.125), answer(batch_id, 1, 0.25)])
    await store.record([answer(batch_id, 1, 8.0), answer(batch_id, 2, None), failure(batch_id, 3)])
    await store.record([answer(batch_id, 0, 4.0), answer(batch_id, 4, 0.0078125)])

    ended = await job(pool, batch_id)
    assert (ended.status, ended.completed, ended.failed) == ("completed", 4, 1)
    assert ended.cost_usd == 0.125 + 0.25 + 0.0078125
    stored = await pool.fetchval(
        "SELECT sum(cost_usd) FROM row_results WHERE batch_id = $1", batch_id
    )
    assert ended.cost_usd == stored
    assert ended.to_api()["cost_usd"] == 0.3828125
    assert ended.webhook_body()["cost_usd"] == 0.3828125
    assert (ended.budget_usd, ended.budget_exceeded_at, ended.error) == (None, None, None)


async def test_latency_and_cost_are_stored_per_row(pool: asyncpg.Pool) -> None:
    batch_id = await running_job(pool, 2)
    timed = RowOutcome(batch_id, 0, "ok", None, 1, latency_ms=250, cost_usd=0.5)
    await OutcomeStore(pool).record([timed, failure(batch_id, 1)])
    rows = await pool.fetch(
        "SELECT latency_ms, cost_usd FROM row_results WHERE batch_id = $1 ORDER BY row_index",
        batch_id,
    )
    assert [tuple(r) for r in rows] == [(250, 0.5), (None, None)]


async def test_a_stop_releases_no_more_rows_and_the_chunk_inserts_none(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await running_job(pool, 10, budget_usd=1.0, released=4)
    store, dispatch = OutcomeStore(pool), DispatchStore(pool)

    under = await store.record([answer(batch_id, 0, 0.5)])
    assert [(p.status, p.new_completed, p.new_failed) for p in under] == [("running", 1, 0)]
    assert (await job(pool, batch_id)).budget_exceeded_at is None

    (tripped,) = await store.record([answer(batch_id, 1, 0.5)])
    assert (tripped.status, tripped.completed, tripped.failed) == ("running", 2, 0)
    assert (tripped.new_completed, tripped.new_failed) == (1, 0)
    # the chunk's transaction only marked the stop: no row but the chunk's was inserted
    assert await results(pool, batch_id) == {0: (None, 1), 1: (None, 1)}
    live = await job(pool, batch_id)
    assert live.budget_exceeded_at is not None and live.error is None
    assert live.cost_usd == 1.0
    # no row is released after the stop, by the owner or anyone
    assert not await dispatch.advance(OWNER, batch_id, 8)
    assert await pool.fetchval("SELECT dispatched_upto FROM batches WHERE id = $1", batch_id) == 4


async def test_the_settle_withholds_exactly_the_unreleased_rows_and_in_flight_rows_still_count(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await running_job(pool, 10, budget_usd=1.0, released=4)
    store = OutcomeStore(pool)
    await store.record([answer(batch_id, 0, 0.5), answer(batch_id, 1, 0.5)])  # the stop

    assert of(await settle_all(store), batch_id) == [("running", 6, 6)]
    withheld = {i: (BUDGET_ROW_ERROR, 0) for i in range(4, 10)}
    assert await results(pool, batch_id) == {0: (None, 1), 1: (None, 1), **withheld}
    live = await job(pool, batch_id)
    assert (live.status, live.completed, live.failed) == ("running", 2, 6)
    assert live.error is not None and live.error.startswith("budget_exceeded")
    assert await pool.fetchval("SELECT dispatched_upto FROM batches WHERE id = $1", batch_id) == 10
    assert of(await settle_all(store), batch_id) == [], "settled once"

    # rows 2 and 3 were in flight: they finish and count, and the last one ends the job
    (more,) = await store.record([answer(batch_id, 2, 0.75)])
    assert (more.status, more.failed) == ("running", 6)
    (last,) = await store.record([failure(batch_id, 3)])
    assert last.terminal and last.status == "failed"
    ended = await job(pool, batch_id)
    assert (ended.status, ended.completed, ended.failed) == ("failed", 3, 7)
    assert ended.cost_usd == 1.75
    assert ended.completed_at is not None and ended.error == live.error
    assert BUDGET_ROW_ERROR.startswith("budget_exceeded")


async def test_a_job_bigger_than_a_step_is_settled_in_several_short_steps(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await running_job(pool, 10, budget_usd=0.5, released=3)
    store = OutcomeStore(pool)
    await store.record([answer(batch_id, 0, 0.5)])  # the stop; rows 1 and 2 in flight
    assert of(await settle_all(store, step_rows=3), batch_id) == [
        ("running", 3, 3),
        ("running", 6, 3),
        ("running", 7, 1),
    ]
    assert sorted(await results(pool, batch_id)) == [0, *range(3, 10)]
    (ended,) = await store.record([answer(batch_id, 1, 0.1), answer(batch_id, 2, 0.1)])
    assert (ended.status, ended.completed, ended.failed) == ("failed", 3, 7)


async def test_concurrent_settles_never_count_a_row_twice(pool: asyncpg.Pool) -> None:
    jobs = [await running_job(pool, 23, budget_usd=0.5, released=1) for _ in range(3)]
    store = OutcomeStore(pool)
    for batch_id in jobs:
        await store.record([answer(batch_id, 0, 1.0)])  # stopped, nothing in flight

    async def drain() -> list[JobProgress]:
        return await settle_all(store, step_rows=4)

    steps = [p for done in await asyncio.gather(*(drain() for _ in range(4))) for p in done]
    for batch_id in jobs:
        assert sum(new for _, _, new in of(steps, batch_id)) == 22
        ended = await job(pool, batch_id)
        assert (ended.status, ended.completed, ended.failed) == ("failed", 1, 22)
        assert len(await results(pool, batch_id)) == 23
    assert await store.settle_budget_stops(4) == []


async def test_a_settle_with_nothing_in_flight_fails_the_job_and_announces_it(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await running_job(pool, 6, budget_usd=0.5, released=2)
    published: list[tuple[str, JobEvent]] = []

    async def publish(kind: str, body: bytes) -> None:
        published.append((kind, JobEvent.decode(body)))

    aggregator = Aggregator(OutcomeStore(pool), publish)
    (tripped,) = await aggregator.record([answer(batch_id, 0, 0.25), answer(batch_id, 1, 0.25)])
    assert (tripped.status, tripped.completed, tripped.failed) == ("running", 2, 0)
    published.clear()

    await aggregator.outbox_pass(60.0)  # the aggregator's periodic pass
    ours = [
        (kind, e.status, e.completed, e.failed) for kind, e in published if e.batch_id == batch_id
    ]
    assert ours == [(progress_key(OWNER), "failed", 2, 4), (EVENT_FINISHED, "failed", 2, 4)]
    ended = await job(pool, batch_id)
    assert ended.status == "failed" and ended.completed_at is not None
    assert ended.error is not None and ended.error.startswith("budget_exceeded")
    assert await pool.fetchval("SELECT finished_published FROM batches WHERE id = $1", batch_id)


async def test_a_stop_once_every_row_is_released_withholds_none_and_the_job_completes(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await running_job(pool, 3, budget_usd=0.5, released=3)
    store = OutcomeStore(pool)
    (tripped,) = await store.record([answer(batch_id, 0, 2.0)])
    assert (tripped.status, tripped.failed) == ("running", 0)
    assert (await job(pool, batch_id)).budget_exceeded_at is not None
    assert of(await settle_all(store), batch_id) == []
    (ended,) = await store.record([answer(batch_id, 1, 1.0), failure(batch_id, 2)])
    assert (ended.status, ended.completed, ended.failed) == ("completed", 2, 1)
    done = await job(pool, batch_id)
    assert (done.error, done.cost_usd) == (None, 3.0)


async def test_the_chunk_that_ends_the_job_is_no_stop(pool: asyncpg.Pool) -> None:
    batch_id = await running_job(pool, 2, budget_usd=0.5, released=2)
    (ended,) = await OutcomeStore(pool).record([answer(batch_id, 0, 1.0), answer(batch_id, 1, 1.0)])
    assert ended.status == "completed"
    done = await job(pool, batch_id)
    assert (done.error, done.budget_exceeded_at, done.cost_usd) == (None, None, 2.0)


@pytest.mark.parametrize("in_flight", [True, False])
async def test_a_stop_of_a_paused_job(pool: asyncpg.Pool, in_flight: bool) -> None:
    """A paused job's rows already released still finish and count: one reaching the
    budget stops it, the settle withholds the rest, and the job fails (from paused)
    once nothing is in flight."""
    batch_id = await running_job(pool, 8, budget_usd=1.0, released=3 if in_flight else 2)
    workspace = (await job(pool, batch_id)).workspace_id
    await JobStore(pool).pause(workspace, batch_id)
    store = OutcomeStore(pool)
    (tripped,) = await store.record([answer(batch_id, 0, 0.5), answer(batch_id, 1, 0.5)])
    assert (tripped.status, tripped.failed) == ("paused", 0)
    withheld = 5 if in_flight else 6
    status = "paused" if in_flight else "failed"
    assert of(await settle_all(store), batch_id) == [(status, withheld, withheld)]
    expected = {i: (BUDGET_ROW_ERROR, 0) for i in range(8 - withheld, 8)}
    assert await results(pool, batch_id) == {0: (None, 1), 1: (None, 1), **expected}
    if in_flight:
        (last,) = await store.record([answer(batch_id, 2, 0.5)])
        assert last.terminal and last.status == "failed"
    ended = await job(pool, batch_id)
    assert ended.status == "failed"
    assert ended.error is not None and ended.error.startswith("budget_exceeded")
    assert ended.cost_usd == (1.5 if in_flight else 1.0)
    assert ended.completed + ended.failed == 8


async def test_a_stopped_job_is_claimed_only_while_rows_it_released_are_in_flight(
    pool: asyncpg.Pool,
) -> None:
    """No dispatcher releases a row of a stopped job; one takes it over (or claims it
    once resumed) only while rows it released are in flight, so stall recovery can
    re-send those if lost. With none in flight the settle ends it where it is."""
    jobs, dispatch, store = JobStore(pool), DispatchStore(pool), OutcomeStore(pool)
    flying = await running_job(pool, 6, budget_usd=0.5, released=3)  # rows 1, 2 in flight
    idle = await running_job(pool, 6, budget_usd=0.5, released=2)  # nothing in flight
    resumed = await running_job(pool, 6, budget_usd=0.5, released=2)  # paused, resumed
    workspace = (await job(pool, resumed)).workspace_id
    await jobs.pause(workspace, resumed)
    await store.record([answer(flying, 0, 1.0)])
    await store.record([answer(idle, 0, 1.0), answer(idle, 1, 0.0)])
    await store.record([answer(resumed, 0, 1.0), answer(resumed, 1, 0.0)])
    await jobs.resume(workspace, resumed)
    await pool.execute(
        "UPDATE batches SET lease_expires_at = now() - interval '1 second'"
        " WHERE id = ANY($1::text[])",
        [flying, idle],
    )

    taken = {j.id: j for j in await dispatch.claim_expired("other-owner", 1000, 30)}
    assert flying in taken and idle not in taken
    assert taken[flying].budget_stopped
    assert resumed not in {j.id for j in await dispatch.claim_queued("other-owner", 1000, 30)}
    assert not await dispatch.advance("other-owner", flying, 6)

    await settle_all(store)
    assert (await job(pool, idle)).status == "failed"
    assert (await job(pool, resumed)).status == "failed"  # from queued
    assert (await job(pool, flying)).status == "running"
    (ended,) = await store.record([answer(flying, 1, 0.0), answer(flying, 2, 0.0)])
    assert (ended.status, ended.completed, ended.failed) == ("failed", 3, 3)


async def test_the_rate_window_moves_as_outcomes_arrive(pool: asyncpg.Pool) -> None:
    batch_id = await running_job(pool, 100, released=100)
    store = OutcomeStore(pool)

    await store.record([answer(batch_id, i, None) for i in range(10)])
    opened = await job(pool, batch_id)  # started under 5 s ago: the window opens here
    assert opened.rate_window_at is not None
    assert (opened.rate_window_done, opened.rate_rows_per_s) == (10, None)

    await store.record([answer(batch_id, i, None) for i in range(10, 15)])
    within = await job(pool, batch_id)  # the window is still open: nothing moves
    assert (within.rate_window_at, within.rate_window_done) == (opened.rate_window_at, 10)
    assert within.rate_rows_per_s is None

    # the window began 8 s ago: the next chunk closes it
    await pool.execute(
        "UPDATE batches SET rate_window_at = rate_window_at - make_interval(secs => 8)"
        " WHERE id = $1",
        batch_id,
    )
    await store.record([answer(batch_id, i, None) for i in range(15, 20)])
    closed = await job(pool, batch_id)
    assert closed.rate_window_done == 20
    assert closed.rate_window_at is not None and opened.rate_window_at is not None
    assert closed.rate_window_at > opened.rate_window_at
    # 10 rows (10..19) over the window, which lasted 8 s plus the test's own time
    assert closed.rate_rows_per_s is not None and 1.0 < closed.rate_rows_per_s <= 10 / 8
    rate = closed.rows_per_s(closed.rate_window_at + timedelta(seconds=1))
    assert rate == shown(closed.rate_rows_per_s, RATE_DIGITS)  # as the API shows it
    eta = closed.eta_s(closed.rate_window_at + timedelta(seconds=1))
    assert eta is not None and eta >= 80 / (10 / 8)


async def test_a_job_claimed_long_ago_measures_its_first_window_from_its_start(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await running_job(pool, 50, released=50)
    await pool.execute(
        "UPDATE batches SET started_at = now() - make_interval(secs => $2) WHERE id = $1",
        batch_id,
        2 * RATE_WINDOW_S,
    )
    await OutcomeStore(pool).record([answer(batch_id, i, None) for i in range(20)])
    measured = await job(pool, batch_id)
    assert measured.rate_window_done == 20
    assert measured.rate_rows_per_s is not None
    assert 20 / (2 * RATE_WINDOW_S + 5) < measured.rate_rows_per_s <= 20 / (2 * RATE_WINDOW_S)
