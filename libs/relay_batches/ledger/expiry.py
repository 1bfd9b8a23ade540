"""Jobs past their completion window: the guarded move of due jobs to ``expired``."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from relay_batches.ledger.pool import translated
from relay_batches.ledger.status_sql import status_in
from relay_batches.model import JobStatus, allowed_from

# $1 the statuses a job may expire from, $2 at most this many, $3 expired. Due jobs are
# picked soonest-deadline first (the batches_expiring_live index: its statuses are named
# as constants so the planner can prove its predicate), locked in id order like every
# multi-job update, and skipped when another replica holds them.
_EXPIRE_DUE = (
    "WITH due AS (SELECT id FROM batches"
    "  WHERE expires_at IS NOT NULL AND expires_at <= now()"
    f" AND {status_in(allowed_from(JobStatus.EXPIRED))}"
    "  ORDER BY expires_at LIMIT $2),"
    " locked AS (SELECT b.id FROM batches b JOIN due USING (id)"
    "  WHERE b.status = ANY($1::text[]) ORDER BY b.id FOR UPDATE OF b SKIP LOCKED)"
    " UPDATE batches b SET status = $3, completed_at = now(), lease_owner = NULL"
    " FROM locked WHERE b.id = locked.id RETURNING b.id, b.total, b.completed, b.failed"
)


@dataclass(frozen=True, slots=True)
class ExpiredJob:
    """A job just moved to ``expired``, with its counters at that moment."""

    id: str
    total: int
    completed: int
    failed: int


class ExpiryStore:
    """Ends jobs whose ``expires_at`` has passed."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def expire_due(self, limit: int = 500) -> list[ExpiredJob]:
        """Move up to ``limit`` due queued, running or paused jobs to ``expired``; those jobs,
        by id.

        Rows without an outcome by now never run: outcomes arriving later are discarded
        (only running jobs accept outcomes). Safe with several replicas: a job is
        expired, and returned, by exactly one call.
        """
        async with translated():
            records = await self._pool.fetch(
                _EXPIRE_DUE, allowed_from(JobStatus.EXPIRED), limit, JobStatus.EXPIRED
            )
        return sorted((ExpiredJob(*r) for r in records), key=lambda job: job.id)
