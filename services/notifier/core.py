"""Delivering one completion webhook: claim, sign, POST (guarded, bounded, no retry),
record.

The claim comes first so a redelivered ``job.finished`` never POSTs twice, and a failed
POST is never retried ("once, no retry"). A notifier that dies between its claim and
its record leaves the claim ``sending``; once the claim expires, :func:`recover_deliveries`
takes it over and POSTs, so a crash does not lose the webhook. What remains is a
window of milliseconds: a crash after the receiver got the POST but before the ledger
recorded it yields a second POST. A claim lasts longer than a whole delivery
(:func:`claim_seconds`), and a record is fenced by the claim's number, so a notifier
that is merely slow is neither taken over nor able to overwrite its successor's record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import orjson

from relay_batches.errors import TransientError
from relay_batches.ledger.deliveries import Claim
from relay_batches.messages import JobEvent
from relay_batches.metrics import WEBHOOK_DELIVERIES
from relay_batches.model import DeliveryStatus, Job
from relay_batches.webhooks import signed_headers

log = logging.getLogger("relay.notifier")

RECORD_BUDGET_S = 30.0  # how long recording a result retries through a database outage
RECORD_RETRY_S = 1.0
CLAIM_MARGIN_S = 20.0
RECOVER_PASS = 20  # expired claims taken over per recovery pass, one at a time


def claim_seconds(webhook_timeout_s: float) -> float:
    """How long a delivery claim lasts: longer than a whole delivery, so a notifier that
    is still working is never taken over (which would POST the webhook a second time).

    After the claim a delivery reads the batch and the signing secret, POSTs (DNS and
    request under one deadline of ``webhook_timeout_s``), then records the result,
    retrying through a database outage for at most ``RECORD_BUDGET_S``. The webhook
    timeout is counted twice, leaving a whole POST's worth of room for the ledger reads
    before it and the connection's close after it; the margin absorbs event-loop delays
    and the difference between this host's clock and Postgres' ``now()``, which dates
    the claim.
    """
    return 2 * webhook_timeout_s + RECORD_BUDGET_S + CLAIM_MARGIN_S


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

    async def batch(self, batch_id: str) -> Job | None:
        """Read a batch."""

    async def claim(self, batch_id: str, url: str, message_id: str) -> Claim | None:
        """Claim the delivery; None if it was claimed before."""

    async def signing_secret(self, workspace_id: str) -> str:
        """The workspace's webhook signing secret."""

    async def finish(
        self, claim: Claim, status: DeliveryStatus, status_code: int | None, error: str | None
    ) -> bool:
        """Record the delivery's end; False if ``claim`` is no longer the live one."""


class RecoveryStore(Store, Protocol):
    """What taking over expired claims needs on top of :class:`Store`."""

    async def reclaim_expired(self, limit: int = 20) -> list[Claim]:
        """Renew expired ``sending`` claims as ours; return them."""


async def deliver_webhook(event: JobEvent, store: Store, post: Post) -> str:
    """Deliver the webhook for ``event``; return what happened (for logs and tests)."""
    batch = await store.batch(event.batch_id)
    if batch is None or not batch.webhook_url or batch.cron:
        return "no_webhook"
    message_id = f"msg_{batch.id}"
    claim = await store.claim(batch.id, batch.webhook_url, message_id)
    if claim is None:
        return "already_delivered"
    return await _post_and_record(batch, batch.webhook_url, claim, store, post)


async def recover_deliveries(store: RecoveryStore, post: Post, limit: int = RECOVER_PASS) -> int:
    """POST the deliveries whose claim expired unrecorded (their notifier died).

    One claim is taken over at a time, right before its delivery: a claim taken with
    others would run down its clock while the earlier ones are POSTed.
    """
    recovered = 0
    for _ in range(limit):
        claims = await store.reclaim_expired(1)
        if not claims:
            break
        claim = claims[0]
        batch = await store.batch(claim.batch_id)
        if batch is None or not batch.webhook_url:
            await _record(store, claim, DeliveryStatus.FAILED, None, "batch or webhook URL is gone")
            continue
        log.warning(
            "webhook_claim_taken_over", extra={"batch_id": claim.batch_id, "claim": claim.number}
        )
        await _post_and_record(batch, batch.webhook_url, claim, store, post)
        recovered += 1
    if recovered:
        log.info("deliveries_recovered", extra={"deliveries": recovered})
    return recovered


async def _post_and_record(batch: Job, url: str, claim: Claim, store: Store, post: Post) -> str:
    body = orjson.dumps(batch.webhook_body())
    secret = await store.signing_secret(batch.workspace_id)
    result = await post(url, body, signed_headers(secret, f"msg_{batch.id}", body))
    outcome = _outcome(result)
    await _record(store, claim, outcome, result.status_code, result.error)
    WEBHOOK_DELIVERIES.labels(outcome).inc()
    log.info(
        "webhook_" + outcome,
        extra={"batch_id": batch.id, "status_code": result.status_code, "error": result.error},
    )
    return outcome


def _outcome(result: PostResult) -> DeliveryStatus:
    if result.delivered:
        return DeliveryStatus.DELIVERED
    return DeliveryStatus.REFUSED if result.refused else DeliveryStatus.FAILED


async def _record(
    store: Store, claim: Claim, outcome: DeliveryStatus, status_code: int | None, error: str | None
) -> None:
    """Record the delivery, retrying for up to ``RECORD_BUDGET_S`` while the database is
    briefly away: the POST went out, and an unrecorded claim would later be taken over
    and POSTed again. A record fenced out (the claim was taken over) is only logged."""
    try:
        async with asyncio.timeout(RECORD_BUDGET_S):
            recorded = await _finish_retrying(store, claim, outcome, status_code, error)
    except TimeoutError:
        raise TransientError(
            f"could not record the webhook delivery within {RECORD_BUDGET_S:g}s"
        ) from None
    if not recorded:
        log.warning(
            "webhook_record_fenced",
            extra={"batch_id": claim.batch_id, "claim": claim.number, "outcome": outcome},
        )


async def _finish_retrying(
    store: Store, claim: Claim, outcome: DeliveryStatus, status_code: int | None, error: str | None
) -> bool:
    while True:
        try:
            return await store.finish(claim, outcome, status_code, error)
        except TransientError as exc:
            log.warning(
                "webhook_record_failed", extra={"batch_id": claim.batch_id, "error": str(exc)}
            )
            await asyncio.sleep(RECORD_RETRY_S)
