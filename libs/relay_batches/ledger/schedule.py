"""The scheduler's ledger: lock due cron templates, spawn their runs, advance their clock.

One call to :meth:`ScheduleStore.spawn_due` is one transaction: it locks a page of due
templates with ``FOR UPDATE SKIP LOCKED`` (another scheduler takes the next page, never
the same rows), lets the caller plan each template's tick and next tick (pure Python,
croniter), inserts the runs set-based with ``ON CONFLICT (template_id, tick) DO
NOTHING`` and moves every template's ``next_run_at`` forward, all before committing.
A run carries its template's metadata, and its template's completion window from the
moment it is spawned (``expires_at``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from relay_batches.ids import new_id
from relay_batches.ledger.pool import translated
from relay_batches.ledger.status_sql import status_in
from relay_batches.model import JobStatus

_DUE = status_in([JobStatus.SCHEDULED])  # constant, so batches_due_templates is used

_LOCK_DUE = (
    "SELECT id, name, cron, next_run_at FROM batches"
    f" WHERE {_DUE} AND next_run_at <= $1"
    " ORDER BY next_run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED"
)

_INSERT_RUNS = """
INSERT INTO batches (id, workspace_id, name, model, priority, status, total, webhook_url,
                     template_id, rows_batch_id, params, tick, metadata, completion_window,
                     expires_at, budget_usd, endpoint)
SELECT p.run_id, t.workspace_id, p.run_name, t.model, t.priority, $5::text, t.total,
       t.webhook_url, t.id, t.rows_batch_id, t.params, p.tick, t.metadata,
       t.completion_window, now() + t.completion_window, t.budget_usd, t.endpoint
FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[])
    AS p(template_id, run_id, run_name, tick)
JOIN batches t ON t.id = p.template_id
ON CONFLICT (template_id, tick) DO NOTHING
RETURNING id, template_id, priority, tick
"""

_ADVANCE = """
UPDATE batches b SET next_run_at = p.next_run_at
FROM unnest($1::text[], $2::timestamptz[]) AS p(template_id, next_run_at)
WHERE b.id = p.template_id AND b.status = $3
"""


@dataclass(frozen=True)
class DueTemplate:
    """A cron template whose ``next_run_at`` has come (locked for this transaction)."""

    id: str
    name: str
    cron: str
    next_run_at: datetime


@dataclass(frozen=True)
class PlannedTick:
    """What to do with one due template: spawn the run of ``tick``, then wait for ``next``."""

    template_id: str
    run_name: str
    tick: datetime
    next_run_at: datetime


@dataclass(frozen=True)
class SpawnedRun:
    """A queued run just inserted."""

    id: str
    template_id: str
    priority: int
    tick: datetime


Plan = Callable[[Sequence[DueTemplate]], list[PlannedTick]]


class ScheduleStore:
    """Due templates and their runs."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def spawn_due(
        self, now: datetime, limit: int, plan: Plan
    ) -> tuple[int, list[SpawnedRun]]:
        """Spawn the runs of up to ``limit`` templates due at ``now``, in one transaction.

        Returns how many templates were due (and locked by us) and the runs inserted; a
        tick that already has its run (a racing scheduler) inserts nothing but still
        advances the template.
        """
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            records = await conn.fetch(_LOCK_DUE, now, limit)
            if not records:
                return 0, []
            planned = plan([DueTemplate(*r) for r in records])
            inserted = await conn.fetch(
                _INSERT_RUNS,
                [p.template_id for p in planned],
                [new_id() for _ in planned],
                [p.run_name for p in planned],
                [p.tick for p in planned],
                JobStatus.QUEUED,
            )
            await conn.execute(
                _ADVANCE,
                [p.template_id for p in planned],
                [p.next_run_at for p in planned],
                JobStatus.SCHEDULED,
            )
        return len(records), [SpawnedRun(*r) for r in inserted]

    async def now(self) -> datetime:
        """The database's clock: what is due is decided by it, never by a replica's."""
        async with translated():
            value: datetime = await self._pool.fetchval("SELECT clock_timestamp()")
        return value

    async def earliest_next_run(self) -> tuple[datetime | None, datetime]:
        """The soonest ``next_run_at`` of any scheduled template (None if there is none),
        and the database's clock when it was read (to sleep until it)."""
        async with translated():
            record = await self._pool.fetchrow(
                f"SELECT min(next_run_at), clock_timestamp() FROM batches WHERE {_DUE}"
            )
        assert record is not None
        return record[0], record[1]
