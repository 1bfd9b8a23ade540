"""Delivering one completion webhook: claim, sign, POST (guarded, bounded, no retry),
record.

The claim comes first so a redelivered ``job.finished`` never POSTs twice: the price is
that a crash between claim and POST loses that one delivery, which matches the
contract's "once, no retry".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import orjson

from relay.batches import Batch
from relay.messages import JobEvent
from relay.metrics import WEBHOOK_DELIVERIES
from relay.webhooks import signed_headers

log = logging.getLogger("relay.notifier")


@dataclass(frozen=True)
class PostResult:
    """How one POST went: an HTTP status, or an error before any status."""

    status_code: int | None
    error: str | None = None
    refused: bool = False

    @property
    def delivered(self) -> bool:
        """2xx counts as delivered."""
        return self.status_code is not None and 200 <= self.status_code < 300


Post = Callable[[str, bytes, dict[str, str]], Awaitable[PostResult]]


class Store(Protocol):
    """What the notifier needs of the ledger."""

    async def batch(self, batch_id: str) -> Batch | None:
        """Read a batch."""

    async def claim(self, batch_id: str, url: str, message_id: str) -> bool:
        """Claim the delivery."""

    async def signing_secret(self, workspace_id: str) -> str:
        """The workspace's webhook signing secret."""

    async def finish(
        self, batch_id: str, status: str, status_code: int | None, error: str | None
    ) -> None:
        """Record the delivery's end."""


async def deliver_webhook(event: JobEvent, store: Store, post: Post) -> str:
    """Deliver the webhook for ``event``; return what happened (for logs and tests)."""
    batch = await store.batch(event.batch_id)
    if batch is None or not batch.webhook_url or batch.cron:
        return "no_webhook"
    message_id = f"msg_{batch.id}"
    if not await store.claim(batch.id, batch.webhook_url, message_id):
        return "already_delivered"
    body = orjson.dumps(batch.webhook_body())
    secret = await store.signing_secret(batch.workspace_id)
    result = await post(batch.webhook_url, body, signed_headers(secret, message_id, body))
    outcome = "delivered" if result.delivered else "refused" if result.refused else "failed"
    await store.finish(batch.id, outcome, result.status_code, result.error)
    WEBHOOK_DELIVERIES.labels(outcome).inc()
    log.info(
        "webhook_" + outcome,
        extra={"batch_id": batch.id, "status_code": result.status_code, "error": result.error},
    )
    return outcome
