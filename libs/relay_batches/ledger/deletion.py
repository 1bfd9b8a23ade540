"""Deleting an ended job and everything the ledger holds for it, whichever surface asks.

One transaction, one set-based statement per table, the job's row (with its runs, in id
order) locked first: its
outcomes (``row_results``), its own input rows (``batch_rows`` stored under its id) unless
another job still runs them (a cron template's runs, which name the template in
``rows_batch_id``), its webhook delivery, the ``Idempotency-Key`` record whose stored
response is the job (a replay would point at a job that is gone; an upload's list
response naming several jobs is kept, so its replay never re-creates the others), an
OpenAI batch's link and its output and error file records, then the job itself. Rows
the job ran but does not own (an uploaded file's, a live template's) are never touched.
The runs of a deleted cron template keep their rows and lose only their ``template_id``;
those rows, still stored under the template's id, go with the last run that used them
(the job that runs rows of a template which no longer exists and which no other job
runs). Every deletion of a job running someone's rows takes a transaction-level
advisory lock on that rows id, so two runs deleted at once cannot each leave the rows to
the other.

Retries (issue 14): a deleted retry leaves its original's ``retries``; a deleted
original's retries keep their rows and lose only their ``retry_of``. The original and
the retries are locked with the job, in id order, so nothing names a deleted job.

Only an ended job may be deleted (:data:`~relay_batches.model.TERMINAL`): a live one
still has workers writing its outcomes. A scheduled cron template spawns new jobs but
runs no rows itself, so the native surface may delete it too (``templates=True``): it
is gone, and the scheduler, which finds due templates in the ledger, never sees it
again. Afterwards nothing names the job: every surface answers 404 for it.
"""

from __future__ import annotations

from enum import StrEnum

import asyncpg

from relay_batches.errors import ConflictError
from relay_batches.ledger.lock_order import update_jobs_in_id_order
from relay_batches.ledger.pool import Connection, translated
from relay_batches.model import TERMINAL, JobStatus

# The job and the runs it spawned (a cron template's), locked together in id order
# (ledger/lock_order.py): the aggregator locks jobs by id, so locking the template first
# and its runs after could close a cycle with it.
# Its original and its retries (issue 14) are locked with it: both are updated below.
_LOCK_JOB = (
    "SELECT id, status, rows_batch_id FROM batches"
    " WHERE (id = $1 AND workspace_id = $2) OR template_id = $1"
    " OR id IN (SELECT unnest(array_append(retries, retry_of)) FROM batches"
    "  WHERE id = $1 AND workspace_id = $2)"
    " ORDER BY id FOR UPDATE"
)
# $1 the rows id the job runs: deletions of jobs sharing those rows, one at a time.
_LOCK_ROWS = "SELECT pg_advisory_xact_lock(hashtext('relay.batch_rows'), hashtext($1))"
# $1 the rows id the job ($2) runs, stored under a job that no longer exists (a deleted
# template's): freed once no other job runs them. An uploaded file's rows ($1 is a
# file's id) are the file's, freed with it.
_DELETE_ORPHANED_ROWS = (
    "DELETE FROM batch_rows WHERE batch_id = $1 AND $1 <> $2"
    " AND NOT EXISTS (SELECT 1 FROM batches WHERE id = $1)"
    " AND NOT EXISTS (SELECT 1 FROM files WHERE id = $1)"
    " AND NOT EXISTS (SELECT 1 FROM batches WHERE rows_batch_id = $1 AND id <> $2)"
)
# The deleted job leaves its original's list of retries, and its retries' retry_of: rows
# _LOCK_JOB locked already, in id order, so these plain updates wait for no one.
_UNLIST_RETRY = (
    "UPDATE batches o SET retries = array_remove(o.retries, $1)"
    " FROM batches r WHERE r.id = $1 AND o.id = r.retry_of"
)
_DETACH_RETRIES = (
    "UPDATE batches SET retry_of = NULL"
    " WHERE id = ANY((SELECT retries FROM batches WHERE id = $1)::text[]) AND retry_of = $1"
)
_DELETE_OUTCOMES = "DELETE FROM row_results WHERE batch_id = $1"
# Its rows' offload records (the foreign key cascades too; said here so the deletion
# reads whole). The provider batches they were in stay, settled, for their other rows.
_DELETE_OFFLOAD_ROWS = "DELETE FROM offload_rows WHERE batch_id = $1"
# Rows stored under the job's id, unless another job runs them (rows_batch_id).
_DELETE_OWN_ROWS = (
    "DELETE FROM batch_rows WHERE batch_id = $1"
    " AND NOT EXISTS (SELECT 1 FROM batches WHERE rows_batch_id = $1 AND id <> $1)"
)
_DELETE_DELIVERY = "DELETE FROM webhook_deliveries WHERE batch_id = $1"
_DELETE_ATTEMPTS = "DELETE FROM webhook_attempts WHERE batch_id = $1"
# The record whose stored response is this job alone (a create's 201/200: one object
# whose id is the job's, bare or with a dialect's prefix); the strpos only spares
# casting every record.
# A list response (an upload's 201, naming several jobs) stays: the key still stands for
# that upload, so a replay answers the stored list (the deleted job's id in it is a 404)
# and never creates the upload's surviving jobs a second time.
_DELETE_IDEMPOTENCY = (
    "DELETE FROM idempotency_keys WHERE workspace_id = $2 AND strpos(response_body, $1) > 0"
    " AND response_body::jsonb ->> 'id' IN ($1, 'batch_' || $1, 'msgbatch_' || $1)"
)
# An OpenAI batch's input file, its row locked: a concurrent FileStore.delete either
# commits first (deleted_at is seen here) or waits and then sees the link gone.
_LOCK_INPUT_FILE = (
    "SELECT f.id, f.deleted_at IS NOT NULL AS deleted FROM openai_batches o"
    " JOIN files f ON f.id = o.input_file_id WHERE o.batch_id = $1 AND o.workspace_id = $2"
    " FOR UPDATE OF f"
)
# The job's OpenAI link and the records of its output and error files (rendered from the
# job, they cannot outlive it; they have no parts).
_DELETE_LINK = (
    "WITH link AS (DELETE FROM openai_batches WHERE batch_id = $1 AND workspace_id = $2"
    "  RETURNING output_file_id, error_file_id)"
    " DELETE FROM files f USING link"
    " WHERE f.id IN (link.output_file_id, link.error_file_id) AND f.purpose = 'batch_output'"
)
# A deleted input file's rows, kept while this job ran them, once nothing else does.
_DELETE_FREED_INPUT_ROWS = (
    "DELETE FROM batch_rows WHERE batch_id = $1"
    " AND NOT EXISTS (SELECT 1 FROM openai_batches WHERE input_file_id = $1)"
    " AND NOT EXISTS (SELECT 1 FROM batches WHERE rows_batch_id = $1 AND id <> $2)"
)
_DETACH_RUNS = update_jobs_in_id_order("template_id = $1", "template_id = NULL")
_DELETE_JOB = "DELETE FROM batches WHERE id = $1 AND workspace_id = $2"

