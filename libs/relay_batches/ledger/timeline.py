"""A job's timeline: what happened to it, dated, oldest first, in one statement.

Created, started, each pause and resume (from ``batch_status_log``, written by a trigger
on every status change: migration 0031), its budget reached, finished (with the status it
ended in), and every attempt of its completion webhook (``webhook_attempts``). Bounded:
at most :data:`MAX_EVENTS` events, read through the indexes on ``batch_id``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from relay_batches.ledger.pool import translated
from relay_batches.model import Job, iso

MAX_EVENTS = 500  # a job's events shown (pauses and webhook attempts are the many ones)

# $1 the job's id, $2 MAX_EVENTS + 1 (one more tells whether there are more).
# ``log`` is the job's status changes; a pause is a move to paused, a resume a move out of
# paused to queued or running (a paused job that is canceled or expires was not resumed).
_TIMELINE = """
WITH b AS (
  SELECT id, status, created_at, started_at, completed_at, budget_exceeded_at
  FROM batches WHERE id = $1
), events AS (
  SELECT created_at AS at, 'created' AS event, NULL::text AS status, NULL::int AS attempt,
    NULL::int AS http_status, NULL::text AS error, 0 AS n FROM b
  UNION ALL SELECT started_at, 'started', NULL, NULL, NULL, NULL, 1 FROM b
    WHERE started_at IS NOT NULL
  UNION ALL SELECT budget_exceeded_at, 'budget_reached', NULL, NULL, NULL, NULL, 2 FROM b
    WHERE budget_exceeded_at IS NOT NULL
  UNION ALL SELECT completed_at, 'finished', status, NULL, NULL, NULL, 3 FROM b
    WHERE completed_at IS NOT NULL
  UNION ALL SELECT l.at, CASE WHEN l.to_status = 'paused' THEN 'paused' ELSE 'resumed' END,
      NULL, NULL, NULL, NULL, 1
    FROM batch_status_log l
    WHERE l.batch_id = $1 AND (l.to_status = 'paused'
      OR (l.from_status = 'paused' AND l.to_status IN ('queued', 'running')))
  UNION ALL SELECT a.attempted_at, 'webhook_attempt', a.status, a.attempt, a.response_status,
      a.error, 4
    FROM webhook_attempts a WHERE a.batch_id = $1
)
SELECT at, event, status, attempt, http_status, error FROM events
ORDER BY at, n, attempt LIMIT $2
"""


@dataclass(frozen=True)
class TimelineEvent:
    """One dated event of a job: ``status`` for ``finished`` (what it ended as) and a
    ``webhook_attempt`` (how it went), with that attempt's number, HTTP status and error."""

    at: datetime
    event: str
    status: str | None
    attempt: int | None
    http_status: int | None
    error: str | None

    def to_api(self) -> dict[str, Any]:
        """One element of ``data`` of ``GET /v1/batches/{id}/timeline``."""
        found: dict[str, Any] = {"at": iso(self.at), "event": self.event}
        if self.status is not None:
            found["status"] = self.status
        if self.event == "webhook_attempt":
            found |= {"attempt": self.attempt, "http_status": self.http_status, "error": self.error}
        return found


class TimelineStore:
    """The timeline query of the public API."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def timeline(self, job: Job) -> tuple[list[TimelineEvent], bool]:
        """``job``'s events, oldest first (at most :data:`MAX_EVENTS`), and whether there
        are more."""
        async with translated():
            records = await self._pool.fetch(_TIMELINE, job.id, MAX_EVENTS + 1)
        events = [TimelineEvent(*r) for r in records[:MAX_EVENTS]]
        return events, len(records) > MAX_EVENTS
