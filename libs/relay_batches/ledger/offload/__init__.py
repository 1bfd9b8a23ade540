"""The offloader's ledger: offloaded rows and the provider batches they go in.

A job its dispatcher offloaded (``batches.offload_deployment`` set, every row released)
is taken in by :meth:`OffloadStore.intake`: its released rows up to ``dispatched_upto``
become ``offload_rows`` in bounded steps, each row under the batch deployment that leads
its own alias (``pending``), or ``forward`` when none does (its alias runs realtime, or
the deployment left the routes file). :meth:`OffloadStore.gather` then cuts a deployment's
pending rows of running jobs into a provider batch when they reach its row or byte cap or
the oldest waited its linger: in one transaction the ``offload_batches`` record is made
(``recorded``) and its rows marked ``submitted``, before anything is sent, so a crash
never submits a row twice. The offloader then walks the record through ``creating``,
``submitted``, ``ended`` and ``settled`` with guarded, leased transitions (a lease per
record, taken ``FOR UPDATE SKIP LOCKED``, so replicas split them).

Every statement is set-based: no statement runs per row.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import asyncpg

from relay_batches.ledger.pool import translated
from relay_batches.ledger.status_sql import status_in
from relay_batches.model import TERMINAL, JobStatus

_log = logging.getLogger("relay.offloader")

INTAKE_STEP = 10_000
# Rows taken in since offload_rows' statistics were last read: past this, intake reads
# them again (ANALYZE samples a bounded number of rows: about a tenth of a second at any
# size). Autovacuum comes a minute or more later; meanwhile statistics taken while the
# table held a few finished rows say no row is pending, and the gather's update then
# joins its 20,000 picked rows to the pending ones by a nested loop (2.3 minutes
# measured, instead of a third of a second).
ANALYZE_AFTER_ROWS = 5_000
DROP_WITHIN_S = 3600.0


class BatchState(StrEnum):
    """The states of one provider batch (``offload_batches.state``)."""

    RECORDED = "recorded"
    CREATING = "creating"
    SUBMITTED = "submitted"
    CANCELING = "canceling"
    ENDED = "ended"
    SETTLED = "settled"


class RowState(StrEnum):
    """The states of one offloaded row (``offload_rows.state``)."""

    PENDING = "pending"
    SUBMITTED = "submitted"
    DONE = "done"
    FORWARD = "forward"
    FORWARDED = "forwarded"
    DROPPED = "dropped"


@dataclass(frozen=True, slots=True)
class Gathering:
    """How one batch deployment cuts its pending rows into provider batches.

    ``line_extra`` is added to each row's stored request size to bound its line in the
    provider's input file (the custom id, the deployment's model and params, the
    envelope); ``max_bytes`` is the budget of those bounds. A job's rows go in a
    provider batch only while its deadline is at least ``window_s + margin_s`` away (the
    dispatcher's rule when it offloaded the job; a job paused long since may no longer
    leave that): the others go realtime.
    """

    deployment: str
    max_rows: int
    max_bytes: int
    linger_s: float
    line_extra: int = 512
    window_s: float = 86_400.0
    margin_s: float = 3600.0
    late_step: int = INTAKE_STEP


@dataclass(frozen=True, slots=True)
class OffloadBatch:
    """One provider batch as its record holds it."""

    id: int
    deployment: str
    state: BatchState
    provider_id: str | None
    input_file_id: str | None
    output_file_id: str | None
    error_file_id: str | None
    rows: int
    bytes: int
    created_at: datetime
    polls: int
    error: str | None


@dataclass(frozen=True, slots=True)
class OffloadLine:
    """One row of a provider batch with what its line is built from."""

    batch_id: str
    row_index: int
    request: str  # the row's stored chat request (JSON)
    params: str  # the job's params (JSON)


@dataclass(frozen=True, slots=True)
class ForwardRow:
    """A row to publish realtime, with what its slice carries of its job."""

    batch_id: str
    row_index: int
    request: str
    model: str
    params: str
    expires_at: datetime | None


# Publishes rows as ordinary realtime rows; returns once the broker confirmed them.
PublishForward = Callable[[list["ForwardRow"]], Awaitable[None]]

_BATCH_COLUMNS = (
    "id, deployment, state, provider_id, input_file_id, output_file_id, error_file_id,"
    " rows, bytes, created_at, polls, error"
)
_ENDED = [str(s) for s in TERMINAL]


def _forward_or_drop(ended: str) -> str:
    """A row's state when it is to go realtime: dropped if its job (``b``) ended (the
    parameter ``ended`` holds the ended statuses), as nobody forwards an ended job's rows."""
    return (
        f"CASE WHEN b.status = ANY({ended}::text[])"
        f" THEN '{RowState.DROPPED}' ELSE '{RowState.FORWARD}' END"
    )


