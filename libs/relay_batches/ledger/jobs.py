"""Jobs as the ingest-api sees them: create (COPY), read, list, cancel, stream results
(the result pages are :mod:`~relay_batches.ledger.result_pages`'; their row types are
imported from here too)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg
import orjson

from relay_batches.errors import ConflictError, TransientError
from relay_batches.ledger.idempotency import IdempotencyClaim, record_response
from relay_batches.ledger.job_retry import RetryRows, insert_retry
from relay_batches.ledger.outbox import mark_finished_published
from relay_batches.ledger.pool import Connection, translated
from relay_batches.ledger.result_pages import (
    DETAIL_BYTES,
    RESULT_PAGE_BYTES,
    RESULT_PAGE_ROWS,
    ROW_SELECTIONS,
    AnsweredRow,
    DeadLetterRow,
    ResultPages,
    ResultRow,
    RowDetails,
)
from relay_batches.ledger.row_model import ROW_COLUMNS, with_models
from relay_batches.model import PAUSABLE, Job, JobStatus, allowed_from
from relay_batches.tracing import current_traceparent

__all__ = [
    "DETAIL_BYTES",
    "EXPIRES_AT",
    "FIRST_REPEATS",
    "HAS_REPEAT",
    "LONG_STORE_WAIT_S",
    "MAX_LONG_STORES",
    "RESULT_PAGE_BYTES",
    "RESULT_PAGE_ROWS",
    "ROW_SELECTIONS",
    "AnsweredRow",
    "DeadLetterRow",
    "JobStore",
    "JobWriter",
    "NewJob",
    "ResultRow",
    "RowDetails",
    "first_repeats",
    "long_store_slot",
    "long_store_slots",
]

# Long stores (a native upload's files, an OpenAI input file) holding a pooled connection
# at once, across JobStore and FileStore: they share one semaphore (long_store_slots()),
# so the rest of the pool always serves short queries (the ingest-api checks its pool
# holds at least this many + 2 at start-up).
MAX_LONG_STORES = 2
LONG_STORE_WAIT_S = 60.0  # a store waits this long for a slot, then is answered 503

# Whether a batch's rows repeat a custom id: one scan into a hash aggregate (no sort of
# the batch's rows; it reads them all before HAVING can answer). Only when there is a
# repeat is the first one (in row order) looked for, with a second scan.
HAS_REPEAT = (
    "SELECT custom_id FROM batch_rows WHERE batch_id = $1"
    " GROUP BY custom_id HAVING count(*) > 1 LIMIT 1"
)
# The repeated ids in row order of their second use: (custom_id, that row, the first's).
FIRST_REPEATS = (
    "SELECT custom_id, (array_agg(row_index ORDER BY row_index))[2] AS repeat,"
    " min(row_index) AS first FROM batch_rows WHERE batch_id = $1"
    " GROUP BY custom_id HAVING count(*) > 1 ORDER BY repeat LIMIT $2"
)


def long_store_slots(slots: int = MAX_LONG_STORES) -> asyncio.Semaphore:
    """The slots long stores take a connection under: one for the process, shared by its
    :class:`JobStore` and :class:`FileStore`."""
    return asyncio.Semaphore(slots)


@asynccontextmanager
async def long_store_slot(
    slots: asyncio.Semaphore, wait_s: float = LONG_STORE_WAIT_S
) -> AsyncIterator[None]:
    """One of ``slots``, waited for at most ``wait_s``: then :class:`TransientError`
    (a 503 with ``Retry-After``), not a wait as long as the stores ahead of it."""
    try:
        await asyncio.wait_for(slots.acquire(), wait_s)
    except TimeoutError:
        raise TransientError(f"every long-store slot stayed taken for {wait_s:g} s") from None
    try:
        yield
    finally:
        slots.release()


async def first_repeats(conn: Connection, batch_id: str, limit: int) -> list[asyncpg.Record]:
    """Up to ``limit`` custom ids used more than once under ``batch_id``, in row order of
    their second use: ``(custom_id, repeat, first)`` records (none: every id is unique)."""
    if await conn.fetchval(HAS_REPEAT, batch_id) is None:
        return []
    return list(await conn.fetch(FIRST_REPEATS, batch_id, limit))


@dataclass(frozen=True)
class NewJob:
    """Everything needed to insert a batch; ``rows`` yields ``(custom_id, request_json)``.

    ``rows_batch_id`` names stored rows the job runs instead of its own (an uploaded
    input file's, which are then not copied: its ``rows`` are empty); ``metadata`` is
    JSON text of string pairs. A job with a ``completion_window`` expires that long
    after its INSERT, on the database's clock (the one the reaper, the dispatcher's claim
    and the aggregator compare with); ``expires_at`` overrides that with an instant. A
    cron template never expires itself: each run it spawns expires ``completion_window``
    after it is spawned.
    """

    id: str
    workspace_id: str
    name: str
    model: str
    priority: int
    total: int
    webhook_url: str | None
    cron: str | None
    next_run_at: datetime | None
    params: str = "{}"
    rows_batch_id: str | None = None
    metadata: str | None = None
    expires_at: datetime | None = None
    completion_window: timedelta | None = None
    budget_usd: float | None = None
    retry_of: str | None = None
    surface: str | None = None  # 'anthropic' when its id shows as msgbatch_ (see 0029)
    endpoint: str = "/v1/chat/completions"  # the OpenAI endpoint its rows are bodies of


class JobWriter:
    """Jobs being stored a chunk of rows at a time, inside one transaction
    (:meth:`JobStore.streaming`): every job's rows first, then all the jobs' batches at
    the end, so the transaction takes no lock on ``batches`` (which a migration's
    ``ALTER TABLE batches`` would queue behind, and everything else behind it) while its
    files stream. ``batch_rows`` has no foreign key to ``batches``, so the rows may come
    first."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def add_rows(self, batch_id: str, start: int, rows: Sequence[tuple[str, str]]) -> None:
        """COPY ``(custom_id, request_json)`` rows as rows ``start``, ``start + 1``, … of
        ``batch_id``."""
        async with translated():
            await self._conn.copy_records_to_table(
                "batch_rows",
                records=with_models(
                    (batch_id, start + n, cid, req) for n, (cid, req) in enumerate(rows)
                ),
                columns=ROW_COLUMNS,
            )

    async def first_duplicate(self, batch_id: str) -> tuple[str, int, int] | None:
        """The first row of ``batch_id`` whose custom id repeats an earlier row's:
        ``(custom_id, its index, the earlier row's index)``; None if every id is unique."""
        async with translated():
            records = await first_repeats(self._conn, batch_id, 1)
        return None if not records else (records[0][0], records[0][1], records[0][2])

    async def insert(self, new: NewJob) -> Job:
        """INSERT the batch over the rows stored under its id (``new.total`` of them)."""
        async with translated():
            return await _insert_batch(self._conn, new)

    async def record(self, claim: IdempotencyClaim, body: object) -> None:
        """Record the 201 ``body`` for ``claim`` (:class:`KeyTaken` if the key was used
        first: nothing is then stored)."""
        async with translated():
            await record_response(self._conn, claim, 201, orjson.dumps(body).decode())


