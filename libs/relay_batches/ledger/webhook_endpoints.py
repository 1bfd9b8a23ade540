"""A workspace's webhook endpoints, and the events their batches send them.

:class:`WebhookEndpoints` is the API's: create (with a fresh ``whsec_`` secret, shown
once), list and delete, at most ``MAX_ENDPOINTS`` per workspace. :class:`EndpointEvents`
is the notifier's: when a batch ends, :meth:`~EndpointEvents.fan_out` records one
deferred delivery per endpoint of its workspace whose events name how it ended, in
``webhook_deliveries`` beside the batch's own webhook (keyed by ``endpoint_id``), with
the event's body fixed there: every attempt, retry and redelivery sends the same bytes
under the same ``webhook-id``. From then on each is an ordinary delivery (claims,
deferral, the delivery log, retries, redelivery; see :mod:`.deliveries`); the secret is
read at each POST, so a deleted endpoint's pending deliveries fail unsent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from relay_batches.errors import ConflictError
from relay_batches.ids import is_valid_id, new_id
from relay_batches.ledger.keys import generate_webhook_secret
from relay_batches.ledger.pool import translated
from relay_batches.model import DeliveryStatus, Job
from relay_batches.webhooks import EVENT_PREFIX, EVENT_TYPES, batch_event, shown_batch_id

MAX_ENDPOINTS = 20  # per workspace: every batch that ends sends to each of them
ENDPOINT_PREFIX = "we_"  # an endpoint ``h`` is ``we_h`` in the API

_LOCK_WORKSPACE = "SELECT id FROM workspaces WHERE id = $1 FOR UPDATE"
_COUNT = "SELECT count(*) FROM webhook_endpoints WHERE workspace_id = $1"
_INSERT = """
INSERT INTO webhook_endpoints (id, workspace_id, url, events, secret)
VALUES ($1, $2, $3, $4, $5)
RETURNING id, url, events, created_at
"""
_LIST = """
SELECT id, url, events, created_at FROM webhook_endpoints
WHERE workspace_id = $1 ORDER BY created_at, id
"""
_DELETE = "DELETE FROM webhook_endpoints WHERE workspace_id = $1 AND id = $2 RETURNING id"

# The endpoints of the batch's workspace that take event $2, with the surface that shows
# the batch ($1) with a prefix: batches.surface, else 'openai' for a batch of the OpenAI
# surface (its openai_batches link), else none (native).
_MATCHING = """
SELECT e.id, e.url,
       COALESCE(b.surface, CASE WHEN EXISTS (SELECT 1 FROM openai_batches o
                                             WHERE o.batch_id = b.id) THEN 'openai' END)
           AS surface
FROM batches b JOIN webhook_endpoints e ON e.workspace_id = b.workspace_id
WHERE b.id = $1 AND $2 = ANY(e.events)
"""

# One deferred, unclaimed delivery per endpoint ($3 sending); a redelivered job.finished
# finds them recorded and adds nothing.
_FAN_OUT = """
INSERT INTO webhook_deliveries (batch_id, endpoint_id, url, status, message_id, body,
    claims, deferred, claim_expires_at)