def _batch(record: asyncpg.Record) -> OffloadBatch:
    values = list(record)
    values[2] = BatchState(values[2])
    return OffloadBatch(*values)


class OffloadStore:
    """Offloaded rows and provider batches on a pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._unanalyzed = 0  # rows taken in since this store last analyzed offload_rows

    # --- intake and gathering ---------------------------------------------------------

    async def intake(
        self,
        leads: Mapping[str, str],
        step: int = INTAKE_STEP,
        jobs: int = 16,
        routed: Collection[str] | None = None,
    ) -> int:
        """Take up to ``step`` released rows of each of up to ``jobs`` offloaded running
        jobs (each job once a call, so a large one does not hold the others back) into
        ``offload_rows``, one transaction per job, the job locked SKIP LOCKED so replicas
        take different ones; and move up to ``step`` pending rows of deployments that are
        no longer batch deployments to ``forward``. How many rows were recorded or moved.

        ``leads`` maps each alias led by a batch deployment to that deployment; a row
        whose own alias (else its job's) is not in it is recorded as ``forward``.
        ``routed`` names every batch deployment of the routes (None: no such move), as
        only those are gathered.
        """
        aliases, deployments = list(leads), list(leads.values())
        recorded = 0
        if routed is not None:
            async with translated():
                status = await self._pool.execute(_FORWARD_UNROUTED, list(routed), step)
            recorded = int(status.split()[-1])
        taken: list[str] = []
        for _ in range(jobs):
            async with translated(), self._pool.acquire() as conn, conn.transaction():
                job = await conn.fetchrow(_INTAKE_LOCK, taken)
                if job is None:
                    break
                batch_id, rows_batch_id, model, start, upto = job
                taken.append(batch_id)
                end = min(upto, start + step)
                args = (batch_id, rows_batch_id, start, end, model, aliases, deployments)
                try:
                    async with conn.transaction():  # a savepoint: the job's lock is kept
                        status = await conn.execute(_INTAKE_ROWS, *args)
                except asyncpg.DataError as exc:
                    _log.warning(
                        "offload_intake_unread",
                        extra={"batch_id": batch_id, "from": start, "error": repr(exc)},
                    )
                    status = await conn.execute(_INTAKE_UNREAD, *args)
                await conn.execute(_INTAKE_ADVANCE, batch_id, end)
                recorded += int(status.split()[-1])
        self._unanalyzed += recorded
        if self._unanalyzed >= ANALYZE_AFTER_ROWS:
            async with translated():
                await self._pool.execute("ANALYZE offload_rows")
            self._unanalyzed = 0
        return recorded

    async def drop_ended(
        self, within_s: float = DROP_WITHIN_S, step: int = INTAKE_STEP, rounds: int = 16
    ) -> int:
        """Pending and forward rows of offloaded jobs that ended (canceled, expired, …)
        within the last ``within_s`` become ``dropped``, ``step`` rows a statement (each
        its own transaction), at most ``rounds`` statements a call; how many. Only a
        marking: such rows are never gathered nor forwarded anyway (both take running
        jobs' rows only), so the scan goes from the recently ended jobs (index
        ``batches_ended``) to their rows by key, never over every waiting row."""
        dropped = 0
        for _ in range(rounds):
            async with translated():
                status = await self._pool.execute(_DROP_ENDED, within_s, step)
            moved = int(status.split()[-1])
            dropped += moved
            if moved < step:
                break
        return dropped

    async def gather(self, gathering: Gathering) -> int | None:
        """Cut one provider batch of ``gathering.deployment``'s pending rows of running
        jobs if it is due (row cap, byte budget or linger reached), after sending a
        bounded step of those whose jobs' deadlines came too near realtime: its record
        (``recorded``) and its rows' ``submitted`` mark in one transaction, under an
        advisory lock on the deployment (a replica gathering it meanwhile skips). The
        new record's id, or None when nothing was due."""
        g = gathering
        wait_s = g.window_s + g.margin_s
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval(_GATHER_LOCK, g.deployment):
                return None
            late = await conn.execute(_GATHER_LATE, g.deployment, wait_s, g.late_step)
            if late != "UPDATE 0":
                _log.info(
                    "offload_too_late",
                    extra={"deployment": g.deployment, "rows": int(late.split()[-1])},
                )
            made = await conn.fetchval(
                _GATHER, g.deployment, g.max_rows, g.max_bytes, g.line_extra, g.linger_s, wait_s
            )
        return None if made is None else int(made)

    # --- the provider batch's life -----------------------------------------------------

    async def claim(
        self, owner: str, states: Sequence[BatchState], lease_s: float, limit: int
    ) -> list[OffloadBatch]:
        """Lease up to ``limit`` records in ``states`` that are due (``next_poll_at``
        passed) and whose lease is free or expired, oldest first."""
        async with translated():
            records = await self._pool.fetch(
                _CLAIM, owner, [str(s) for s in states], lease_s, limit
            )
        return [_batch(r) for r in records]

    async def renew(self, offload_id: int, owner: str, lease_s: float) -> bool:
        """Extend our lease on a record while a long step runs (a large upload): only
        while we hold one; False when it is no longer ours."""
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE offload_batches SET lease_until = now() + make_interval(secs => $3)"
                " WHERE id = $1 AND owner = $2 AND lease_until IS NOT NULL RETURNING id",
                offload_id,
                owner,
                lease_s,
            )
        return value is not None

    async def lines(
        self, offload_id: int, after: tuple[str, int] | None, limit: int, max_bytes: int
    ) -> list[OffloadLine]:
        """Up to ``limit`` rows of a provider batch still to send, after ``after`` (keyset
        order by ``(batch_id, row_index)``), their requests within ``max_bytes`` (the
        first one whatever its size), with their jobs' params."""
        start = after or ("", -1)
        async with translated():
            records = await self._pool.fetch(
                _LINES, offload_id, start[0], start[1], limit, max_bytes
            )
        return [OffloadLine(*r) for r in records]

    async def set_creating(self, offload_id: int, owner: str, input_file_id: str | None) -> bool:
        """``recorded`` → ``creating`` once its input file is uploaded (OpenAI: its id)."""
        return await self._move(
            offload_id,
            owner,
            [BatchState.RECORDED, BatchState.CREATING],
            BatchState.CREATING,
            "input_file_id = COALESCE($4, input_file_id)",
            input_file_id,
        )

    async def set_submitted(self, offload_id: int, owner: str, provider_id: str) -> bool:
        """The provider holds it: ``provider_id`` stored, polled from now on."""
        return await self._move(
            offload_id,
            owner,
            [BatchState.RECORDED, BatchState.CREATING],
            BatchState.SUBMITTED,
            "provider_id = $4, submitted_at = now(), next_poll_at = now(), polls = 0,"
            " lease_until = NULL",
            provider_id,
        )

    async def set_canceling(self, offload_id: int, owner: str) -> bool:
        """Every row belongs to jobs that ended: the provider was asked to cancel it."""
        return await self._move(
            offload_id,
            owner,
            [BatchState.SUBMITTED],
            BatchState.CANCELING,
            "error = COALESCE($4::text, error)",
            None,
        )

    async def set_ended(
        self,
        offload_id: int,
        owner: str,
        output: str | None,
        errors: str | None,
        error: str | None,
    ) -> bool:
        """Its results may be read: where they are, or ``error`` when it failed whole."""
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE offload_batches SET state = $3, output_file_id = $4, error_file_id = $5,"
                " error = $6, ended_at = now(), next_poll_at = now()"
                " WHERE id = $1 AND owner = $2 AND state = ANY($7::text[]) RETURNING id",
                offload_id,
                owner,
                BatchState.ENDED,
                output,
                errors,
                error,
                [s.value for s in BatchState if s is not BatchState.SETTLED],
            )
        return value is not None

    async def polled(
        self, offload_id: int, owner: str, progress: int, poll_s: float, max_s: float
    ) -> float:
        """A poll found it still running with ``progress`` requests finished: the next
        poll comes ``poll_s`` doubled per poll without progress since, at most
        ``max_s`` (back to ``poll_s`` on progress); returns that delay."""
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE offload_batches SET"
                " polls = CASE WHEN $3 > progress THEN 0 ELSE polls + 1 END,"
                " progress = GREATEST(progress, $3), lease_until = NULL,"
                " next_poll_at = now() + make_interval(secs => LEAST($5::float8,"
                "  $4::float8 * power(2, CASE WHEN $3 > progress THEN 0 ELSE polls + 1 END)))"
                " WHERE id = $1 AND owner = $2"
                " RETURNING LEAST($5::float8, $4::float8 * power(2, polls))",
                offload_id,
                owner,
                progress,
                poll_s,
                max_s,
            )
        return float(value) if value is not None else poll_s

    async def attempt(self, offload_id: int, owner: str) -> bool:
        """Count a create about to be tried (``polls``), durably before the call: a
        record resumed with a count above 0 may already have its provider batch."""
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE offload_batches SET polls = polls + 1"
                " WHERE id = $1 AND owner = $2 AND state = ANY($3::text[]) RETURNING id",
                offload_id,
                owner,
                [BatchState.RECORDED, BatchState.CREATING],
            )
        return value is not None

    async def resize(self, offload_id: int, owner: str, rows: int, size: int) -> None:
        """The rows and bytes its input file really holds (rows it could not take were
        forwarded while it was built)."""
        async with translated():
            await self._pool.execute(
                "UPDATE offload_batches SET rows = GREATEST($3, 1), bytes = $4"
                " WHERE id = $1 AND owner = $2",
                offload_id,
                owner,
                rows,
                size,
            )

    async def retry_later(self, offload_id: int, owner: str, delay_s: float, error: str) -> None:
        """A step failed (the provider or the network): let the lease go and try again
        in ``delay_s``; ``error`` is kept for the operator."""
        async with translated():
            await self._pool.execute(
                "UPDATE offload_batches SET next_poll_at = now() + make_interval(secs => $3),"
                " lease_until = NULL, error = CASE WHEN state = $5 THEN error ELSE $4 END"
                " WHERE id = $1 AND owner = $2",
                offload_id,
                owner,
                delay_s,
                error[:500],
                BatchState.ENDED,
            )

    async def all_rows_ended(self, offload_id: int) -> bool:
        """Whether every row of the provider batch belongs to a job that ended."""
        async with translated():
            value = await self._pool.fetchval(_ANY_LIVE_ROW, offload_id, _ENDED)
        return value is None

    async def others_hold(self, provider_id: str, offload_id: int) -> bool:
        """Whether another record holds ``provider_id`` (a found batch is someone's)."""
        async with translated():
            value = await self._pool.fetchval(
                "SELECT 1 FROM offload_batches WHERE provider_id = $1 AND id <> $2",
                provider_id,
                offload_id,
            )
        return value is not None

    # --- settling --------------------------------------------------------------------

    async def mark_rows(self, keys: Sequence[tuple[str, int]], state: RowState) -> int:
        """Move the submitted rows ``keys`` to ``state`` (done: their outcome was
        published; forward: they go realtime, or are dropped if their job ended); how
        many moved."""
        if not keys:
            return 0
        async with translated():
            status = await self._pool.execute(
                "UPDATE offload_rows o SET state = CASE WHEN $3 = 'forward'"
                f" THEN {_forward_or_drop('$5')} ELSE $3 END"
                " FROM unnest($1::text[], $2::int[]) AS k(batch_id, row_index), batches b"
                " WHERE o.batch_id = k.batch_id AND o.row_index = k.row_index"
                " AND o.state = $4 AND b.id = o.batch_id",
                [k[0] for k in keys],
                [k[1] for k in keys],
                state,
                RowState.SUBMITTED,
                _ENDED,
            )
        return int(status.split()[-1])

    async def mark_done(self, keys: Sequence[tuple[str, int]]) -> tuple[int, int]:
        """The submitted rows ``keys`` had their outcome published: ``done``. How many
        moved, and of those how many belong to jobs that ended meanwhile (late outcomes:
        the ledger discards them)."""
        if not keys:
            return 0, 0
        async with translated():
            records = await self._pool.fetch(
                "UPDATE offload_rows o SET state = $3"
                " FROM unnest($1::text[], $2::int[]) AS k(batch_id, row_index), batches b"
                " WHERE o.batch_id = k.batch_id AND o.row_index = k.row_index"
                " AND o.state = $4 AND b.id = o.batch_id"
                " RETURNING b.status = ANY($5::text[])",
                [k[0] for k in keys],
                [k[1] for k in keys],
                RowState.DONE,
                RowState.SUBMITTED,
                _ENDED,
            )
        return len(records), sum(1 for r in records if r[0])

    async def settle(self, offload_id: int, owner: str) -> int:
        """Its results are all read: the record is ``settled`` and the rows it gave no
        outcome for are forwarded (dropped if their job ended), in one transaction, only
        while it is ours and ended; how many rows were forwarded or dropped."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            ours = await conn.fetchval(
                "UPDATE offload_batches SET state = $3, lease_until = NULL"
                " WHERE id = $1 AND owner = $2 AND state = $4 RETURNING id",
                offload_id,
                owner,
                BatchState.SETTLED,
                BatchState.ENDED,
            )
            if ours is None:
                return 0
            status = await conn.execute(
                f"UPDATE offload_rows o SET state = {_forward_or_drop('$3')}"
                " FROM batches b WHERE o.provider_batch = $1 AND o.state = $2"
                " AND b.id = o.batch_id",
                offload_id,
                RowState.SUBMITTED,
                _ENDED,
            )
        return int(status.split()[-1])

    # --- forwarding --------------------------------------------------------------------

    async def forward(self, limit: int, max_bytes: int, publish: PublishForward) -> int:
        """Take up to ``limit`` rows of running jobs waiting to go realtime (a paused or
        queued job's wait for it to run again), their requests within
        ``max_bytes`` (the first whatever its size; locked SKIP LOCKED), hand
        them to ``publish`` (which returns once the broker confirmed them) and mark them
        ``forwarded`` in the same transaction: a crash before the commit publishes them
        again (a duplicate realtime call at worst; the outcome insert is idempotent)."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            records = await conn.fetch(_FORWARD_LOCK, limit, max_bytes)
            if not records:
                return 0
            await publish([ForwardRow(*r) for r in records])
            await conn.execute(
                "UPDATE offload_rows o SET state = $3"
                " FROM unnest($1::text[], $2::int[]) AS k(batch_id, row_index)"
                " WHERE o.batch_id = k.batch_id AND o.row_index = k.row_index",
                [r[0] for r in records],
                [r[1] for r in records],
                RowState.FORWARDED,
            )
        return len(records)

    async def _move(
        self,
        offload_id: int,
        owner: str,
        allowed: Sequence[BatchState],
        to: BatchState,
        set_clause: str,
        value: str | None,
    ) -> bool:
        async with translated():
            found = await self._pool.fetchval(
                f"UPDATE offload_batches SET state = $3, {set_clause}"
                " WHERE id = $1 AND owner = $2 AND state = ANY($5::text[]) RETURNING id",
                offload_id,
                owner,
                to,
                value,
                [str(s) for s in allowed],
            )
        return found is not None


# --- statements ---------------------------------------------------------------------

# $1 jobs taken this call: one more offloaded running job with released rows not yet
# taken in; SKIP LOCKED, so a replica taking in another job at once passes this one by.
_INTAKE_LOCK = (
    "SELECT id, rows_batch_id, model, offload_upto, dispatched_upto FROM batches"
    f" WHERE offload_deployment IS NOT NULL AND {status_in([JobStatus.RUNNING])}"
    " AND offload_upto < dispatched_upto AND NOT id = ANY($1::text[])"
    " ORDER BY id LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED"
)

# $1 job, $2 its rows' batch, $3..$4 the rows, $5 the job's alias, $6/$7 alias → lead.
# A row's own alias is the "model" of its request object (rows stored as a bare
# messages array, or without a model, run under the job's). Rows with an outcome are
# left out (a job offloaded after a crash of its first release may have some). A stored
# request may hold the escape \u0000 (a NUL in a string), which json refuses to turn
# into text anywhere in the document, even to read another key: it is read as \u0020
# (the same length, still valid JSON; an alias never holds either).
_INTAKE_INSERT = (
    "INSERT INTO offload_rows (batch_id, row_index, deployment, state, bytes)"
    " SELECT $1, r.row_index, COALESCE(l.deployment, ''),"
    f"  CASE WHEN l.deployment IS NULL THEN '{RowState.FORWARD}' ELSE '{RowState.PENDING}' END,"
    "  octet_length(r.request)"
    " FROM batch_rows r"
    " LEFT JOIN unnest($6::text[], $7::text[]) AS l(alias, deployment) ON l.alias = {alias}"
    " WHERE r.batch_id = $2 AND r.row_index >= $3 AND r.row_index < $4"
    " AND NOT EXISTS (SELECT 1 FROM row_results o WHERE o.batch_id = $1"
    "  AND o.row_index = r.row_index AND o.row_index >= $3 AND o.row_index < $4)"
    " ON CONFLICT (batch_id, row_index) DO NOTHING"
)
_INTAKE_ROWS = _INTAKE_INSERT.replace(
    "{alias}",
    "COALESCE(CASE WHEN left(r.request, 1) = '{'"
    " THEN replace(r.request, '\\u0000', '\\u0020')::json ->> 'model' END, $5)",
)
# The same rows when their requests could not be read (no stored row should fail that
# way): every one goes realtime, where the router reads each row's own alias (the alias
# is NULL; the job's still names $5, so both take the same arguments).
_INTAKE_UNREAD = _INTAKE_INSERT.replace("{alias}", "NULLIF($5::text, $5)")
# $1 the batch deployments, $2 rows at most: pending rows of any other deployment (it
# left the routes file, or runs realtime now) go realtime (dropped if their job ended).
# The deployments holding pending rows are found by a skip scan of index
# offload_rows_pending (one probe per deployment), never by reading every pending row.
_FORWARD_UNROUTED = f"""
WITH RECURSIVE held (deployment) AS (
    (SELECT deployment FROM offload_rows WHERE state = '{RowState.PENDING}'
     ORDER BY deployment LIMIT 1)
    UNION ALL
    SELECT (SELECT o.deployment FROM offload_rows o
            WHERE o.state = '{RowState.PENDING}' AND o.deployment > h.deployment
            ORDER BY o.deployment LIMIT 1)
    FROM held h WHERE h.deployment IS NOT NULL
),
gone AS (
    SELECT deployment FROM held
    WHERE deployment IS NOT NULL AND NOT deployment = ANY($1::text[])
),
k AS (
    SELECT r.batch_id, r.row_index FROM gone g CROSS JOIN LATERAL (
        SELECT r.batch_id, r.row_index FROM offload_rows r
        WHERE r.state = '{RowState.PENDING}' AND r.deployment = g.deployment
        ORDER BY r.created_at, r.batch_id, r.row_index
        LIMIT $2 FOR UPDATE SKIP LOCKED) r
    LIMIT $2
)
UPDATE offload_rows o SET state = CASE WHEN b.{status_in(TERMINAL)}
    THEN '{RowState.DROPPED}' ELSE '{RowState.FORWARD}' END
FROM k JOIN batches b ON b.id = k.batch_id
WHERE o.batch_id = k.batch_id AND o.row_index = k.row_index
"""
_INTAKE_ADVANCE = "UPDATE batches SET offload_upto = GREATEST(offload_upto, $2) WHERE id = $1"

# $1 seconds: the offloaded jobs that ended that recently, then up to $2 of their
# waiting rows (locked SKIP LOCKED: a row a gather holds is left for the next step).
_DROP_ENDED = (
    f"UPDATE offload_rows o SET state = '{RowState.DROPPED}'"
    " FROM (SELECT w.batch_id, w.row_index"
    f"  FROM (SELECT id FROM batches WHERE {status_in(TERMINAL)}"
    "   AND completed_at > now() - make_interval(secs => $1)"
    "   AND offload_deployment IS NOT NULL) b"
    "  JOIN offload_rows w ON w.batch_id = b.id"
    f"  WHERE w.state IN ('{RowState.PENDING}', '{RowState.FORWARD}')"
    "  LIMIT $2 FOR UPDATE OF w SKIP LOCKED) k"
    " WHERE o.batch_id = k.batch_id AND o.row_index = k.row_index"
)

_GATHER_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('relay.offload.gather'), hashtext($1))"

