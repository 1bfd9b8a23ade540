"""A batch's webhook delivery as the API shows it: its log of attempts, and a redelivery
asked for by the batch's owner.

A redelivery re-arms an ended delivery (``delivered``, ``refused``, ``failed``,
``unknown``) as ``retrying`` due at once with ``redelivery`` set: the notifier's deferred
pass claims it (``retrying`` → ``sending``) and POSTs it through the claim protocol of
:mod:`.deliveries`, one attempt, never retried automatically. It adds an attempt to the
log, so it is bounded: refused while the last attempt ended less than
``REDELIVERY_COOLDOWN_S`` ago, and once the delivery has made ``MAX_DELIVERY_ATTEMPTS``.

A redelivery asked for while nothing is under way changes nothing else and adds no
attempt: a ``retrying`` delivery (an automatic retry pending, or a redelivery asked for
already) is only made due now, keeping its retries; a deferred ``sending`` one (nobody
holds it, waiting for its receiver) stays the delivery it is. A batch that has no
delivery yet (its ``job.finished`` not handled so far) gets its ordinary first delivery,
deferred ``sending`` (a later ``job.finished`` finds it claimed). A delivery with an
attempt under way (claimed ``sending``, ``posting``) is never re-armed, so a redelivery
never makes two POSTs of one attempt nor POSTs a ``posting`` attempt again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from relay_batches.errors import ConflictError
from relay_batches.ledger.pool import translated
from relay_batches.model import DELIVERY_SETTLED, DeliveryStatus, Job, iso

# A delivery may be re-armed from these (not while an attempt is under way).
REARMABLE = frozenset({*DELIVERY_SETTLED, DeliveryStatus.UNKNOWN})
REDELIVERY_COOLDOWN_S = 10.0  # after an attempt ended, before a redelivery may be asked for
MAX_DELIVERY_ATTEMPTS = 100  # a delivery's attempts, automatic and asked for (the log's bound)

_DELIVERY = (
    "SELECT status, next_attempt_at FROM webhook_deliveries"
    " WHERE batch_id = $1 AND endpoint_id = $2"
)

_ATTEMPTS = """
SELECT attempt, status, response_status, error, attempted_at, duration_ms, redelivery
FROM webhook_attempts WHERE batch_id = $1 AND endpoint_id = $4 AND attempt > $2
ORDER BY attempt LIMIT $3
"""

_LOCK = """
SELECT status, deferred, attempts, url, message_id,
       EXTRACT(epoch FROM now() - finished_at)::float8 AS ended_s
FROM webhook_deliveries WHERE batch_id = $1 AND endpoint_id = $2 FOR UPDATE
"""

# An ended delivery ($3), as a redelivery due now; its retry window stays as it was.
_REARM = """
UPDATE webhook_deliveries SET status = $2, next_attempt_at = now(),
    redelivery = true, deferred = false
WHERE batch_id = $1 AND endpoint_id = $4 AND status = ANY($3::text[])
RETURNING status, next_attempt_at
"""

# A retrying delivery ($2), due now at the latest; redelivery, retries and window kept.
_DUE_NOW = """
UPDATE webhook_deliveries SET next_attempt_at = LEAST(next_attempt_at, now())
WHERE batch_id = $1 AND endpoint_id = $3 AND status = $2
RETURNING status, next_attempt_at
"""

# The ordinary first delivery ($3 sending), deferred and unclaimed (claims 0), due now: a
# job.finished handled later finds it claimed. One already deferred (nobody holds it) is
# kept as it is; one claimed meanwhile is not returned (an attempt is under way).
_FIRST = """
INSERT INTO webhook_deliveries (batch_id, url, status, message_id, claims, deferred,
    claim_expires_at, next_attempt_at, endpoint_id)
