"""A retry of a job's failed rows: a new job of exactly those rows, made in one transaction.

:meth:`relay_batches.ledger.jobs.JobStore.create_retry` locks the original, copies the
rows it selects (set-based ``INSERT … SELECT``, renumbered from 0 in row order, with
their ``custom_id`` and stored request), inserts the new job over them with the
original's settings, and appends the new id to the original's ``retries``.
"""

from __future__ import annotations

from enum import StrEnum

from relay_batches.errors import ConflictError, RelayError
from relay_batches.ledger.pool import Connection
from relay_batches.model import TERMINAL, Job, JobStatus


class RetryRows(StrEnum):
    """Which rows of the original a retry takes."""

    FAILED = "failed"  # every row with an error outcome
    DEAD_LETTER = "dead_letter"  # the rows on its dead-letter list


class NothingToRetry(RelayError):
    """The original has no row of the kind asked for."""


_CHOSEN = {
    RetryRows.FAILED: "o.error IS NOT NULL",
    RetryRows.DEAD_LETTER: "o.dead_letter",
}

# $1 original id, $2 workspace: the original, locked so two retries of it append to its
# retries one after the other.
_LOCK_ORIGINAL = (
    "SELECT status, rows_batch_id FROM batches WHERE id = $1 AND workspace_id = $2 FOR UPDATE"
)

# $1 new id, $2 original id, $3 the batch whose rows the original uses: the chosen rows
# copied under the new id, numbered from 0 in the original's row order; how many.
_COPY_ROWS = (
    "WITH copied AS ("
    " INSERT INTO batch_rows (batch_id, row_index, custom_id, request, model)"
    " SELECT $1, (row_number() OVER (ORDER BY o.row_index) - 1)::int, r.custom_id, r.request,"
    "  r.model"
    " FROM row_results o JOIN batch_rows r ON r.batch_id = $3 AND r.row_index = o.row_index"
    " WHERE o.batch_id = $2 AND {chosen}"
    " RETURNING 1)"
    " SELECT count(*)::int FROM copied"
)

# $1 new id, $2 original id, $3 queued, $4 total: the new job over its own rows with the
# original's name, model, params, priority, webhook, metadata, budget (the rows a budget
# stopped are failed rows: their retry is capped as the original was) and completion
# window (a new deadline from now, on the database's clock).
_INSERT_JOB = (
    "INSERT INTO batches (id, workspace_id, name, model, priority, status, total,"
    " webhook_url, rows_batch_id, params, metadata, completion_window, expires_at, retry_of,"
    " budget_usd, endpoint)"
    " SELECT $1, o.workspace_id, o.name, o.model, o.priority, $3, $4, o.webhook_url, $1,"
    " o.params, o.metadata, o.completion_window, now() + o.completion_window, o.id,"
    " o.budget_usd, o.endpoint"
    " FROM batches o WHERE o.id = $2"
    " RETURNING *"
)

_LIST_RETRY = "UPDATE batches SET retries = array_append(retries, $2) WHERE id = $1"


async def insert_retry(
    conn: Connection, workspace_id: str, original_id: str, rows: RetryRows, new_id: str
) -> Job:
    """Make the retry job ``new_id`` of ``original_id`` on ``conn`` (the caller owns the
    transaction). :class:`ConflictError` unless the original is terminal,
    :class:`NothingToRetry` when it has no such row (nothing is written then)."""
    locked = await conn.fetchrow(_LOCK_ORIGINAL, original_id, workspace_id)
    if locked is None or JobStatus(locked["status"]) not in TERMINAL:
        raise ConflictError(original_id)
    total = await conn.fetchval(
        _COPY_ROWS.format(chosen=_CHOSEN[rows]), new_id, original_id, locked["rows_batch_id"]
    )
    if not total:
        raise NothingToRetry(original_id)
    record = await conn.fetchrow(_INSERT_JOB, new_id, original_id, JobStatus.QUEUED, total)
    await conn.execute(_LIST_RETRY, original_id, new_id)
    return Job.from_record(record)