# $1 deployment, $2 seconds a job must still have, $3 rows at most: pending rows of
# running jobs whose deadline is nearer go realtime (locked SKIP LOCKED, like gather's).
_GATHER_LATE = (
    f"UPDATE offload_rows o SET state = '{RowState.FORWARD}'"
    " FROM (SELECT o.batch_id, o.row_index FROM offload_rows o JOIN batches b ON b.id = o.batch_id"
    f"  WHERE o.deployment = $1 AND o.state = '{RowState.PENDING}'"
    f"  AND b.status = '{JobStatus.RUNNING}'"
    "  AND b.expires_at < now() + make_interval(secs => $2)"
    "  ORDER BY o.created_at, o.batch_id, o.row_index LIMIT $3 FOR UPDATE OF o SKIP LOCKED) k"
    " WHERE o.batch_id = k.batch_id AND o.row_index = k.row_index"
)

# $1 deployment, $2 row cap, $3 byte budget, $4 bytes added to each row's size, $5 the
# linger in seconds, $6 the seconds a job must still have (its deadline nearer: the
# rows wait for _GATHER_LATE). The candidates are its pending rows of running jobs whose budget has
# not stopped them (a paused job's rows wait), oldest first, at most the row cap, locked
# (a row a drop holds is passed by, one it dropped meanwhile is no longer pending); those
# whose running sum of sizes fits the budget (the first always) make the batch, which is
# due when they reach the row cap, when a candidate is left over for bytes, or when the
# oldest waited the linger. The record and the rows' mark are one statement.
_GATHER = f"""
WITH locked AS MATERIALIZED (
    SELECT o.batch_id, o.row_index, o.bytes, o.created_at
    FROM offload_rows o JOIN batches b ON b.id = o.batch_id
    WHERE o.deployment = $1 AND o.state = '{RowState.PENDING}'
      AND b.status = '{JobStatus.RUNNING}' AND b.budget_exceeded_at IS NULL
      AND (b.expires_at IS NULL OR b.expires_at >= now() + make_interval(secs => $6))
    ORDER BY o.created_at, o.batch_id, o.row_index
    LIMIT $2
    FOR UPDATE OF o SKIP LOCKED
),
cand AS MATERIALIZED (
    SELECT batch_id, row_index, bytes + $4 AS size, created_at,
           sum(bytes + $4) OVER w AS upto, row_number() OVER w AS n
    FROM locked
    WINDOW w AS (ORDER BY created_at, batch_id, row_index)
),
pick AS (SELECT batch_id, row_index, size FROM cand WHERE n = 1 OR upto <= $3),
stats AS (
    SELECT (SELECT count(*) FROM pick) AS rows, (SELECT sum(size) FROM pick) AS bytes,
           (SELECT count(*) FROM cand) > (SELECT count(*) FROM pick) AS full_bytes,
           (SELECT min(created_at) FROM cand) AS oldest
),
made AS (
    INSERT INTO offload_batches (deployment, state, rows, bytes)
    SELECT $1, '{BatchState.RECORDED}', rows, bytes FROM stats
    WHERE rows > 0 AND (rows >= $2 OR full_bytes
                        OR oldest <= now() - make_interval(secs => $5))
    RETURNING id
),
marked AS (
    UPDATE offload_rows o SET state = '{RowState.SUBMITTED}', provider_batch = made.id
    FROM made, pick WHERE o.batch_id = pick.batch_id AND o.row_index = pick.row_index
      AND o.state = '{RowState.PENDING}'
    RETURNING 1
)
SELECT id FROM made WHERE (SELECT count(*) FROM marked) > 0
"""

