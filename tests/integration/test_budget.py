"""A job's cost, budget and rate against the real ledger: the aggregator's outcome insert
sums each row's cost once, trips the budget (rows not yet released get
``budget_exceeded``, rows in flight still count) and measures the job's recent rate."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outcomes import BUDGET_ROW_ERROR, OutcomeStore
from relay_batches.messages import RowOutcome
from relay_batches.model import RATE_WINDOW_S, Job

OWNER = "budget-test"


async def running_job(
    pool: asyncpg.Pool, total: int, budget_usd: float | None = None, released: int = 0
) -> str:
    """A running job of ``total`` rows whose first ``released`` rows are published."""
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


async def test_a_trip_withholds_exactly_the_unreleased_rows_and_in_flight_rows_still_count(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await running_job(pool, 10, budget_usd=1.0, released=4)
    store = OutcomeStore(pool)

    under = await store.record([answer(batch_id, 0, 0.5)])
    assert [(p.status, p.new_completed, p.new_failed) for p in under] == [("running", 1, 0)]
    assert (await job(pool, batch_id)).budget_exceeded_at is None

    (tripped,) = await store.record([answer(batch_id, 1, 0.5)])
    assert (tripped.status, tripped.completed, tripped.failed) == ("running", 2, 6)
    assert (tripped.new_completed, tripped.new_failed) == (1, 6)
    withheld = {i: (BUDGET_ROW_ERROR, 0) for i in range(4, 10)}
    assert await results(pool, batch_id) == {0: (None, 1), 1: (None, 1), **withheld}
    live = await job(pool, batch_id)
    assert live.budget_exceeded_at is not None
    assert live.error is not None and live.error.startswith("budget_exceeded")
    assert live.cost_usd == 1.0
    # no dispatcher releases a withheld row; rows 2 and 3 are in flight
    assert await DispatchStore(pool).fetch_rows(batch_id, batch_id, 4, 10) == []

    (more,) = await store.record([answer(batch_id, 2, 0.75)])
    assert (more.status, more.failed) == ("running", 6)  # a second trip withholds nothing
    (last,) = await store.record([failure(batch_id, 3)])
    assert last.terminal and last.status == "failed"
    ended = await job(pool, batch_id)
    assert (ended.status, ended.completed, ended.failed) == ("failed", 3, 7)
    assert ended.cost_usd == 1.75  # the rows in flight count
    assert ended.completed_at is not None and ended.error == live.error
    assert BUDGET_ROW_ERROR.startswith("budget_exceeded")


async def test_a_trip_with_nothing_in_flight_fails_the_job_at_once(pool: asyncpg.Pool) -> None:
    batch_id = await running_job(pool, 6, budget_usd=0.5, released=2)
    (tripped,) = await OutcomeStore(pool).record(
        [answer(batch_id, 0, 0.25), answer(batch_id, 1, 0.25)]
    )
    assert tripped.terminal
    assert (tripped.status, tripped.completed, tripped.failed) == ("failed", 2, 4)
    assert (tripped.new_completed, tripped.new_failed) == (2, 4)
    ended = await job(pool, batch_id)
    assert ended.status == "failed" and ended.completed_at is not None
    assert ended.error is not None and ended.error.startswith("budget_exceeded")


async def test_a_trip_once_every_row_is_released_withholds_none_and_the_job_completes(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await running_job(pool, 3, budget_usd=0.5, released=3)
    store = OutcomeStore(pool)
    (tripped,) = await store.record([answer(batch_id, 0, 2.0)])
    assert (tripped.status, tripped.failed) == ("running", 0)
    assert (await job(pool, batch_id)).budget_exceeded_at is not None
    (ended,) = await store.record([answer(batch_id, 1, 1.0), failure(batch_id, 2)])
    assert (ended.status, ended.completed, ended.failed) == ("completed", 2, 1)
    done = await job(pool, batch_id)
    assert (done.error, done.cost_usd) == (None, 3.0)


async def test_the_chunk_that_ends_the_job_is_no_trip(pool: asyncpg.Pool) -> None:
    batch_id = await running_job(pool, 2, budget_usd=0.5, released=2)
    (ended,) = await OutcomeStore(pool).record([answer(batch_id, 0, 1.0), answer(batch_id, 1, 1.0)])
    assert ended.status == "completed"
    done = await job(pool, batch_id)
    assert (done.error, done.budget_exceeded_at, done.cost_usd) == (None, None, 2.0)


@pytest.mark.parametrize("in_flight", [True, False])
async def test_a_trip_on_a_paused_job(pool: asyncpg.Pool, in_flight: bool) -> None:
    """A paused job's rows already released still finish and count: one reaching the
    budget withholds the rest, and the job fails once nothing is in flight."""
    batch_id = await running_job(pool, 8, budget_usd=1.0, released=3 if in_flight else 2)
    await pool.execute(
        "UPDATE batches SET status = 'paused', lease_owner = NULL WHERE id = $1", batch_id
    )
    store = OutcomeStore(pool)
    (tripped,) = await store.record([answer(batch_id, 0, 0.5), answer(batch_id, 1, 0.5)])
    withheld = {i: (BUDGET_ROW_ERROR, 0) for i in range(3 if in_flight else 2, 8)}
    assert await results(pool, batch_id) == {0: (None, 1), 1: (None, 1), **withheld}
    if in_flight:
        assert (tripped.status, tripped.failed) == ("paused", 5)
        (tripped,) = await store.record([answer(batch_id, 2, 0.5)])
    assert tripped.status == "failed"
    ended = await job(pool, batch_id)
    assert ended.error is not None and ended.error.startswith("budget_exceeded")
    assert ended.cost_usd == (1.5 if in_flight else 1.0)
    assert ended.completed + ended.failed == 8


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
    assert rate == closed.rate_rows_per_s
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