class JobStore(ResultPages):
    """The ``batches``/``batch_rows``/``row_results`` queries of the public API."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        page_bytes: int = RESULT_PAGE_BYTES,
        long_stores: asyncio.Semaphore | None = None,
    ) -> None:
        super().__init__(pool, page_bytes)
        self._streaming = long_store_slots() if long_stores is None else long_stores

    @property
    def long_stores(self) -> asyncio.Semaphore:
        """The long-store slots its uploads take (to share with a :class:`FileStore`)."""
        return self._streaming

    @asynccontextmanager
    async def streaming(self) -> AsyncIterator[JobWriter]:
        """One transaction for storing jobs a chunk of rows at a time: all of them, or
        nothing on error. It takes one of the long-store slots (``long_stores``, shared
        with the process's :class:`FileStore`) before a connection, so at most that many
        hold one at once (the others wait their turn); the caller feeds it from local
        storage, never from a client."""
        async with long_store_slot(self._streaming), translated(), self._pool.acquire() as conn:
            async with conn.transaction():
                yield JobWriter(conn)

    async def create(
        self,
        new: NewJob,
        rows: Iterable[tuple[str, str]],
        claim: IdempotencyClaim | None = None,
    ) -> Job:
        """Insert the batch and COPY its rows in one transaction.

        With ``claim``, the 201 response is recorded for its ``Idempotency-Key`` in the same
        transaction (:class:`KeyTaken` and nothing created if the key was used first).
        """
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            job = await _insert_job(conn, new, rows)
            if claim is not None:
                await record_response(conn, claim, 201, orjson.dumps(job.to_api()).decode())
        return job

    async def get(self, workspace_id: str, batch_id: str) -> Job | None:
        """The batch ``batch_id`` if it belongs to ``workspace_id``."""
        async with translated():
            record = await self._pool.fetchrow(
                "SELECT * FROM batches WHERE id = $1 AND workspace_id = $2", batch_id, workspace_id
            )
        return None if record is None else Job.from_record(record)

    async def list_page(
        self,
        workspace_id: str,
        limit: int,
        after: str | None,
        status: JobStatus | None,
        template_id: str | None = None,
        search: str | None = None,
    ) -> tuple[list[Job], bool]:
        """Newest first; ``after`` is the last id of the previous page. Returns (page, more).

        ``template_id`` keeps only the runs of that cron template; ``search`` the jobs
        whose id is it, or whose name or metadata (its JSON text: keys and values) holds
        it, ignoring case, or, for ``key=value``, whose metadata has that pair exactly.
        The search reads the workspace's jobs newest first through
        ``batches_workspace_list`` and stops at a page: one row per job, never its rows.
        """
        async with translated():
            records = await self._pool.fetch(
                "SELECT b.* FROM batches b WHERE b.workspace_id = $1"
                " AND ($3::text IS NULL OR b.status = $3)"
                " AND ($5::text IS NULL OR b.template_id = $5)"
                " AND ($6::text IS NULL OR b.id = lower($6)"
                "   OR strpos(lower(b.name), lower($6)) > 0"
                "   OR strpos(lower(b.metadata), lower($6)) > 0"
                "   OR (strpos($6, '=') > 1 AND b.metadata IS NOT NULL"
                "     AND b.metadata::jsonb ->> trim(split_part($6, '=', 1))"
                "       = trim(substr($6, strpos($6, '=') + 1))))"
                " AND ($2::text IS NULL OR (b.created_at, b.id) < ("
                "   SELECT a.created_at, a.id FROM batches a"
                "   WHERE a.id = $2 AND a.workspace_id = $1))"
                " ORDER BY b.created_at DESC, b.id DESC LIMIT $4",
                workspace_id,
                after,
                status,
                limit + 1,
                template_id,
                search,
            )
        page = [Job.from_record(r) for r in records[:limit]]
        return page, len(records) > limit

    async def cancel(self, workspace_id: str, batch_id: str) -> Job:
        """Guarded transition to ``canceled``; :class:`ConflictError` if already terminal."""
        async with translated():
            record = await self._pool.fetchrow(
                "UPDATE batches SET status = $4, completed_at = now(),"
                " next_run_at = NULL, lease_owner = NULL"
                " WHERE id = $1 AND workspace_id = $2 AND status = ANY($3::text[]) RETURNING *",
                batch_id,
                workspace_id,
                allowed_from(JobStatus.CANCELED),
                JobStatus.CANCELED,
            )
        if record is None:
            raise ConflictError(batch_id)
        return Job.from_record(record)

    async def pause(self, workspace_id: str, batch_id: str) -> Job:
        """Guarded transition of a queued or running job to ``paused``; its lease goes, so
        no dispatcher releases its rows, and its pause count grows: row-workers told of
        the pause hand back the rows they hold and have not started (those started
        finish and count). :class:`ConflictError` from any other status."""
        async with translated():
            record = await self._pool.fetchrow(
                "UPDATE batches SET status = $4, lease_owner = NULL, pauses = pauses + 1"
                " WHERE id = $1 AND workspace_id = $2 AND status = ANY($3::text[]) RETURNING *",
                batch_id,
                workspace_id,
                sorted(PAUSABLE),
                JobStatus.PAUSED,
            )
        if record is None:
            raise ConflictError(batch_id)
        return Job.from_record(record)

    async def resume(self, workspace_id: str, batch_id: str) -> Job:
        """Guarded transition of a paused job back to ``queued`` (a dispatcher claims it
        again in its workspace's turn, from ``dispatched_upto``); its rate window restarts
        now, so the time paused never lowers ``rows_per_s``. :class:`ConflictError` unless
        it is paused."""
        async with translated():
            record = await self._pool.fetchrow(
                "UPDATE batches SET status = $4, rate_window_at = now(),"
                " rate_window_done = completed + failed, rate_rows_per_s = NULL"
                " WHERE id = $1 AND workspace_id = $2 AND status = $3 RETURNING *",
                batch_id,
                workspace_id,
                JobStatus.PAUSED,
                JobStatus.QUEUED,
            )
        if record is None:
            raise ConflictError(batch_id)
        return Job.from_record(record)

    async def create_retry(
        self,
        workspace_id: str,
        original: Job,
        rows: str,
        new_id: str,
        claim: IdempotencyClaim | None = None,
    ) -> Job:
        """A new queued job ``new_id`` of the ``rows`` (``failed`` or ``dead_letter``) of
        the terminal job ``original``, its id appended to the original's ``retries``, in
        one transaction (see :mod:`relay_batches.ledger.job_retry`).

        :class:`ConflictError` unless the original is terminal, :class:`NothingToRetry`
        when it has no such row; with ``claim`` the 201 is recorded as :meth:`create` does.
        """
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            job = await insert_retry(conn, workspace_id, original.id, RetryRows(rows), new_id)
            if claim is not None:
                await record_response(conn, claim, 201, orjson.dumps(job.to_api()).decode())
        return job

    async def mark_finished_published(self, batch_ids: list[str]) -> None:
        """Record that ``job.finished`` went out for these jobs."""
        await mark_finished_published(self._pool, batch_ids)


# A new job's deadline: the instant given, else its window from now on the database's
# clock; a cron template (its runs expire, see schedule.py) has none.
EXPIRES_AT = (
    "COALESCE({deadline}::timestamptz,"
    " CASE WHEN {cron}::text IS NULL THEN now() + {window}::interval END)"
)


async def _insert_job(conn: Connection, new: NewJob, rows: Iterable[tuple[str, str]]) -> Job:
    """INSERT the batch and COPY its rows on ``conn`` (the caller owns the transaction)."""
    job = await _insert_batch(conn, new)
    if new.rows_batch_id is not None:
        return job
    await conn.copy_records_to_table(
        "batch_rows",
        records=with_models((new.id, n, cid, req) for n, (cid, req) in enumerate(rows)),
        columns=ROW_COLUMNS,
    )
    return job


async def _insert_batch(conn: Connection, new: NewJob) -> Job:
    """INSERT the batch row alone on ``conn``."""
    status = JobStatus.SCHEDULED if new.cron else JobStatus.QUEUED
    record = await conn.fetchrow(
        "INSERT INTO batches (id, workspace_id, name, model, priority, status, total,"
        " webhook_url, cron, next_run_at, rows_batch_id, params, metadata, expires_at,"
        " completion_window, budget_usd, retry_of, surface, endpoint, traceparent)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, COALESCE($12, $1), $11, $13,"
        f" {EXPIRES_AT.format(deadline='$14', window='$15', cron='$9')}, $15, $16, $17, $18, $19,"
        " $20)"
        " RETURNING *",
        new.id,
        new.workspace_id,
        new.name,
        new.model,
        new.priority,
        status,
        new.total,
        new.webhook_url,
        new.cron,
        new.next_run_at,
        new.params,
        new.rows_batch_id,
        new.metadata,
        new.expires_at,
        new.completion_window,
        new.budget_usd,
        new.retry_of,
        new.surface,
        new.endpoint,
        # A traced job's trace context: that of the submit it is stored under (None when
        # tracing is off or the submit was not sampled; see relay_batches.tracing).
        current_traceparent(),
    )
    return Job.from_record(record)