# In this order: everything naming the job goes before the job (foreign keys).
_BY_ID = (
    _DELETE_OUTCOMES,
    _DELETE_OFFLOAD_ROWS,
    _DELETE_OWN_ROWS,
    _DELETE_ATTEMPTS,
    _DELETE_DELIVERY,
    _DETACH_RUNS,
    _UNLIST_RETRY,
    _DETACH_RETRIES,
)
_BY_ID_AND_WORKSPACE = (_DELETE_IDEMPOTENCY, _DELETE_JOB)


class Deleted(StrEnum):
    """What :func:`delete_job` did."""

    DELETED = "deleted"
    NOT_FOUND = "not_found"  # no such job in the workspace


class StillLive(ConflictError):
    """The job has not ended; ``status`` is the one it has."""

    def __init__(self, batch_id: str, status: JobStatus) -> None:
        super().__init__(batch_id)
        self.status = status


async def delete_job(
    conn: Connection, workspace_id: str, batch_id: str, *, templates: bool = False
) -> Deleted:
    """Delete the ended job ``batch_id`` of ``workspace_id`` with its outcomes, its own
    rows, its delivery and the idempotency records naming it, in one transaction; with
    ``templates`` a scheduled cron template too.

    :class:`StillLive` (and nothing deleted) while the job is queued, running or paused
    (or scheduled, without ``templates``); :attr:`Deleted.NOT_FOUND` when the workspace
    has no such job.
    """
    deletable = TERMINAL | {JobStatus.SCHEDULED} if templates else TERMINAL
    async with conn.transaction():
        locked = await conn.fetch(_LOCK_JOB, batch_id, workspace_id)
        target = next((r for r in locked if r["id"] == batch_id), None)
        if target is None:
            return Deleted.NOT_FOUND
        if JobStatus(target["status"]) not in deletable:
            raise StillLive(batch_id, JobStatus(target["status"]))
        rows_id = target["rows_batch_id"]
        await conn.execute(_LOCK_ROWS, rows_id)
        for statement in _BY_ID:
            await conn.execute(statement, batch_id)
        await conn.execute(_DELETE_ORPHANED_ROWS, rows_id, batch_id)
        await _delete_openai_link(conn, workspace_id, batch_id)
        for statement in _BY_ID_AND_WORKSPACE:
            await conn.execute(statement, batch_id, workspace_id)
    return Deleted.DELETED


async def _delete_openai_link(conn: Connection, workspace_id: str, batch_id: str) -> None:
    """Drop the job's OpenAI link and output/error file records; free its input file's
    rows if that file was deleted while the job ran them."""
    input_file = await conn.fetchrow(_LOCK_INPUT_FILE, batch_id, workspace_id)
    await conn.execute(_DELETE_LINK, batch_id, workspace_id)
    if input_file is not None and input_file["deleted"]:
        await conn.execute(_DELETE_FREED_INPUT_ROWS, input_file["id"], batch_id)


class JobDeletion:
    """:func:`delete_job` on connections of a pool, driver errors translated."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def delete(self, workspace_id: str, batch_id: str, *, templates: bool = False) -> Deleted:
        """See :func:`delete_job`."""
        async with translated(), self._pool.acquire() as conn:
            return await delete_job(conn, workspace_id, batch_id, templates=templates)
