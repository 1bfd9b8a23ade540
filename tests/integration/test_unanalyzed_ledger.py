"""A dispatcher on a ledger whose row tables have no statistics of the running job.

Each case is a database of its own: one where nothing was ever analyzed, or a big old
one analyzed while it held only an earlier job (so its statistics know nothing of the
running job's rows and outcomes: autoanalyze of a big table waits for a tenth of it to
change). It holds a running job of 200,000 rows whose dispatcher died after releasing
some (120,000, or 1,024 early in the job), a few of them lost (no outcome), the others
answered. A real dispatcher takes the job over, tops its window up (the byte window
reads every released row), recovers the lost rows (stall recovery reads the first
unfinished row, the unfinished indexes and their requests) and the aggregator records
their outcomes: each step well under a second here. Before the reads were shaped so
that no plan can go wrong, the takeover's release ran into the database's 10 s
statement timeout (a nested loop over the released outcomes, planned from estimates of
a few dozen rows), and so did stall recovery early in the job (the walk to the first
unfinished row: 15 s).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

import asyncpg
import pytest

from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.ledger.pool import create_pool
from relay_batches.messages import JobEvent, RowOutcome, SliceMessage
from relay_batches.services.dispatcher.core import DispatchConfig, Dispatcher
from tests.helpers.support import create_isolation, drop_isolation

ROWS = 200_000
WINDOW, SLICE = 1024, 64
STEP_BOUND_S = 3.0  # each step: well under a second here, 10 s (the timeout) before
ROW_TABLES = ("batch_rows", "row_results")


async def store_job(
    conn: asyncpg.Connection, rows: int, released: int, lost: list[int], status: str = "running"
) -> str:
    """A job of ``rows`` rows whose dead dispatcher (lease expired an hour ago) released
    ``released`` of them; all released rows but ``lost`` have an outcome. Set based, as a
    bulk upload stores rows."""
    job, workspace = new_id(), new_id()
    await conn.execute("INSERT INTO workspaces (id, name) VALUES ($1, $1)", workspace)
    done = released - len(lost)
    await conn.execute(
        "INSERT INTO batches (id, workspace_id, name, model, status, total, rows_batch_id,"
        " dispatched_upto, completed, lease_owner, lease_expires_at, started_at,"
        " last_progress_at) VALUES ($1, $2, 'big', 'gpt-4o-mini', $6, $3, $1, $4, $5,"
        " 'dispatcher-dead', now() - interval '1 hour', now() - interval '2 hours',"
        " now() - interval '1 hour')",
        job,
        workspace,
        rows,
        released,
        done,
        status,
    )
    await conn.execute(
        "INSERT INTO batch_rows (batch_id, row_index, custom_id, request)"
        ' SELECT $1, i, \'c-\' || i, \'[{"role":"user","content":"row \' || i || \' \''
        " || repeat('x', 120) || '\"}]' FROM generate_series(0, $2 - 1) AS i",
        job,
        rows,
    )
    await conn.execute(
        "INSERT INTO row_results (batch_id, row_index, content, attempts)"
        " SELECT $1, i, 'ok', 1 FROM generate_series(0, $2 - 1) AS i"
        " WHERE i <> ALL($3::int[])",
        job,
        released,
        lost,
    )
    return job


@dataclass(frozen=True)
class Case:
    """A ledger's statistics and how far its job got."""

    analyzed_before: bool  # an earlier job stored and analyzed before this one
    released: int
    lost_every: int  # every this many released rows one has no outcome (the last)

    @property
    def lost(self) -> list[int]:
        """The released rows without an outcome."""
        return list(range(self.lost_every - 1, self.released, self.lost_every))


CASES = {
    "never_analyzed": Case(False, 120_000, 1000),
    "analyzed_before_the_job": Case(True, 120_000, 1000),
    "never_analyzed_early_in_the_job": Case(False, 1024, 50),
}


@pytest.fixture(params=list(CASES))
async def ledger(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[asyncpg.Pool, str, Case]]:
    """A pool on a ledger of its own holding the job (see the module), its id and case."""
    case = CASES[request.param]
    iso = await create_isolation("unanalyzed")
    conn = await asyncpg.connect(iso.database_url)
    try:
        await conn.execute(f'ALTER DATABASE "{iso.database}" SET statement_timeout = 10000')
        for table in ROW_TABLES:
            await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        if case.analyzed_before:
            # An earlier job of 100,000 rows, finished, and the statistics taken then.
            await store_job(conn, 100_000, 100_000, [], "completed")
            for table in ROW_TABLES:
                await conn.execute(f"ANALYZE {table}")
        job = await store_job(conn, ROWS, case.released, case.lost)
    finally:
        await conn.close()
    pool = await create_pool(iso.database_url, max_size=4)
    try:
        yield pool, job, case
    finally:
        await pool.close()
        await drop_isolation(iso)


class Published:
    """The rows a dispatcher published."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    async def publish(self, task: SliceMessage, priority: int) -> None:
        self.rows.extend(r.index for r in task.rows)

    async def announce(self, event: JobEvent) -> None:
        raise AssertionError(f"unexpected job failure {event}")


async def timed(what: str, step: Awaitable[object]) -> float:
    """Await ``step``; its seconds, insisting on the bound."""
    started = time.perf_counter()
    await step
    seconds = time.perf_counter() - started
    assert seconds < STEP_BOUND_S, f"{what} took {seconds:.1f} s"
    return seconds


async def test_takeover_release_recovery_and_recording_run_at_pipeline_speed(
    ledger: tuple[asyncpg.Pool, str, Case],
) -> None:
    pool, job, case = ledger
    released_upto, lost = case.released, case.lost
    published = Published()
    config = DispatchConfig("dispatcher-new", WINDOW, SLICE, 10, lease_s=30, stall_s=60)
    dispatcher = Dispatcher(
        DispatchStore(pool), published.publish, published.announce, lambda _: True, config
    )
    # Takeover and release: the byte window reads all the released rows.
    await timed("the takeover's release", dispatcher.claim())
    assert list(dispatcher.jobs) == [job]
    released = published.rows
    assert released and released == list(range(released_upto, released_upto + len(released)))
    assert len(released) <= WINDOW - len(lost) + SLICE

    # Stall recovery: the first unfinished row, the unfinished ones, their requests.
    await pool.execute(
        "UPDATE batches SET last_progress_at = now() - interval '1 hour' WHERE id = $1", job
    )
    published.rows = []
    await timed("stall recovery", dispatcher.recover_stalled())
    assert published.rows[: len(lost)] == lost
    assert set(published.rows[len(lost) :]) <= set(range(released_upto, ROWS))  # the top-up

    # Recording the lost rows' outcomes.
    outcomes = [RowOutcome(job, i, "ok", None, 1) for i in lost]
    await timed("recording", OutcomeStore(pool).record(outcomes))
    completed = await pool.fetchval("SELECT completed FROM batches WHERE id = $1", job)
    assert completed == released_upto

    # The row tables hold no statistics of this job: nothing analyzed them meanwhile.
    analyzed = await pool.fetchval(
        "SELECT count(*) FROM pg_stats WHERE tablename = ANY($1::text[])"
        " AND attname = 'batch_id' AND $2 = ANY(most_common_vals::text::text[])",
        list(ROW_TABLES),
        job,
    )
    assert analyzed == 0