VALUES ($1, $2, $3, $4, 0, true, now(), now(), $5)
ON CONFLICT (batch_id, endpoint_id) DO UPDATE
    SET next_attempt_at = COALESCE(webhook_deliveries.next_attempt_at, now())
    WHERE webhook_deliveries.deferred AND webhook_deliveries.status = $3
RETURNING status, next_attempt_at
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

    async def attempts(
        self, batch_id: str, after: int, limit: int, endpoint_id: str = ""
    ) -> DeliveryPage:
        """Up to ``limit`` attempts of ``batch_id``'s delivery to ``endpoint_id`` ('': its
        own completion webhook) numbered above ``after``, oldest first, read with the
        delivery in one snapshot."""
        async with (
            translated(),
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            delivery = await conn.fetchrow(_DELIVERY, batch_id, endpoint_id)
            rows = await conn.fetch(_ATTEMPTS, batch_id, after, limit + 1, endpoint_id)
        attempts = [AttemptRecord(batch_id, *r) for r in rows[:limit]]
        return DeliveryPage(
            None if delivery is None else delivery["status"],
            None if delivery is None else delivery["next_attempt_at"],
            attempts,
            len(rows) > limit,
        )

    async def request_redelivery(self, job: Job, endpoint_id: str = "") -> Scheduled:
        """Make ``job``'s delivery to ``endpoint_id`` ('': its own completion webhook)
        due now: re-arm an ended one as a redelivery, make a retrying one due now, keep a
        deferred one, or record the first one of its own webhook (deferred) if it has
        none; return its stored status and due time. :class:`ConflictError` while an
        attempt is under way, within ``REDELIVERY_COOLDOWN_S`` of the last attempt's
        end, once ``MAX_DELIVERY_ATTEMPTS`` were made, or for an endpoint that was sent
        no event of the batch. The caller has checked the job is terminal and, for its
        own webhook, has a webhook URL."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            current = await conn.fetchrow(_LOCK, job.id, endpoint_id)
            status = None if current is None else current["status"]
            if current is None and endpoint_id:
                raise ConflictError("the endpoint was sent no event of this batch")
            if current is None or (status == DeliveryStatus.SENDING and current["deferred"]):
                url = job.webhook_url if current is None else current["url"]
                message_id = f"msg_{job.id}" if current is None else current["message_id"]
                record = await conn.fetchrow(
                    _FIRST, job.id, url, DeliveryStatus.SENDING, message_id, endpoint_id
                )
            elif status == DeliveryStatus.RETRYING:
                record = await conn.fetchrow(_DUE_NOW, job.id, DeliveryStatus.RETRYING, endpoint_id)
            elif status in REARMABLE:
                _check_bounds(current["attempts"], current["ended_s"])
                record = await conn.fetchrow(
                    _REARM, job.id, DeliveryStatus.RETRYING, sorted(REARMABLE), endpoint_id
                )
            else:
                record = None
        if record is None:  # claimed sending or posting (or a delivery claimed meanwhile)
            raise ConflictError(f"an attempt is in progress (delivery {status or 'sending'})")
        return Scheduled(record["status"], record["next_attempt_at"])


def _check_bounds(attempts: int, ended_s: float | None) -> None:
    """Refuse (:class:`ConflictError`) a redelivery that would add an attempt to a log
    at its bound, or follow the last attempt's end too closely."""
    if attempts >= MAX_DELIVERY_ATTEMPTS:
        raise ConflictError(
            f"the delivery has made {attempts} attempts, the most a delivery may make"
            f" ({MAX_DELIVERY_ATTEMPTS}); no redelivery is possible"
        )
    if ended_s is not None and ended_s < REDELIVERY_COOLDOWN_S:
        wait_s = max(1, math.ceil(REDELIVERY_COOLDOWN_S - ended_s))
        raise ConflictError(
            f"the last attempt ended {max(0.0, ended_s):.1f} s ago; a redelivery may be asked"
            f" for {REDELIVERY_COOLDOWN_S:g} s after it (retry in {wait_s} s)"
        )
