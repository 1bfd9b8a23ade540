"""Deleting an ended job and everything the ledger holds for it, whichever surface asks.

One transaction, one set-based statement per table, the job's row locked first: its
outcomes (``row_results``), its own input rows (``batch_rows`` stored under its id) unless
another job still runs them (a cron template's runs, which name the template in
``rows_batch_id``), its webhook delivery, the ``Idempotency-Key`` records whose stored
response names it (a replay would point at a job that is gone), then the job itself. Rows
the job ran but does not own (an uploaded file's, a template's) are never touched. The
runs of a deleted cron template keep their rows and lose only their ``template_id``.

Only an ended job may be deleted (:data:`~relay_batches.model.TERMINAL`): a live one
still has workers writing its outcomes. Afterwards nothing names the job: every surface
answers 404 for it.
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
_LOCK_JOB = (
    "SELECT id, status FROM batches"
    " WHERE (id = $1 AND workspace_id = $2) OR template_id = $1 ORDER BY id FOR UPDATE"
)
_DELETE_OUTCOMES = "DELETE FROM row_results WHERE batch_id = $1"
# Rows stored under the job's id, unless another job runs them (rows_batch_id).
_DELETE_OWN_ROWS = (
    "DELETE FROM batch_rows WHERE batch_id = $1"
    " AND NOT EXISTS (SELECT 1 FROM batches WHERE rows_batch_id = $1 AND id <> $1)"
)
_DELETE_DELIVERY = "DELETE FROM webhook_deliveries WHERE batch_id = $1"
# A stored response names the job by its 32-hex id (bare, or inside a dialect's prefixed
# id): 128 random bits never occur in a body by chance.
_DELETE_IDEMPOTENCY = (
    "DELETE FROM idempotency_keys WHERE workspace_id = $2 AND strpos(response_body, $1) > 0"
)
_DETACH_RUNS = update_jobs_in_id_order("template_id = $1", "template_id = NULL")
_DELETE_JOB = "DELETE FROM batches WHERE id = $1 AND workspace_id = $2"

# In this order: everything naming the job goes before the job (foreign keys).
_BY_ID = (_DELETE_OUTCOMES, _DELETE_OWN_ROWS, _DELETE_DELIVERY, _DETACH_RUNS)
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


async def delete_job(conn: Connection, workspace_id: str, batch_id: str) -> Deleted:
    """Delete the ended job ``batch_id`` of ``workspace_id`` with its outcomes, its own
    rows, its delivery and the idempotency records naming it, in one transaction.

    :class:`StillLive` (and nothing deleted) while the job is queued, scheduled or
    running; :attr:`Deleted.NOT_FOUND` when the workspace has no such job.
    """
    async with conn.transaction():
        locked = await conn.fetch(_LOCK_JOB, batch_id, workspace_id)
        status = next((r["status"] for r in locked if r["id"] == batch_id), None)
        if status is None:
            return Deleted.NOT_FOUND
        if JobStatus(status) not in TERMINAL:
            raise StillLive(batch_id, JobStatus(status))
        for statement in _BY_ID:
            await conn.execute(statement, batch_id)
        for statement in _BY_ID_AND_WORKSPACE:
            await conn.execute(statement, batch_id, workspace_id)
    return Deleted.DELETED


class JobDeletion:
    """:func:`delete_job` on connections of a pool, driver errors translated."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def delete(self, workspace_id: str, batch_id: str) -> Deleted:
        """See :func:`delete_job`."""
        async with translated(), self._pool.acquire() as conn:
            return await delete_job(conn, workspace_id, batch_id)