# $1 owner, $2 states, $3 lease seconds, $4 limit.
_CLAIM = (
    "UPDATE offload_batches b SET owner = $1, lease_until = now() + make_interval(secs => $3)"
    " FROM (SELECT id FROM offload_batches WHERE state = ANY($2::text[])"
    "  AND next_poll_at <= now() AND (lease_until IS NULL OR lease_until < now())"
    "  ORDER BY next_poll_at, id LIMIT $4 FOR UPDATE SKIP LOCKED) c"
    f" WHERE b.id = c.id RETURNING {', '.join('b.' + c.strip() for c in _BATCH_COLUMNS.split(','))}"
)

# $1 offload batch, $2/$3 after this (batch_id, row_index), $4 limit, $5 bytes: the page
# is cut by the rows' stored sizes before any request is read.
_LINES = (
    "WITH page AS (SELECT o.batch_id, o.row_index,"
    "  sum(o.bytes) OVER (ORDER BY o.batch_id, o.row_index) AS upto,"
    "  row_number() OVER (ORDER BY o.batch_id, o.row_index) AS n"
    f"  FROM offload_rows o WHERE o.provider_batch = $1 AND o.state = '{RowState.SUBMITTED}'"
    "  AND (o.batch_id, o.row_index) > ($2, $3)"
    "  ORDER BY o.batch_id, o.row_index LIMIT $4)"
    " SELECT p.batch_id, p.row_index, r.request, b.params"
    " FROM page p JOIN batches b ON b.id = p.batch_id"
    " JOIN batch_rows r ON r.batch_id = b.rows_batch_id AND r.row_index = p.row_index"
    " WHERE p.n = 1 OR p.upto <= $5"
    " ORDER BY p.batch_id, p.row_index"
)

