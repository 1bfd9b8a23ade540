"""The aggregator's ledger: idempotent outcome inserts, counters, terminal status, the
budget stop and its settle, outbox."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import asyncpg

from relay_batches.errors import UnstorableError
from relay_batches.ledger.outbox import mark_finished_published
from relay_batches.ledger.pool import translated
from relay_batches.ledger.status_sql import status_in
from relay_batches.messages import RowOutcome
from relay_batches.model import (
    BUDGET_HELD_ERROR,
    BUDGET_ROW_ERROR,
    RATE_WINDOW_S,
    STOPPED,
    TERMINAL,
    JobStatus,
    allowed_from,
)

# The error of a job whose budget kept rows from running (rows not yet {what}).
_BUDGET_JOB_ERROR = (
    "'budget_exceeded: the recorded cost reached the budget of '"
    " || b.budget_usd || ' USD; rows not yet {what} were not run'"
)

# $1 batch ids, $2 the statuses a job may complete from: only those accept outcomes,
# and only before their deadline (reaped or not: the reaper may not have run yet).
_LOCK_RUNNING = (
    "SELECT id, total FROM batches WHERE id = ANY($1::text[]) AND status = ANY($2::text[])"
    " AND (expires_at IS NULL OR expires_at > now()) ORDER BY id FOR UPDATE"
)

# Each job's counters come back with the dispatcher that held its lease before this
# update (``moved`` reads the row locked above), so its progress event goes to that
# dispatcher, its end included (an end clears the lease).
# A chunk may hold one row's outcome twice (a redelivery next to its original, or a
# retried publish): the first in the chunk's order is the one stored, whatever order the
# join below reads them in (DISTINCT ON over the input's ordinality).
_RECORD = """
WITH input AS (
    SELECT DISTINCT ON (batch_id, row_index) *
    FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::int[],
                $6::bool[], $7::text[], $8::int[], $9::int[],
                $12::text[], $13::text[], $14::text[], $15::int[],
                $16::float8[], $20::text[], $21::text[], $22::int[], $23::float8[])
            WITH ORDINALITY
        AS t(batch_id, row_index, content, error, attempts, dead_letter, deployment,
             prompt_tokens, completion_tokens, tool_calls, finish_reason, model,
             latency_ms, cost_usd, body, lane, cached_tokens, all_realtime_usd, n)
    ORDER BY batch_id, row_index, n
),
ins AS (
    INSERT INTO row_results (batch_id, row_index, content, error, attempts, dead_letter,
                             deployment, prompt_tokens, completion_tokens, tool_calls,
                             finish_reason, model, latency_ms, cost_usd, body, lane,
                             cached_tokens, all_realtime_usd)
    SELECT i.batch_id, i.row_index, i.content, i.error, i.attempts, i.dead_letter,
           i.deployment, i.prompt_tokens, i.completion_tokens, i.tool_calls,
           i.finish_reason, i.model, i.latency_ms, i.cost_usd, i.body,
           CASE WHEN i.error IS NULL THEN COALESCE(i.lane, 'realtime') END,
           NULLIF(i.cached_tokens, 0), i.all_realtime_usd
    FROM input i JOIN batches b ON b.id = i.batch_id
    WHERE b.id = ANY($10::text[]) AND i.row_index >= 0 AND i.row_index < b.total
    ON CONFLICT (batch_id, row_index) DO NOTHING
    RETURNING batch_id, error IS NULL AS ok, dead_letter, prompt_tokens, completion_tokens,
              cost_usd, error = $19 AS held, lane, cached_tokens, all_realtime_usd
),
counts AS (
    SELECT batch_id,
           count(*) FILTER (WHERE ok) AS ok,
           count(*) FILTER (WHERE NOT ok) AS bad,
           count(*) FILTER (WHERE dead_letter) AS dl,
           sum(prompt_tokens) AS pt,
           sum(completion_tokens) AS ct,
           COALESCE(sum(cost_usd), 0) AS cost,
           COALESCE(sum(cached_tokens), 0) AS cached,
           COALESCE(sum(all_realtime_usd), 0) AS all_realtime,
           count(*) FILTER (WHERE held) AS held,
           COALESCE(sum(cost_usd) FILTER (WHERE lane = 'batch'), 0) AS cost_b,
           COALESCE(sum(cost_usd) FILTER (WHERE lane = 'flex'), 0) AS cost_f,
           COALESCE(sum(cost_usd) FILTER (WHERE lane = 'realtime'), 0) AS cost_r,
           count(*) FILTER (WHERE lane = 'batch') AS rows_b,
           count(*) FILTER (WHERE lane = 'flex') AS rows_f,
           count(*) FILTER (WHERE lane = 'realtime') AS rows_r
    FROM ins GROUP BY batch_id
),
moved AS (
    SELECT c.*, b.lease_owner AS owner, b.completed + c.ok + b.failed + c.bad AS done,
           b.completed + c.ok + b.failed + c.bad >= b.total AS ends,
           COALESCE(b.rate_window_at, b.started_at, now()) AS window_at,
           now() - COALESCE(b.rate_window_at, b.started_at, now())
               >= make_interval(secs => $17) AS window_closes
    FROM counts c JOIN batches b ON b.id = c.batch_id
)
UPDATE batches b SET
    completed = b.completed + c.ok,
    failed = b.failed + c.bad,
    dead_letter = b.dead_letter + c.dl,
    prompt_tokens = b.prompt_tokens + c.pt,
    completion_tokens = b.completion_tokens + c.ct,
    cost_usd = b.cost_usd + c.cost,
    cached_tokens = b.cached_tokens + c.cached,
    all_realtime_usd = b.all_realtime_usd + c.all_realtime,
    cost_batch_usd = b.cost_batch_usd + c.cost_b,
    cost_flex_usd = b.cost_flex_usd + c.cost_f,
    cost_realtime_usd = b.cost_realtime_usd + c.cost_r,
    rows_batch = b.rows_batch + c.rows_b,
    rows_flex = b.rows_flex + c.rows_f,
    rows_realtime = b.rows_realtime + c.rows_r,
    last_progress_at = now(),
    recorded_at = now(),
    rate_rows_per_s = CASE WHEN c.window_closes
        THEN (c.done - b.rate_window_done)
             / GREATEST(extract(epoch FROM now() - c.window_at), 0.001)
        ELSE b.rate_rows_per_s END,
    rate_window_at = CASE WHEN c.window_closes OR b.rate_window_at IS NULL
                          THEN now() ELSE b.rate_window_at END,
    rate_window_done = CASE WHEN c.window_closes OR b.rate_window_at IS NULL
                            THEN c.done ELSE b.rate_window_done END,
    -- The budget stop: from now on no row is released (the dispatcher's advance refuses
    -- the job) and the settle (_SETTLE) gives the rows not released their outcome. The
    -- chunk that ends the job is no stop.
    budget_exceeded_at = CASE WHEN b.budget_exceeded_at IS NULL AND b.budget_usd IS NOT NULL
                                   AND b.cost_usd + c.cost >= b.budget_usd AND NOT c.ends
                              THEN now() ELSE b.budget_exceeded_at END,
    -- A row-worker withheld rows it had not started (their error is $19): the job's
    -- error says so, as the settle's does for rows never released.
    error = CASE WHEN b.error IS NULL AND c.held > 0 THEN {held_error} ELSE b.error END,
    -- A job whose budget stop withheld a row (its error says so) ends failed.
    status = CASE WHEN c.ends AND b.budget_exceeded_at IS NOT NULL
                       AND (b.error IS NOT NULL OR c.held > 0)
                  THEN $18::text
                  WHEN c.ends THEN $11::text ELSE b.status END,
    completed_at = CASE WHEN c.ends THEN now() ELSE b.completed_at END,
    lease_owner = CASE WHEN c.ends THEN NULL ELSE b.lease_owner END