SELECT $1, e, u, $3, m, b, 0, true, now()
FROM unnest($2::text[], $4::text[], $5::text[], $6::text[]) AS t(e, u, m, b)
ON CONFLICT (batch_id, endpoint_id) DO NOTHING
"""

# What an endpoint delivery POSTs: its URL, webhook-id and body as recorded, and the
# endpoint's secret (NULL once the endpoint is deleted).
_TARGET = """
SELECT d.url, d.message_id, d.body, e.secret
FROM webhook_deliveries d LEFT JOIN webhook_endpoints e ON e.id = d.endpoint_id
WHERE d.batch_id = $1 AND d.endpoint_id = $2
"""


@dataclass(frozen=True)
class Endpoint:
    """A webhook endpoint as the API shows it; ``secret`` only when just created."""

    id: str
    url: str
    events: tuple[str, ...]
    created_at: datetime
    secret: str | None = None

    def to_api(self) -> dict[str, Any]:
        """The ``webhook_endpoint`` object (the secret only in the create answer)."""
        shown: dict[str, Any] = {
            "id": ENDPOINT_PREFIX + self.id,
            "object": "webhook_endpoint",
            "url": self.url,
            "events": list(self.events),
            "created_at": int(self.created_at.timestamp()),
        }
        if self.secret is not None:
            shown["secret"] = self.secret
        return shown


def _endpoint(record: Any, secret: str | None = None) -> Endpoint:
    return Endpoint(
        record["id"], record["url"], tuple(record["events"]), record["created_at"], secret
    )


def endpoint_hex(shown_id: str) -> str | None:
    """The 32-hex id inside ``we_<hex>``; None if it is not one."""
    hex_id = shown_id.removeprefix(ENDPOINT_PREFIX)
    return hex_id if shown_id.startswith(ENDPOINT_PREFIX) and is_valid_id(hex_id) else None


class WebhookEndpoints:
    """The ``webhook_endpoints`` table as the API uses it, one workspace at a time."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(self, workspace_id: str, url: str, events: tuple[str, ...]) -> Endpoint:
        """A new endpoint with a fresh secret (returned here only);
        :class:`ConflictError` when the workspace has ``MAX_ENDPOINTS`` already."""
        secret = generate_webhook_secret()
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            await conn.execute(_LOCK_WORKSPACE, workspace_id)  # counts and inserts in turn
            if await conn.fetchval(_COUNT, workspace_id) >= MAX_ENDPOINTS:
                raise ConflictError(
                    f"the workspace has {MAX_ENDPOINTS} webhook endpoints, the most it may"
                    " have; delete one first"
                )
            record = await conn.fetchrow(_INSERT, new_id(), workspace_id, url, list(events), secret)
        return _endpoint(record, secret)

    async def list(self, workspace_id: str) -> list[Endpoint]:
        """Every endpoint of the workspace, oldest first (at most ``MAX_ENDPOINTS``)."""
        async with translated():
            records = await self._pool.fetch(_LIST, workspace_id)
        return [_endpoint(r) for r in records]

    async def delete(self, workspace_id: str, endpoint_id: str) -> bool:
        """Delete an endpoint of the workspace; False if it has none of that id."""
        async with translated():
            found = await self._pool.fetchval(_DELETE, workspace_id, endpoint_id)
        return found is not None


@dataclass(frozen=True)
class EndpointTarget:
    """Where and what one endpoint delivery POSTs; ``secret`` None: endpoint deleted."""

    url: str
    message_id: str
    body: bytes
    secret: str | None


class EndpointEvents:
    """The deliveries of webhook endpoints, as the notifier records and reads them."""

    _pool: asyncpg.Pool

    async def fan_out(self, job: Job, now: float | None = None) -> int:
        """Record the event of ``job``'s end for every matching endpoint of its workspace
        (deferred, for the deferred pass); return how many were new (none for a job that
        has not ended). The event's ``created_at`` is when the batch ended."""
        event_type = EVENT_TYPES.get(job.status)
        if event_type is None:
            return 0
        ended = job.completed_at.timestamp() if job.completed_at is not None else None
        created_at = int(ended or (time.time() if now is None else now))
        async with translated():
            matching = await self._pool.fetch(_MATCHING, job.id, event_type)
            if not matching:
                return 0
            event_ids = [EVENT_PREFIX + new_id() for _ in matching]
            bodies = [
                batch_event(
                    event_id, event_type, created_at, shown_batch_id(job.id, r["surface"])
                ).decode()
                for event_id, r in zip(event_ids, matching, strict=True)
            ]
            status = await self._pool.execute(
                _FAN_OUT,
                job.id,
                [r["id"] for r in matching],
                DeliveryStatus.SENDING,
                [r["url"] for r in matching],
                event_ids,
                bodies,
            )
        return int(status.split()[-1])

    async def endpoint_target(self, batch_id: str, endpoint_id: str) -> EndpointTarget | None:
        """The recorded delivery of ``batch_id`` to ``endpoint_id``; None if none is."""
        async with translated():
            record = await self._pool.fetchrow(_TARGET, batch_id, endpoint_id)
        if record is None or record["body"] is None:
            return None
        return EndpointTarget(
            record["url"], record["message_id"], record["body"].encode(), record["secret"]
        )
