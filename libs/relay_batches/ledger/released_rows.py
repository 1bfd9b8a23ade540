"""The dispatcher's reads of a job's rows: the rows to release, the rows still without
an outcome, the rows handed back unstarted, and the bytes of a job's messages in the
broker (its byte window). :class:`~relay_batches.ledger.dispatch.DispatchStore` adds the
leases and claims."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from relay_batches.ledger.pool import translated
from relay_batches.ledger.unfinished import no_outcome, without_outcome
from relay_batches.model import JobStatus


@dataclass(frozen=True)
class ByteWindow:
    """A job's message text in the broker and the sizes of the rows that could go next.

    ``in_flight`` counts the rows below ``dispatched_upto`` without an outcome, from
    ``first_unfinished`` on (None when all of them have one); ``next_rows`` is
    ``(row_index, size)`` of the rows without an outcome from ``dispatched_upto`` on.
    """

    in_flight: int
    first_unfinished: int | None
    next_rows: list[tuple[int, int]]


class ReleasedRows:
    """Row reads of the jobs a dispatcher releases."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def fetch_rows(
        self, job_id: str, rows_batch_id: str, start: int, end: int
    ) -> list[tuple[int, str]]:
        """Rows ``start <= index < end`` of a job's input that have no outcome yet, in order.

        Rows that already have an outcome are never released again (a dispatcher that
        resumes or re-publishes after a stall skips them).
        """
        async with translated():
            records = await self._pool.fetch(
                "SELECT r.row_index, r.request FROM batch_rows r"
                " WHERE r.batch_id = $2 AND r.row_index >= $3 AND r.row_index < $4"
                " AND NOT EXISTS (SELECT 1 FROM row_results o"
                "   WHERE o.batch_id = $1 AND o.row_index = r.row_index"
                # The range again, so even a generic plan reads only this slice's
                # outcomes through the primary key (never all of the job's results).
                "   AND o.row_index >= $3 AND o.row_index < $4)"
                " ORDER BY r.row_index",
                job_id,
                rows_batch_id,
                start,
                end,
            )
        return [(r[0], r[1]) for r in records]

    async def unfinished_rows(self, job_id: str, start: int, end: int) -> list[int]:
        """Indexes ``start <= index < end`` of a job's rows that have no outcome yet."""
        async with translated():
            records = await self._pool.fetch(_UNFINISHED, job_id, start, end)
        return [r[0] for r in records]

    async def fetch_rows_at(
        self, job_id: str, rows_batch_id: str, indexes: list[int]
    ) -> list[tuple[int, str]]:
        """The input rows at ``indexes`` that still have no outcome, in index order."""
        if not indexes:
            return []
        async with translated():
            records = await self._pool.fetch(_ROWS_AT, job_id, rows_batch_id, indexes)
        return [(r[0], r[1]) for r in records]

    async def take_returned(self, owner: str, job_id: str) -> list[tuple[int, str]]:
        """The rows of ``job_id`` that row-workers handed back unstarted (a pause) and
        that still have no outcome, in index order, marked taken in ``returned_rows`` in
        the same statement (so each goes out again once); nothing while the job is not ours
        and running. Like :meth:`advance`, taking comes before the publish: a row taken
        that never goes out (a crash in between) is lost, and stall recovery re-sends it.
        A job its budget stopped takes them too: they were released before the stop, and
        the row-workers withhold them."""
        async with translated():
            records = await self._pool.fetch(_TAKE_RETURNED, owner, job_id, JobStatus.RUNNING)
        return [(r[0], r[1]) for r in records]

    async def byte_window(
        self, job_id: str, rows_batch_id: str, settled_below: int, upto: int, end: int
    ) -> ByteWindow:
        """Bytes of messages in flight (rows ``settled_below <= index < upto`` without an
        outcome: rows below ``settled_below`` are known to have one) and the sizes of the
        unfinished rows ``upto <= index < end``. Sizes are stored lengths (octet_length
        does not read a value to measure it)."""
        async with translated():
            record = await self._pool.fetchrow(
                _BYTE_WINDOW, job_id, rows_batch_id, min(settled_below, upto), upto, end
            )
        assert record is not None
        return ByteWindow(record[0], record[1], list(zip(record[2], record[3], strict=True)))


# $1 job id, $2 start, $3 end: the indexes of the range without an outcome.
_UNFINISHED = (
    "SELECT w.row_index FROM ("
    + without_outcome(
        "SELECT i, 1 FROM generate_series($2::int, $3::int - 1) AS i", "$1", "$2", "$3"
    )
    + ") w"
    # A row handed back unstarted is not lost: the next top-up releases it again.
    " WHERE NOT EXISTS (SELECT 1 FROM returned_rows x"
    "   WHERE x.batch_id = $1 AND x.row_index = w.row_index AND NOT x.taken)"
    " ORDER BY w.row_index"
)

# $1 job id, $2 rows batch id, $3 indexes (a few slices' worth): a probe per row.
_ROWS_AT = (
    "SELECT r.row_index, r.request FROM batch_rows r"
    " WHERE r.batch_id = $2 AND r.row_index = ANY($3::int[])"
    f" AND {no_outcome('$1', 'r.row_index')} ORDER BY r.row_index"
)

# --- the byte window ----------------------------------------------------------------

# $1 job, $2 the batch whose rows it uses, $3..$4 rows in flight, $4..$5 rows to come.
# The rows in flight are mostly answered, and their range may be long (all the rows
# released since the last reading; all of them when a dispatcher takes a job over): a
# set difference (see ledger/unfinished). The rows to come have no outcome (they are at
# and past dispatched_upto), so the anti-join's inner side is empty whatever its plan.
_FLYING = without_outcome(
    "SELECT r.row_index, octet_length(r.request) FROM batch_rows r"
    " WHERE r.batch_id = $2 AND r.row_index >= $3 AND r.row_index < $4",
    "$1",
    "$3",
    "$4",
)
_COMING = (
    "SELECT r.row_index, octet_length(r.request) AS size FROM batch_rows r"
    " WHERE r.batch_id = $2 AND r.row_index >= $4 AND r.row_index < $5"
    " AND NOT EXISTS (SELECT 1 FROM row_results o WHERE o.batch_id = $1"
    "   AND o.row_index = r.row_index AND o.row_index >= $4 AND o.row_index < $5)"
)
_BYTE_WINDOW = (
    f"WITH flying (row_index, size) AS ({_FLYING}), coming AS ({_COMING})"
    " SELECT (SELECT COALESCE(sum(size), 0)::bigint FROM flying),"
    " (SELECT min(row_index) FROM flying),"
    " ARRAY(SELECT row_index FROM coming ORDER BY row_index),"
    " ARRAY(SELECT size FROM coming ORDER BY row_index)"
)

# $1 owner, $2 job, $3 running: the job's returned rows, marked taken, with their input.
_TAKE_RETURNED = (
    "WITH job AS (SELECT id, rows_batch_id FROM batches"
    "  WHERE id = $2 AND lease_owner = $1 AND status = $3),"
    " taken AS (UPDATE returned_rows x SET taken = true FROM job"
    "  WHERE x.batch_id = job.id AND NOT x.taken RETURNING x.row_index)"
    " SELECT r.row_index, r.request FROM batch_rows r JOIN job ON r.batch_id = job.rows_batch_id"
    " WHERE r.row_index IN (SELECT row_index FROM taken)"
    " AND NOT EXISTS (SELECT 1 FROM row_results o"
    "   WHERE o.batch_id = $2 AND o.row_index = r.row_index)"
    " ORDER BY r.row_index"
)
