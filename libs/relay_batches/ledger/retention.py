"""Retention: purging ended jobs past their workspace's retention, settled provider
batch records past the default retention, and idempotency records past their 24 hours,
in bounded transactions.

A job is purged by :func:`~relay_batches.ledger.deletion.delete_job` (so a purge removes
exactly what ``DELETE /v1/batches/{id}`` removes: outcomes, own rows unless another job
runs them, the webhook delivery and its attempts, the idempotency record naming it, an
OpenAI link with its output and error file records) inside a transaction that first
claims the due jobs with ``FOR UPDATE SKIP LOCKED``: several reapers at once each take
other jobs, and each job is purged by one of them. A transaction takes at most
``jobs`` jobs and, counting each job's ``total``, at most ``rows`` rows; a single job
larger than that first loses its outcomes and own rows a slice at a time, one
transaction each (a job that is past its retention anyway), and is then deleted. Live
jobs are never due, nor is a scheduled cron template: only the terminal statuses are
scanned. A canceled template is an ended job like any other: it goes, and the runs it
spawned keep the rows they still run (delete_job frees them with the last one).

An offloader's provider batch record (``offload_batches``) goes once it is ``settled``
(its final state) and ended (``ended_at``) longer than the default retention ago, and
none of its rows still waits to go realtime (``forward``): each row still naming it
(``done``, ``forwarded`` or ``dropped``: nothing reads that name again) is detached from
it, a bounded slice per transaction, and the record is deleted once none names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from relay_batches.ledger.deletion import Deleted, delete_job
from relay_batches.ledger.idempotency import TTL_HOURS
from relay_batches.ledger.offload import BatchState, RowState
from relay_batches.ledger.pool import Connection, translated
from relay_batches.ledger.status_sql import status_in
from relay_batches.model import TERMINAL

# $1 the default retention, $2 at most this many. The shortest retention of any
# workspace bounds the scan of the batches_ended index (an init plan, computed once);
# each job is then held to its own workspace's. Jobs another reaper (or a DELETE) holds
# are skipped inside the scan, so a second reaper takes the next ones. delete_job also
# locks a job's original and retries (issue 14): those are taken here too, skipping
# any held elsewhere, and a job whose relatives were not all taken waits for a later
# transaction. So a reaper never waits on a job's row, and its order of locking cannot
# close a cycle with anyone's.
_CLAIM_DUE = (
    "WITH due AS (SELECT b.id, b.workspace_id, b.total, b.rows_batch_id,"
    "  array_remove(array_append(b.retries, b.retry_of), NULL) AS related"
    "  FROM batches b JOIN workspaces w ON w.id = b.workspace_id"
    f"  WHERE {status_in(TERMINAL)}"
    "  AND b.completed_at < now()"
    "   - (SELECT LEAST($1::interval, min(retention)) FROM workspaces)"
    "  AND b.completed_at < now() - COALESCE(w.retention, $1::interval)"
    "  ORDER BY b.completed_at LIMIT $2 FOR UPDATE OF b SKIP LOCKED),"
    " held AS MATERIALIZED (SELECT r.id FROM batches r"
    "  WHERE r.id IN (SELECT unnest(related) FROM due) AND r.id NOT IN (SELECT id FROM due)"
    "  FOR UPDATE SKIP LOCKED)"
    " SELECT d.id, d.workspace_id, d.total, d.rows_batch_id FROM due d"
    " WHERE d.related <@ ARRAY(SELECT id FROM due UNION ALL SELECT id FROM held)"
)
# A job too large for one transaction loses its outcomes, its offload rows and its own
# rows (the rows delete_job would delete: none another job still runs) a bounded slice at
# a time, in row order (the primary keys), before delete_job takes what is left.
_TRIM_OUTCOMES = (
    "DELETE FROM row_results r USING (SELECT row_index FROM row_results WHERE batch_id = $1"
    "  ORDER BY row_index LIMIT $2) t WHERE r.batch_id = $1 AND r.row_index = t.row_index"
)
_TRIM_OWN_ROWS = (
    "DELETE FROM batch_rows r USING (SELECT row_index FROM batch_rows WHERE batch_id = $1"
    "  AND NOT EXISTS (SELECT 1 FROM batches WHERE rows_batch_id = $1 AND id <> $1)"
    "  ORDER BY row_index LIMIT $2) t WHERE r.batch_id = $1 AND r.row_index = t.row_index"
)
_TRIM_OFFLOAD_ROWS = (
    "DELETE FROM offload_rows r USING (SELECT row_index FROM offload_rows WHERE batch_id = $1"
    "  ORDER BY row_index LIMIT $2) t WHERE r.batch_id = $1 AND r.row_index = t.row_index"
)
# $1 the default retention, $2 at most this many: settled provider batch records ended
# before it, none of whose rows is still to be forwarded (index offload_batches_settled;
# the rows by offload_rows_provider_batch). Records another reaper holds are skipped.
_CLAIM_OFFLOADS = (
    "SELECT b.id FROM offload_batches b"
    f" WHERE b.state = '{BatchState.SETTLED}' AND b.ended_at < now() - $1::interval"
    "  AND NOT EXISTS (SELECT 1 FROM offload_rows o WHERE o.provider_batch = b.id"
    f"   AND o.state NOT IN ('{RowState.DONE}', '{RowState.FORWARDED}', '{RowState.DROPPED}'))"
    " ORDER BY b.ended_at, b.id LIMIT $2 FOR UPDATE OF b SKIP LOCKED"
)
# $1 the claimed records, $2 at most this many rows: those rows stop naming their
# record. Rows held elsewhere (a job's delete takes them) are skipped; their record
# waits for a later transaction.
_DETACH_ROWS = (
    "UPDATE offload_rows o SET provider_batch = NULL FROM (SELECT batch_id, row_index"
    "  FROM offload_rows WHERE provider_batch = ANY($1::bigint[])"
    "  ORDER BY provider_batch, batch_id, row_index LIMIT $2 FOR UPDATE SKIP LOCKED) t"
    " WHERE o.batch_id = t.batch_id AND o.row_index = t.row_index"
)
_DELETE_OFFLOADS = (
    "DELETE FROM offload_batches b WHERE b.id = ANY($1::bigint[])"
    " AND NOT EXISTS (SELECT 1 FROM offload_rows o WHERE o.provider_batch = b.id)"
)
# $1 at most this many records past their TTL (expired: find() no longer answers them).
_PURGE_KEYS = (
    "WITH old AS (SELECT workspace_id, key FROM idempotency_keys"
    f"  WHERE created_at < now() - interval '{TTL_HOURS} hours'"
    "  ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
    " DELETE FROM idempotency_keys k USING old"
    " WHERE k.workspace_id = old.workspace_id AND k.key = old.key"
)


@dataclass(frozen=True, slots=True)
class Purged:
    """What one purge transaction removed: jobs, the rows those jobs had (``total``), and
    the rows (outcomes and input) trimmed off a job too large to go in one."""

    jobs: int
    rows: int
    trimmed: int = 0


@dataclass(frozen=True, slots=True)
class PurgedOffloads:
    """What one purge transaction of provider batch records did: records deleted, and
    rows detached from the records it claimed."""

    records: int
    detached: int


@dataclass(frozen=True, slots=True)
class _Claimed:
    id: str
    workspace_id: str
    total: int
    rows_batch_id: str = ""


def within_budget(claimed: list[_Claimed], rows: int) -> list[_Claimed]:
    """The leading claimed jobs whose totals add up to at most ``rows`` (at least one)."""
    taken: list[_Claimed] = []
    used = 0
    for job in claimed:
        if taken and used + job.total > rows:
            break
        taken.append(job)
        used += job.total
    return taken


class RetentionStore:
    """Purges what retention no longer keeps, a bounded transaction at a time."""

    def __init__(
        self, pool: asyncpg.Pool, retention: timedelta, *, jobs: int = 50, rows: int = 50_000
    ) -> None:
        self._pool = pool
        self._retention = retention
        self._jobs = jobs
        self._rows = rows

    async def purge_jobs(self) -> Purged:
        """Purge, in one transaction, up to the budget of due ended jobs, oldest end
        first; what it purged (a job is counted by the one call that deleted it)."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            records = await conn.fetch(_CLAIM_DUE, self._retention, self._jobs)
            taken = within_budget([_Claimed(*r) for r in records], self._rows)
            if len(taken) == 1 and taken[0].total > self._rows:
                trimmed = await self._trim(conn, taken[0].id)
                if trimmed:
                    return Purged(0, 0, trimmed)
            # delete_job takes an advisory lock on each job's rows id: in that order,
            # so two reapers never wait on each other's.
            purged = [
                job
                for job in sorted(taken, key=lambda job: (job.rows_batch_id, job.id))
                if await delete_job(conn, job.workspace_id, job.id) is Deleted.DELETED
            ]
        return Purged(len(purged), sum(job.total for job in purged))

    async def _trim(self, conn: Connection, batch_id: str) -> int:
        """Delete a slice of the job's outcomes, own rows and offload rows (half the
        budget each); how many, or 0 when the slices were not full (delete_job may take
        the rest now)."""
        half = max(1, self._rows // 2)
        counts = [
            _count(await conn.execute(statement, batch_id, half))
            for statement in (_TRIM_OUTCOMES, _TRIM_OWN_ROWS, _TRIM_OFFLOAD_ROWS)
        ]
        return sum(counts) if half in counts else 0

    async def purge_offload_batches(self) -> PurgedOffloads:
        """In one transaction, detach up to the row budget of the rows still naming up
        to ``jobs`` due settled provider batch records (oldest end first) and delete those
        no row names any more; what it did."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            ids = [r[0] for r in await conn.fetch(_CLAIM_OFFLOADS, self._retention, self._jobs)]
            if not ids:
                return PurgedOffloads(0, 0)
            detached = _count(await conn.execute(_DETACH_ROWS, ids, self._rows))
            deleted = _count(await conn.execute(_DELETE_OFFLOADS, ids))
        return PurgedOffloads(deleted, detached)

    async def purge_idempotency_keys(self, limit: int = 5_000) -> int:
        """Delete up to ``limit`` idempotency records older than their TTL; how many."""
        async with translated():
            status = await self._pool.execute(_PURGE_KEYS, limit)
        return _count(status)


def _count(status: str) -> int:
    """The row count of a command status such as ``DELETE 12``."""
    return int(status.split()[-1])


async def set_workspace_retention(
    pool: asyncpg.Pool, name: str, retention: timedelta | None
) -> bool:
    """Keep workspace ``name``'s ended jobs for ``retention`` (None: the default,
    ``RELAY_RETENTION``); False when there is no such workspace."""
    async with translated():
        found = await pool.fetchval(
            "UPDATE workspaces SET retention = $2 WHERE name = $1 RETURNING true", name, retention
        )
    return bool(found)
