"""The row-worker's one look at the ledger: which rows of a slice already have an outcome.

A redelivered slice (its former holder died or lost its channel) and one re-sent by stall
recovery may hold rows that were answered already; a worker asks this before calling the
model, so such a row is not paid for twice. One query per such slice, an index range on
``row_results``' primary key ``(batch_id, row_index)``, read-only.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from relay_batches.ledger.pool import translated

# $1 the job, $2 the slice's row indexes: a primary-key lookup for each, never a scan.
_ANSWERED = "SELECT row_index FROM row_results WHERE batch_id = $1 AND row_index = ANY($2::int[])"


async def answered_rows(pool: asyncpg.Pool, batch_id: str, indexes: Sequence[int]) -> set[int]:
    """The rows of ``indexes`` of job ``batch_id`` that have an outcome in the ledger
    (a driver failure raises :class:`~relay_batches.errors.TransientError`)."""
    if not indexes:
        return set()
    async with translated():
        records = await pool.fetch(_ANSWERED, batch_id, list(indexes))
    return {int(record[0]) for record in records}