FROM moved c WHERE b.id = c.batch_id
RETURNING b.id, b.status, b.total, b.completed, b.failed, c.ok, c.bad, c.owner,
          b.budget_exceeded_at IS NOT NULL, b.pauses, b.traceparent,
          extract(epoch FROM COALESCE(b.completed_at, now()) - b.created_at)
""".format(held_error=_BUDGET_JOB_ERROR.format(what="started"))

# The budget settle, one step: one job its budget stopped, that has rows never released
# or handed back by a row-worker (a pause: rows of returned_rows not taken) and is still
# live (queued, running or paused, before its deadline), locked SKIP LOCKED
# so aggregators settling at once take different jobs. _SETTLE_LOCK names its statuses so
# it reads the partial index batches_budget_stopped (0016).
_SETTLE_LOCK = (
    "SELECT id, rows_batch_id, dispatched_upto, total FROM batches"
    f" WHERE budget_exceeded_at IS NOT NULL AND {status_in(allowed_from(JobStatus.COMPLETED))}"
    " AND (dispatched_upto < total OR EXISTS (SELECT 1 FROM returned_rows x"
    "   WHERE x.batch_id = batches.id AND NOT x.taken))"
    " AND (expires_at IS NULL OR expires_at > now())"
    " ORDER BY budget_exceeded_at, id LIMIT 1 FOR UPDATE SKIP LOCKED"
)

# Rows $3 <= index < $4 of the locked job $1 (its input in batch $2), and the rows
# handed back that wait to go out again (marked taken here), get the error
# outcome $5 (0 attempts) unless they have one, ``dispatched_upto`` moves past them (rows
# below it are released: none of these ever is), ``failed`` grows by what was inserted
# and the job's error says the budget withheld rows. Once every row has an outcome the
# job ends: $6 (failed) if its budget withheld a row, else $7 (completed).
_SETTLE = """
WITH back AS (
    UPDATE returned_rows x SET taken = true WHERE x.batch_id = $1 AND NOT x.taken
    RETURNING x.row_index
),
ins AS (
    INSERT INTO row_results (batch_id, row_index, error, attempts)
    SELECT $1, r.row_index, $5, 0 FROM batch_rows r
    WHERE r.batch_id = $2 AND ((r.row_index >= $3 AND r.row_index < $4)
                               OR r.row_index IN (SELECT row_index FROM back))
    ON CONFLICT (batch_id, row_index) DO NOTHING
    RETURNING 1
),
counted AS (SELECT count(*) AS bad FROM ins),
moved AS (
    SELECT c.bad, b.lease_owner AS owner, b.completed + b.failed + c.bad >= b.total AS ends,
           b.error IS NOT NULL OR c.bad > 0 AS withheld
    FROM counted c, batches b WHERE b.id = $1
)
UPDATE batches b SET
    failed = b.failed + m.bad,
    dispatched_upto = GREATEST(b.dispatched_upto, $4),
    last_progress_at = CASE WHEN m.bad > 0 THEN now() ELSE b.last_progress_at END,
    error = CASE WHEN m.bad > 0 AND b.error IS NULL THEN {withheld_error} ELSE b.error END,
    status = CASE WHEN m.ends AND m.withheld THEN $6::text
                  WHEN m.ends THEN $7::text ELSE b.status END,
    completed_at = CASE WHEN m.ends THEN now() ELSE b.completed_at END,
    lease_owner = CASE WHEN m.ends THEN NULL ELSE b.lease_owner END
