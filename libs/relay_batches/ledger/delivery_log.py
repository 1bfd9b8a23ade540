"""A batch's webhook delivery as the API shows it: its log of attempts, and a redelivery
asked for by the batch's owner.

A redelivery re-arms the delivery as ``retrying`` due at once, with ``retry_until`` its
own time and ``redelivery`` set: the notifier's deferred pass claims it (``retrying`` →
``sending``) and POSTs it through the claim protocol of :mod:`.deliveries`, one attempt,
never retried automatically. A delivery with an attempt under way (``sending``,
``posting``) is never re-armed, so a redelivery never makes two POSTs of one attempt nor
POSTs a ``posting`` attempt again. A batch that has no delivery yet (its
``job.finished`` not handled so far) gets a deferred ``sending`` one, which a later
``job.finished`` finds claimed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from relay_batches.errors import ConflictError
from relay_batches.ledger.pool import translated
from relay_batches.model import DELIVERY_SETTLED, DeliveryStatus, Job, iso

# A delivery may be re-armed from these (not while an attempt is under way).
REARMABLE = frozenset({*DELIVERY_SETTLED, DeliveryStatus.UNKNOWN, DeliveryStatus.RETRYING})

_DELIVERY = "SELECT status, next_attempt_at FROM webhook_deliveries WHERE batch_id = $1"

_ATTEMPTS = """
SELECT attempt, status, response_status, error, attempted_at, duration_ms, redelivery
FROM webhook_attempts WHERE batch_id = $1 AND attempt > $2
ORDER BY attempt LIMIT $3
"""

_LOCK = "SELECT status FROM webhook_deliveries WHERE batch_id = $1 FOR UPDATE"

_REARM = """
UPDATE webhook_deliveries SET status = $2, next_attempt_at = now(), retry_until = now(),
    redelivery = true, deferred = false
WHERE batch_id = $1 AND status = ANY($3::text[])
RETURNING status, next_attempt_at
"""

# Deferred and unclaimed (claims 0), due now; a job.finished handled later finds it.
_FIRST = """
INSERT INTO webhook_deliveries (batch_id, url, status, message_id, claims, deferred,
    claim_expires_at, retry_until, redelivery)
VALUES ($1, $2, $3, $4, 0, true, now(), now(), true)
ON CONFLICT (batch_id) DO NOTHING
RETURNING status, now() AS next_attempt_at
"""


@dataclass(frozen=True)
class AttemptRecord:
    """One POST of a completion webhook, as the delivery log holds it."""

    batch_id: str
    attempt: int
    status: str
    response_status: int | None
    error: str | None
    attempted_at: datetime
    duration_ms: int | None
    redelivery: bool

    def to_api(self) -> dict[str, Any]:
        """The ``webhook_delivery`` object of the API."""
        return {
            "id": f"{self.batch_id}.{self.attempt}",
            "object": "webhook_delivery",
            "attempt": self.attempt,
            "status": self.status,
            "response_status": self.response_status,
            "error": self.error,
            "attempted_at": iso(self.attempted_at),
            "duration_ms": self.duration_ms,
            "redelivery": self.redelivery,
        }


@dataclass(frozen=True)
class DeliveryPage:
    """A page of a batch's delivery log, with the delivery's status (None: no delivery
    yet) and when its next attempt is due."""

    status: str | None
    next_attempt_at: datetime | None
    attempts: list[AttemptRecord]
    has_more: bool


@dataclass(frozen=True)
class Scheduled:
    """A redelivery recorded: the delivery's status and when it is due."""

    status: str
    next_attempt_at: datetime


class DeliveryLog:
    """The delivery log and redelivery requests of the API (any workspace: the caller
    has found the batch in its own workspace first)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def attempts(self, batch_id: str, after: int, limit: int) -> DeliveryPage:
        """Up to ``limit`` attempts of ``batch_id``'s delivery numbered above ``after``,
        oldest first, read with the delivery in one snapshot."""
        async with (
            translated(),
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            delivery = await conn.fetchrow(_DELIVERY, batch_id)
            rows = await conn.fetch(_ATTEMPTS, batch_id, after, limit + 1)
        attempts = [AttemptRecord(batch_id, *r) for r in rows[:limit]]
        return DeliveryPage(
            None if delivery is None else delivery["status"],
            None if delivery is None else delivery["next_attempt_at"],
            attempts,
            len(rows) > limit,
        )

    async def request_redelivery(self, job: Job) -> Scheduled:
        """Re-arm ``job``'s delivery as a redelivery due now (or record a first one,
        deferred, if it has none); :class:`ConflictError` while an attempt is under way.
        The caller has checked the job is terminal and has a webhook URL."""
        assert job.webhook_url is not None
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            status = await conn.fetchval(_LOCK, job.id)
            if status is None:
                record = await conn.fetchrow(
                    _FIRST, job.id, job.webhook_url, DeliveryStatus.SENDING, f"msg_{job.id}"
                )
            elif status in REARMABLE:
                record = await conn.fetchrow(
                    _REARM, job.id, DeliveryStatus.RETRYING, sorted(REARMABLE)
                )
            else:
                record = None
        if record is None:  # sending or posting (or a delivery claimed meanwhile)
            raise ConflictError(f"an attempt is in progress (delivery {status or 'sending'})")
        return Scheduled(record["status"], record["next_attempt_at"])
