"""The backlog: what the unfinished jobs still have to do, read from the jobs' counters.

One reading is two statements on the ``batches`` table's unfinished jobs (the partial
index ``batches_unfinished``, migration 0034) and the rows handed back unstarted that
wait to go out again (``returned_rows_waiting``): never a scan of ``batch_rows`` or
``row_results``, so its cost follows the number of unfinished jobs, not the ledger's
size. Per unfinished job status:

- ``waiting``: rows not yet released (``total - dispatched_upto``), plus rows handed back
  by a row-worker (a pause) that wait to be released again;
- ``released``: rows released to the broker without an outcome yet
  (``dispatched_upto - completed - failed``, less those handed back): in the ``rows``
  queue or held by a row-worker.

Only the holder of the ``backlog`` lease (:data:`LEASE`, table ``ledger_leases``) reads,
so one process at a time does it and serves the gauges.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from relay_batches.ledger.pool import translated
from relay_batches.ledger.status_sql import status_in
from relay_batches.model import JobStatus

LEASE = "backlog"
UNFINISHED = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.PAUSED)
WAITING = "waiting"
RELEASED = "released"

# $1 lease name, $2 owner, $3 seconds: take or renew the lease; a row back when it is ours.
_TAKE_LEASE = (
    "INSERT INTO ledger_leases AS l (name, owner, expires_at)"
    " VALUES ($1, $2, now() + make_interval(secs => $3))"
    " ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at"
    " WHERE l.owner = EXCLUDED.owner OR l.expires_at < now()"
    " RETURNING owner"
)
_GIVE_BACK = "DELETE FROM ledger_leases WHERE name = $1 AND owner = $2"

_UNFINISHED = status_in(UNFINISHED)
_COUNTERS = (
    "SELECT status, count(*)::bigint,"
    " COALESCE(sum(GREATEST(total - dispatched_upto, 0)), 0)::bigint,"
    " COALESCE(sum(GREATEST(dispatched_upto - completed - failed, 0)), 0)::bigint,"
    " extract(epoch FROM now() - min(created_at))"
    f" FROM batches WHERE {_UNFINISHED} GROUP BY status"
)
_RETURNED = (
    "SELECT b.status, count(*)::bigint FROM returned_rows x JOIN batches b ON b.id = x.batch_id"
    f" WHERE NOT x.taken AND b.{_UNFINISHED} GROUP BY b.status"
)


@dataclass(frozen=True)
class Backlog:
    """One reading: ``rows[(status, state)]``, ``jobs[status]`` and the age of the oldest
    queued job in seconds (0 when none is queued)."""

    rows: dict[tuple[str, str], int]
    jobs: dict[str, int]
    oldest_queued_s: float


class BacklogStore:
    """Reads the backlog under the ``backlog`` lease."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def read(self, owner: str, lease_s: float) -> Backlog | None:
        """Take or renew the lease for ``lease_s`` and read the backlog; None (nothing
        read) while another owner's lease runs."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            if await conn.fetchval(_TAKE_LEASE, LEASE, owner, lease_s) is None:
                return None
            counters = await conn.fetch(_COUNTERS)
            returned = {r[0]: int(r[1]) for r in await conn.fetch(_RETURNED)}
        return _backlog(counters, returned)

    async def give_back(self, owner: str) -> None:
        """End our lease (a stop), so the next dispatcher to ask takes it at once."""
        async with translated():
            await self._pool.execute(_GIVE_BACK, LEASE, owner)


def _backlog(counters: list[asyncpg.Record], returned: dict[str, int]) -> Backlog:
    rows: dict[tuple[str, str], int] = {}
    jobs: dict[str, int] = {}
    oldest = 0.0
    for status in UNFINISHED:
        rows[(status.value, WAITING)] = rows[(status.value, RELEASED)] = 0
        jobs[status.value] = 0
    for status, count, unreleased, released, age in counters:
        handed_back = min(returned.get(status, 0), int(released))
        rows[(status, WAITING)] = int(unreleased) + handed_back
        rows[(status, RELEASED)] = int(released) - handed_back
        jobs[status] = int(count)
        if status == JobStatus.QUEUED and age is not None:
            oldest = max(0.0, float(age))
    return Backlog(rows, jobs, oldest)