FROM moved m WHERE b.id = $1
RETURNING b.id, b.status, b.total, b.completed, b.failed, 0, m.bad, m.owner, false, b.pauses,
          b.traceparent, extract(epoch FROM COALESCE(b.completed_at, now()) - b.created_at)
""".format(withheld_error=_BUDGET_JOB_ERROR.format(what="released"))
SETTLE_STEP_ROWS = 10_000


@dataclass(frozen=True)
class JobProgress:
    """A job's counters after a chunk of outcomes was recorded."""

    id: str
    status: JobStatus
    total: int
    completed: int
    failed: int
    new_completed: int = 0
    new_failed: int = 0
    owner: str | None = None  # the dispatcher whose lease the job was under, if any
    budget_stopped: bool = False  # its budget stopped it (this chunk's cost, or before)
    pauses: int = 0  # how many times it was paused
    traceparent: str | None = None  # its trace context, if traced (relay_batches.tracing)
    age_s: float = 0.0  # from its creation to its end (or to now while it runs)

    @property
    def terminal(self) -> bool:
        """Whether this chunk finished the job."""
        return self.status in TERMINAL


class OutcomeStore:
    """Records row outcomes exactly once and moves counters by what was inserted."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def record(self, outcomes: Sequence[RowOutcome]) -> list[JobProgress]:
        """Insert new outcomes of running jobs; ignore duplicates and outcomes of others.

        The running jobs are locked first (in id order, so aggregators never deadlock), so
        a concurrent cancel either happens before (and the outcomes are discarded) or
        after (and sees the counters including them). An outcome whose row index is not a
        row of its (running) job can never be stored: then nothing is inserted and
        :class:`UnstorableError` names those outcomes' positions.
        """
        if not outcomes:
            return []
        batch_ids = sorted({o.batch_id for o in outcomes})
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            locked = await conn.fetch(_LOCK_RUNNING, batch_ids, allowed_from(JobStatus.COMPLETED))
            totals: dict[str, int] = {r[0]: r[1] for r in locked}
            if not totals:
                return []
            _refuse_out_of_range(outcomes, totals)
            accepted = [o for o in outcomes if o.batch_id in totals]
            columns = _columns(accepted)
            records = await conn.fetch(
                _RECORD,
                *columns[:9],
                list(totals),
                JobStatus.COMPLETED,
                *columns[9:14],
                RATE_WINDOW_S,
                JobStatus.FAILED,
                BUDGET_HELD_ERROR,
                *columns[14:18],
            )
        return [_progress(r) for r in records]

    async def settle_budget_stops(self, step_rows: int = SETTLE_STEP_ROWS) -> list[JobProgress]:
        """One step of the budget settle, in one short transaction: the rows of one job
        its budget stopped that were never released, up to ``step_rows`` of them from its
        ``dispatched_upto``, get the error outcome :data:`BUDGET_ROW_ERROR` (set-based,
        rows with an outcome skipped), and the job's counters move by what was inserted;
        the job ends once every row has an outcome (failed: its budget withheld rows).

        Returns that job's counters (``new_failed``: the rows withheld now), or nothing
        when no job needs settling. Several aggregators may settle at once: each step
        locks its job ``SKIP LOCKED`` and inserts ``ON CONFLICT DO NOTHING``, so no row
        is counted twice.
        """
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            locked = await conn.fetchrow(_SETTLE_LOCK)
            if locked is None:
                return []
            batch_id, rows_batch_id, start, total = locked
            record = await conn.fetchrow(
                _SETTLE,
                batch_id,
                rows_batch_id,
                start,
                min(total, start + max(1, step_rows)),
                BUDGET_ROW_ERROR,
                JobStatus.FAILED,
                JobStatus.COMPLETED,
            )
        assert record is not None
        return [_progress(record)]

    async def record_returned(self, returned: Sequence[tuple[str, int, int]]) -> int:
        """Record rows row-workers handed back unstarted (their job was paused), so the
        job's dispatcher releases them again; return how many are new. Only rows of live
        jobs (queued, running, paused), released (below ``dispatched_upto``) and without an
        outcome are kept; a row already recorded from the same release is ignored (a
        redelivered hand-back, even once the row went out again: it stays, taken).
        One statement, its jobs' rows key-share locked in id order (the foreign key)."""
        if not returned:
            return 0
        async with translated():
            status = await self._pool.execute(
                _RETURNED,
                [b for b, _, _ in returned],
                [i for _, i, _ in returned],
                allowed_from(JobStatus.COMPLETED),
                [p for _, _, p in returned],
            )
        return int(status.split()[-1])

    async def canceled_among(self, batch_ids: list[str]) -> list[tuple[str, JobStatus]]:
        """Which of ``batch_ids`` were stopped, canceled or expired, with that status
        (outcomes still arriving for them), by id."""
        async with translated():
            records = await self._pool.fetch(
                "SELECT id, status FROM batches WHERE id = ANY($1::text[])"
                " AND status = ANY($2::text[]) ORDER BY id",
                batch_ids,
                sorted(STOPPED),
            )
        return [(r[0], JobStatus(r[1])) for r in records]

    async def unannounced_terminal(self, older_than_s: float, limit: int = 100) -> list[str]:
        """Terminal jobs whose ``job.finished`` was not yet published (outbox scan)."""
        async with translated():
            records = await self._pool.fetch(
                "SELECT id FROM batches WHERE NOT finished_published"
                f" AND {status_in(TERMINAL)}"
                " AND completed_at < now() - make_interval(secs => $1)"
                " ORDER BY completed_at LIMIT $2",
                older_than_s,
                limit,
            )
        return [r[0] for r in records]

    async def snapshot(self, batch_ids: list[str]) -> list[JobProgress]:
        """Current counters of ``batch_ids`` (for events published from the outbox)."""
        async with translated():
            records = await self._pool.fetch(
                "SELECT id, status, total, completed, failed FROM batches"
                " WHERE id = ANY($1::text[])",
                batch_ids,
            )
        return [_progress(r) for r in records]

    async def mark_finished_published(self, batch_ids: list[str]) -> None:
        """Record that ``job.finished`` went out for these jobs."""
        await mark_finished_published(self._pool, batch_ids)