# $1 offload batch, $2 the ended statuses: one row whose job is still live, if any.
_ANY_LIVE_ROW = (
    "SELECT 1 FROM offload_rows o JOIN batches b ON b.id = o.batch_id"
    " WHERE o.provider_batch = $1 AND NOT b.status = ANY($2::text[]) LIMIT 1"
)

# $1 limit, $2 bytes: rows to forward of running jobs (locked), cut by their stored
# sizes, then with what their slice carries. A paused or queued job's rows wait for it
# to run again; an ended job's are dropped, not forwarded. The scan goes from the
# offloaded running jobs (index batches_offloaded) to their rows to forward by key, so
# rows that wait are never read.
_FORWARD_LOCK = (
    "WITH taken AS (SELECT o.batch_id, o.row_index, o.bytes"
    "  FROM batches b CROSS JOIN LATERAL (SELECT o.batch_id, o.row_index, o.bytes"
    "   FROM offload_rows o"
    f"   WHERE o.batch_id = b.id AND o.state = '{RowState.FORWARD}'"
    "   ORDER BY o.row_index LIMIT $1 FOR UPDATE SKIP LOCKED) o"
    f"  WHERE b.offload_deployment IS NOT NULL AND b.{status_in([JobStatus.RUNNING])}"
    "  ORDER BY b.id, o.row_index LIMIT $1),"
    " page AS (SELECT batch_id, row_index,"
    "  sum(bytes) OVER (ORDER BY batch_id, row_index) AS upto,"
    "  row_number() OVER (ORDER BY batch_id, row_index) AS n FROM taken)"
    " SELECT p.batch_id, p.row_index, r.request, b.model, b.params, b.expires_at"
    " FROM page p JOIN batches b ON b.id = p.batch_id"
    " JOIN batch_rows r ON r.batch_id = b.rows_batch_id AND r.row_index = p.row_index"
    " WHERE p.n = 1 OR p.upto <= $2"
    " ORDER BY p.batch_id, p.row_index"
)
