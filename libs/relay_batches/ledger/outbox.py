"""The ``job.finished`` outbox flag, shared by whoever announces a terminal job."""

from __future__ import annotations

import asyncpg

from relay_batches.ledger.lock_order import update_jobs_in_id_order
from relay_batches.ledger.pool import translated

_MARK_PUBLISHED = update_jobs_in_id_order("id = ANY($1::text[])", "finished_published = true")


async def mark_finished_published(pool: asyncpg.Pool, batch_ids: list[str]) -> None:
    """Record that ``job.finished`` went out for these jobs."""
    async with translated():
        await pool.execute(_MARK_PUBLISHED, batch_ids)