def _progress(record: asyncpg.Record) -> JobProgress:
    """A :class:`JobProgress` from ``(id, status, total, completed, failed[, ok, bad,
    owner, budget_stopped, pauses, traceparent, age in seconds])``."""
    job = JobProgress(record[0], JobStatus(record[1]), *record[2:11])
    return job if len(record) < 12 else replace(job, age_s=float(record[11]))


def _refuse_out_of_range(outcomes: Sequence[RowOutcome], totals: dict[str, int]) -> None:
    """Raise :class:`UnstorableError` for outcomes of these jobs that name no row of them."""
    refused = [
        position
        for position, o in enumerate(outcomes)
        if o.batch_id in totals and not 0 <= o.row_index < totals[o.batch_id]
    ]
    if refused:
        raise UnstorableError(refused, "row index out of range of its job")


def _columns(outcomes: Sequence[RowOutcome]) -> tuple[list[object], ...]:
    return (
        [o.batch_id for o in outcomes],
        [o.row_index for o in outcomes],
        [o.content for o in outcomes],
        [o.error for o in outcomes],
        [o.attempts for o in outcomes],
        [o.dead_letter for o in outcomes],
        [o.deployment for o in outcomes],
        [o.prompt_tokens for o in outcomes],
        [o.completion_tokens for o in outcomes],
        [o.tool_calls for o in outcomes],
        [o.finish_reason for o in outcomes],
        [o.model for o in outcomes],
        [o.latency_ms for o in outcomes],
        [o.cost_usd for o in outcomes],
        [o.body for o in outcomes],
        [o.lane for o in outcomes],
        [o.cached_tokens for o in outcomes],
        [o.all_realtime_usd for o in outcomes],
    )


# $1 batch ids, $2 row indexes, $3 live statuses, $4 the pause counts of their release.
_RETURNED = (
    "INSERT INTO returned_rows (batch_id, row_index, pauses)"
    " SELECT t.batch_id, t.row_index, t.pauses"
    " FROM unnest($1::text[], $2::int[], $4::int[]) AS t(batch_id, row_index, pauses)"
    " JOIN batches b ON b.id = t.batch_id"
    " WHERE b.status = ANY($3::text[]) AND t.row_index >= 0 AND t.row_index < b.dispatched_upto"
    " AND NOT EXISTS (SELECT 1 FROM row_results o"
    "   WHERE o.batch_id = t.batch_id AND o.row_index = t.row_index)"
    " ORDER BY t.batch_id, t.row_index"
    " ON CONFLICT (batch_id, row_index, pauses) DO NOTHING"
)
