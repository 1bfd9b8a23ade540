"""Delivering one completion webhook: claim, sign, POST (guarded, bounded, no retry),
record.

The claim comes first so a redelivered ``job.finished`` never POSTs twice, and a failed
POST is never retried ("once, no retry"). A notifier that dies between its claim and
its record leaves the claim ``sending``; once the claim expires, :func:`recover_deliveries`
takes it over and POSTs, so a crash does not lose the webhook. What remains is a
window of milliseconds: a crash after the receiver got the POST but before the ledger
recorded it yields a second POST.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import orjson

from relay.batches import Batch
from relay.errors import TransientError
from relay.messages import JobEvent
from relay.metrics import WEBHOOK_DELIVERIES
from relay.webhooks import signed_headers

log = logging.getLogger("relay.notifier")

RECORD_ATTEMPTS = 15
RECORD_RETRY_S = 1.0


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


class RecoveryStore(Store, Protocol):
    """What taking over expired claims needs on top of :class:`Store`."""

    async def reclaim_expired(self, limit: int = 20) -> list[str]:
        """Renew expired ``sending`` claims as ours; return their batch ids."""


async def deliver_webhook(event: JobEvent, store: Store, post: Post) -> str:
    """Deliver the webhook for ``event``; return what happened (for logs and tests)."""
    batch = await store.batch(event.batch_id)
    if batch is None or not batch.webhook_url or batch.cron:
        return "no_webhook"
    message_id = f"msg_{batch.id}"
    if not await store.claim(batch.id, batch.webhook_url, message_id):
        return "already_delivered"
    return await _post_and_record(batch, batch.webhook_url, store, post)


async def recover_deliveries(store: RecoveryStore, post: Post) -> int:
    """POST the deliveries whose claim expired unrecorded (their notifier died)."""
    recovered = 0
    for batch_id in await store.reclaim_expired():
        batch = await store.batch(batch_id)
        if batch is None or not batch.webhook_url:
            await _record(store, batch_id, "failed", None, "batch or webhook URL is gone")
            continue
        log.warning("webhook_claim_taken_over", extra={"batch_id": batch_id})
        await _post_and_record(batch, batch.webhook_url, store, post)
        recovered += 1
    return recovered


async def _post_and_record(batch: Batch, url: str, store: Store, post: Post) -> str:
    body = orjson.dumps(batch.webhook_body())
    secret = await store.signing_secret(batch.workspace_id)
    result = await post(url, body, signed_headers(secret, f"msg_{batch.id}", body))
    outcome = "delivered" if result.delivered else "refused" if result.refused else "failed"
    await _record(store, batch.id, outcome, result.status_code, result.error)
    WEBHOOK_DELIVERIES.labels(outcome).inc()
    log.info(
        "webhook_" + outcome,
        extra={"batch_id": batch.id, "status_code": result.status_code, "error": result.error},
    )
    return outcome


async def _record(
    store: Store, batch_id: str, outcome: str, status_code: int | None, error: str | None
) -> None:
    """Record the delivery, retrying while the database is briefly away: the POST went
    out, and an unrecorded claim would later be taken over and POSTed again."""
    for attempt in range(RECORD_ATTEMPTS):
        try:
            await store.finish(batch_id, outcome, status_code, error)
            return
        except TransientError as exc:
            if attempt + 1 == RECORD_ATTEMPTS:
                raise
            log.warning("webhook_record_failed", extra={"batch_id": batch_id, "error": str(exc)})
            await asyncio.sleep(RECORD_RETRY_S)
