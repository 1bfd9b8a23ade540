"""Files and the batches created from them (the OpenAI-compatible surface's ledger).

An input file is stored in one transaction once it has been received whole
(:meth:`FileStore.upload`; the API spools it to a temporary file first, so no
connection waits on a client). At 1,000,000 lines that transaction lasts seconds to tens
of seconds. It holds one pooled connection and a long-store slot, and writes only its
own new rows, so it blocks no other request's reads or writes; but its ROW EXCLUSIVE
locks on ``file_parts`` and ``batch_rows`` (and on ``files`` from its last statement)
make an ``ALTER TABLE`` of those (a migration) wait for it, and it holds back vacuum's
cleanup horizon meanwhile. Its bytes COPY'd as ``file_parts`` chunks of
:data:`PART_BYTES` and its parsed requests COPY'd as ``batch_rows`` under the file's
own id, so a job created from it runs those rows (``rows_batch_id``) and nothing is
copied again. Output and error files have no parts:
their rows are registered once their batch has ended and their size measured
(:meth:`FileStore.add_output_file`); their content is rendered from the outcomes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime

import asyncpg
import orjson

from relay_batches.ledger.idempotency import IdempotencyClaim, record_response
from relay_batches.ledger.jobs import (
    EXPIRES_AT,
    NewJob,
    first_repeats,
    long_store_slot,
    long_store_slots,
)
from relay_batches.ledger.jobs import _insert_job as insert_job
from relay_batches.ledger.pool import Connection, translated
from relay_batches.ledger.row_model import ROW_COLUMNS, with_models
from relay_batches.model import Job, JobStatus

INPUT_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"
PART_BYTES = 256 * 1024  # bytes of a stored part: one is read per query of ``content``

_FILE_COLUMNS = (
    "id, workspace_id, filename, purpose, bytes, rows, model, line_errors, created_at, endpoint"
)
_LINK_COLUMNS = (
    "o.batch_id AS link_batch_id, o.input_file_id, o.output_file_id, o.error_file_id,"
    " o.endpoint, o.completion_window, o.errors AS link_errors"
)


@dataclass(frozen=True)
class StoredFile:
    """One live file: ``line_errors`` is the JSON list of its lines' errors (None: clean)."""

    id: str
    workspace_id: str
    filename: str
    purpose: str
    bytes: int
    rows: int
    model: str | None
    line_errors: str | None
    created_at: datetime
    endpoint: str | None = None  # the url of its lines (None: chat, or an output file)


@dataclass(frozen=True)
class BatchLink:
    """What the OpenAI surface keeps of a batch beside its job: the file ids (32-hex),
    the requested endpoint and window, and the input's errors (JSON) if it failed
    validation."""

    batch_id: str
    input_file_id: str
    output_file_id: str
    error_file_id: str
    endpoint: str
    completion_window: str
    errors: str | None = None


@dataclass(frozen=True)
class LinkedBatch:
    """A job with its OpenAI link."""

    job: Job
    link: BatchLink


def _file(record: asyncpg.Record) -> StoredFile:
    return StoredFile(*(record[name] for name in StoredFile.__dataclass_fields__))


def _linked(record: asyncpg.Record) -> LinkedBatch:
    link = BatchLink(
        record["link_batch_id"],
        record["input_file_id"],
        record["output_file_id"],
        record["error_file_id"],
        record["endpoint"],
        record["completion_window"],
        record["link_errors"],
    )
    return LinkedBatch(Job.from_record(record), link)


