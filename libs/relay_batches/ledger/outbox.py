"""The ``job.finished`` outbox flag, shared by whoever announces a terminal job."""

from __future__ import annotations

import asyncpg

from relay_batches.ledger.pool import translated


async def mark_finished_published(pool: asyncpg.Pool, batch_ids: list[str]) -> None:
    """Record that ``job.finished`` went out for these jobs."""
    async with translated():
        await pool.execute(
            "UPDATE batches SET finished_published = true WHERE id = ANY($1::text[])", batch_ids
        )