class FileUpload:
    """One input file being stored, inside the upload's transaction."""

    def __init__(self, conn: Connection, file_id: str) -> None:
        self._conn = conn
        self.file_id = file_id
        self._parts = 0

    async def add_bytes(self, data: bytes) -> None:
        """Store the next bytes of the file, as parts of :data:`PART_BYTES` (the last
        call's last part may be shorter)."""
        first = self._parts
        count = -(-len(data) // PART_BYTES)
        self._parts += count
        view = memoryview(data)
        records = (
            (self.file_id, first + n, view[n * PART_BYTES : (n + 1) * PART_BYTES].tobytes())
            for n in range(count)
        )
        async with translated():
            await self._conn.copy_records_to_table(
                "file_parts", records=records, columns=("file_id", "part", "data")
            )

    async def add_rows(self, rows: Sequence[tuple[int, str, str]]) -> None:
        """Store parsed requests as ``(row_index, custom_id, request_json)``."""
        if not rows:
            return
        async with translated():
            await self._conn.copy_records_to_table(
                "batch_rows",
                records=with_models((self.file_id, i, cid, req) for i, cid, req in rows),
                columns=ROW_COLUMNS,
            )

    async def duplicate_ids(self, limit: int) -> list[tuple[str, int]]:
        """Up to ``limit`` custom ids stored more than once, each with the row index of
        its second occurrence, in row order."""
        async with translated():
            records = await first_repeats(self._conn, self.file_id, limit)
        return [(r[0], r[1]) for r in records]

    async def drop_rows(self) -> None:
        """Forget the parsed requests (a file with errors never runs)."""
        async with translated():
            await self._conn.execute("DELETE FROM batch_rows WHERE batch_id = $1", self.file_id)

    async def finish(
        self,
        workspace_id: str,
        filename: str,
        size: int,
        rows: int,
        model: str | None,
        line_errors: str | None,
        endpoint: str | None = None,
    ) -> StoredFile:
        """Record the file itself (committed with its parts and rows on leaving)."""
        async with translated():
            record = await self._conn.fetchrow(
                "INSERT INTO files (id, workspace_id, filename, purpose, bytes, rows, model,"
                " line_errors, endpoint) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
                f" RETURNING {_FILE_COLUMNS}",
                self.file_id,
                workspace_id,
                filename,
                INPUT_PURPOSE,
                size,
                rows,
                model,
                line_errors,
                endpoint,
            )
        assert record is not None  # INSERT … RETURNING gives its row
        return _file(record)


class FileStore:
    """The ``files``, ``file_parts`` and ``openai_batches`` queries of the OpenAI surface."""

    def __init__(self, pool: asyncpg.Pool, long_stores: asyncio.Semaphore | None = None) -> None:
        self._pool = pool
        self._storing = long_store_slots() if long_stores is None else long_stores
        self._measuring: dict[str, asyncio.Future[StoredFile | None]] = {}

    @asynccontextmanager
    async def upload(self, file_id: str) -> AsyncIterator[FileUpload]:
        """One transaction for storing a whole file: all of it, or nothing on error. It
        takes one of the long-store slots (``long_stores``, shared with the process's
        :class:`.jobs.JobStore` uploads) before a connection, so long stores never take
        the pool from other requests; the caller feeds it from local storage, never from
        a client."""
        async with long_store_slot(self._storing), translated(), self._pool.acquire() as conn:
            async with conn.transaction():
                yield FileUpload(conn, file_id)

    async def get(self, workspace_id: str, file_id: str) -> StoredFile | None:
        """The live file ``file_id`` of ``workspace_id``."""
        async with translated():
            record = await self._pool.fetchrow(
                f"SELECT {_FILE_COLUMNS} FROM files"
                " WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL",
                file_id,
                workspace_id,
            )
        return None if record is None else _file(record)

    async def list_page(
        self, workspace_id: str, limit: int, after: str | None, ascending: bool, purpose: str | None
    ) -> tuple[list[StoredFile], bool]:
        """Live files by creation time; ``after`` is the last id of the previous page."""
        direction, compare = ("ASC", ">") if ascending else ("DESC", "<")
        async with translated():
            records = await self._pool.fetch(
                f"SELECT {_FILE_COLUMNS} FROM files f WHERE workspace_id = $1"
                " AND deleted_at IS NULL AND ($4::text IS NULL OR purpose = $4)"
                f" AND ($2::text IS NULL OR (created_at, id) {compare} ("
                "   SELECT a.created_at, a.id FROM files a"
                "   WHERE a.id = $2 AND a.workspace_id = $1))"
                f" ORDER BY created_at {direction}, id {direction} LIMIT $3",
                workspace_id,
                after,
                limit + 1,
                purpose,
            )
        return [_file(r) for r in records[:limit]], len(records) > limit

    async def delete(self, workspace_id: str, file_id: str) -> bool:
        """Delete a live file: its parts, and its rows unless a batch runs them. False if
        there is no such live file."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            deleted = await conn.fetchval(
                "UPDATE files SET deleted_at = now()"
                " WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL RETURNING id",
                file_id,
                workspace_id,
            )
            if deleted is None:
                return False
            await conn.execute("DELETE FROM file_parts WHERE file_id = $1", file_id)
            await conn.execute(
                "DELETE FROM batch_rows WHERE batch_id = $1 AND NOT EXISTS ("
                " SELECT 1 FROM openai_batches o JOIN batches b ON b.id = o.batch_id"
                " WHERE o.input_file_id = $1)",
                file_id,
            )
        return True

    async def parts(self, file_id: str) -> AsyncIterator[bytes]:
        """The file's bytes as uploaded, one stored part (:data:`PART_BYTES`) per query,
        so a slow reader holds one part and no connection."""
        last = -1
        while True:
            async with translated():
                record = await self._pool.fetchrow(
                    "SELECT part, data FROM file_parts WHERE file_id = $1 AND part > $2"
                    " ORDER BY part LIMIT 1",
                    file_id,
                    last,
                )
            if record is None:
                return
            last = record[0]
            yield bytes(record[1])

    async def create_linked(
        self, new: NewJob, link: BatchLink, claim: IdempotencyClaim | None
    ) -> LinkedBatch | None:
        """Store a job over its input file's rows with its link and its
        ``Idempotency-Key`` response, in one transaction (:class:`KeyTaken`, nothing
        stored, if the key was used first); None, nothing stored, if the input file is no
        longer live. The file's row is share-locked meanwhile, so a concurrent delete
        either sees the job (and keeps the rows it runs) or wins first."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            linked = await conn.fetchval(
                "WITH live AS (SELECT id FROM files WHERE id = $3 AND workspace_id = $2"
                "  AND deleted_at IS NULL FOR SHARE)"
                " INSERT INTO openai_batches (batch_id, workspace_id, input_file_id,"
                " output_file_id, error_file_id, endpoint, completion_window, errors)"
                " SELECT $1, $2, $3, $4, $5, $6, $7, $8 FROM live RETURNING 1",
                *_link_values(new.workspace_id, link),
            )
            if linked is None:
                return None
            job = await insert_job(conn, new, ())
            if claim is not None:
                await record_response(conn, claim, 201, orjson.dumps(job.to_api()).decode())
        return LinkedBatch(job, link)

    async def create_failed(
        self, new: NewJob, link: BatchLink, claim: IdempotencyClaim | None
    ) -> LinkedBatch:
        """Store a job that failed validation (its input file's errors in ``link``) with
        its link, ended at once: no row of it ever runs, and every one of its ``total``
        requests is counted failed (``completed + failed == total`` as for any ended
        job, so the native API, the panel and the webhook agree)."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            await conn.execute(_INSERT_LINK, *_link_values(new.workspace_id, link))
            record = await conn.fetchrow(
                "INSERT INTO batches (id, workspace_id, name, model, priority, status, total,"
                " failed, rows_batch_id, params, metadata, expires_at, error, completed_at,"
                " completion_window, endpoint)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9, $10,"
                f" {EXPIRES_AT.format(deadline='$11', window='$13', cron='NULL')}, $12, now(), $13,"
                " $14)"
                " RETURNING *",
                new.id,
                new.workspace_id,
                new.name,
                new.model,
                new.priority,
                JobStatus.FAILED,
                new.total,
                new.rows_batch_id,
                new.params,
                new.metadata,
                new.expires_at,
                "input file failed validation",
                new.completion_window,
                new.endpoint,
            )
            job = Job.from_record(record)
            if claim is not None:
                await record_response(conn, claim, 201, orjson.dumps(job.to_api()).decode())
        return LinkedBatch(job, link)

    async def batch(self, workspace_id: str, batch_id: str) -> LinkedBatch | None:
        """The OpenAI batch ``batch_id`` of ``workspace_id``."""
        return await self._one_linked("o.batch_id = $1", batch_id, workspace_id)

    async def batch_page(
        self, workspace_id: str, limit: int, after: str | None
    ) -> tuple[list[LinkedBatch], bool]:
        """The workspace's OpenAI batches, newest first; ``after`` the previous page's last."""
        async with translated():
            records = await self._pool.fetch(
                f"SELECT b.*, {_LINK_COLUMNS} FROM openai_batches o"
                " JOIN batches b ON b.id = o.batch_id WHERE o.workspace_id = $1"
                " AND ($2::text IS NULL OR (o.created_at, o.batch_id) < ("
                "   SELECT a.created_at, a.batch_id FROM openai_batches a"
                "   WHERE a.batch_id = $2 AND a.workspace_id = $1))"
                " ORDER BY o.created_at DESC, o.batch_id DESC LIMIT $3",
                workspace_id,
                after,
                limit + 1,
            )
        return [_linked(r) for r in records[:limit]], len(records) > limit

    async def batch_of_output(self, workspace_id: str, file_id: str) -> LinkedBatch | None:
        """The batch whose output or error file ``file_id`` is."""
        where = "(o.output_file_id = $1 OR o.error_file_id = $1)"
        return await self._one_linked(where, file_id, workspace_id)

    async def _one_linked(self, where: str, value: str, workspace_id: str) -> LinkedBatch | None:
        """The OpenAI batch of ``workspace_id`` (``$2``) that ``where`` picks by ``$1``."""
        async with translated():
            record = await self._pool.fetchrow(
                f"SELECT b.*, {_LINK_COLUMNS} FROM openai_batches o"
                f" JOIN batches b ON b.id = o.batch_id WHERE {where} AND o.workspace_id = $2",
                value,
                workspace_id,
            )
        return None if record is None else _linked(record)

    async def file_known(self, workspace_id: str, file_id: str) -> bool:
        """Whether ``file_id`` was ever registered, deleted or not."""
        async with translated():
            found = await self._pool.fetchval(
                "SELECT 1 FROM files WHERE id = $1 AND workspace_id = $2", file_id, workspace_id
            )
        return found is not None

    async def output_file_once(
        self,
        workspace_id: str,
        file_id: str,
        filename: str,
        created_at: datetime,
        measure: Callable[[], Awaitable[int]],
    ) -> StoredFile | None:
        """The output or error file ``file_id``, registered with the size ``measure``
        gives if it is not yet known: one measurement at a time per file in this process
        (concurrent callers wait for it; one that gives up does not stop it for the
        others); None once deleted."""
        found = await self.get(workspace_id, file_id)
        if found is not None or await self.file_known(workspace_id, file_id):
            return found
        running = self._measuring.get(file_id)
        if running is None:

            async def register() -> StoredFile | None:
                size = await measure()
                return await self.add_output_file(workspace_id, file_id, filename, size, created_at)

            running = asyncio.ensure_future(register())
            self._measuring[file_id] = running
            running.add_done_callback(lambda _: self._measuring.pop(file_id, None))
        return await asyncio.shield(running)

    async def add_output_file(
        self, workspace_id: str, file_id: str, filename: str, size: int, created_at: datetime
    ) -> StoredFile | None:
        """Register an output or error file of ``size`` bytes (once: a second call, or a
        call after it was deleted, changes nothing); the live file, None if deleted."""
        async with translated():
            await self._pool.execute(
                "INSERT INTO files (id, workspace_id, filename, purpose, bytes, created_at)"
                " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
                file_id,
                workspace_id,
                filename,
                OUTPUT_PURPOSE,
                size,
                created_at,
            )
        return await self.get(workspace_id, file_id)

    async def delete_output_file(
        self, workspace_id: str, file_id: str, filename: str, created_at: datetime
    ) -> None:
        """Delete an output or error file, registered or not, so it is never shown."""
        async with translated():
            await self._pool.execute(
                "INSERT INTO files (id, workspace_id, filename, purpose, bytes, created_at,"
                " deleted_at) VALUES ($1, $2, $3, $4, 0, $5, now())"
                " ON CONFLICT (id) DO UPDATE SET deleted_at = now()"
                " WHERE files.deleted_at IS NULL",
                file_id,
                workspace_id,
                filename,
                OUTPUT_PURPOSE,
                created_at,
            )


_INSERT_LINK = (
    "INSERT INTO openai_batches (batch_id, workspace_id, input_file_id, output_file_id,"
    " error_file_id, endpoint, completion_window, errors) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
)


def _link_values(workspace_id: str, link: BatchLink) -> tuple[object, ...]:
    return (
        link.batch_id,
        workspace_id,
        link.input_file_id,
        link.output_file_id,
        link.error_file_id,
        link.endpoint,
        link.completion_window,
        link.errors,
    )
