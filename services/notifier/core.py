"""Delivering one completion webhook: claim, mark posting, sign, POST (guarded, bounded,
no retry), record.

The claim comes first so a redelivered ``job.finished`` never POSTs twice, and a failed
POST is never retried ("once, no retry"). Delivery is at most once, and exactly once
whenever the notifier that POSTs lives to record it:

- a notifier that dies after its claim and before its POST leaves the claim
  ``sending``; once it expires, :func:`recover_deliveries` takes it over and POSTs;
- right before the POST the claim becomes ``posting`` (committed first: no commit, no
  POST), and a ``posting`` delivery is never POSTed again by anyone;
- after the POST the holder records the outcome, retrying through a database outage
  for up to ``RECORD_BUDGET_S``. A ``posting`` claim that outlived its expiry meanwhile
  is marked ``unknown`` by the recovery pass, not taken over: the holder's late record
  still lands (fenced by its claim number), so an outage costs neither a second POST
  nor the record. Only a notifier that dies (or gives up) between its POST and its
  record leaves ``unknown`` for good: the receiver got the POST, or not, once at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import orjson

from relay_batches.errors import TransientError
from relay_batches.ledger.deliveries import Claim, Deferred
from relay_batches.messages import JobEvent
from relay_batches.metrics import WEBHOOK_DELIVERIES
from relay_batches.model import DeliveryStatus, Job
from relay_batches.services.notifier.receivers import ReceiverBusy, ReceiverGate, receiver_key
from relay_batches.webhooks import signed_headers

log = logging.getLogger("relay.notifier")

# How long recording a result retries through a database outage: under the broker's
# consumer timeout (30 min), which would close the channel of the unacked job.finished.
RECORD_BUDGET_S = 600.0
RECORD_RETRY_S = 1.0
CLAIM_MARGIN_S = 20.0
RECOVER_PASS = 20  # expired claims taken over per recovery pass, one at a time
DEFERRED_PASS = 64  # deferred deliveries looked at per round of a deferred pass
DEFERRED_ROUNDS = 10


def claim_seconds(webhook_timeout_s: float) -> float:
    """How long a delivery claim lasts (from the claim, and again from ``posting``):
    longer than a POST and its record, so a live notifier is never even marked.

    A claim reads the signing secret and moves to ``posting``, renewing the expiry; then
    it POSTs (DNS and request under one deadline of ``webhook_timeout_s``) and records.
    The webhook timeout is counted twice, leaving a whole POST's worth of room for the
    ledger writes around it and the connection's close; the margin absorbs event-loop
    delays and the clock skew to Postgres' ``now()``, which dates the claim. A record
    held up longer by a database outage is still safe: the claim is only marked
    ``unknown`` and the record lands when the database returns.
    """
    return 2 * webhook_timeout_s + CLAIM_MARGIN_S


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

    async def job(self, batch_id: str) -> Job | None:
        """Read a batch."""

    async def claim(self, batch_id: str, url: str, message_id: str) -> Claim | None:
        """Claim the delivery; None if it was claimed before."""

    async def signing_secret(self, workspace_id: str) -> str:
        """The workspace's webhook signing secret."""

    async def start_post(self, claim: Claim) -> bool:
        """Mark the claim ``posting``; False if ``claim`` is no longer the live one."""

    async def defer(self, batch_id: str, url: str, message_id: str) -> bool:
        """Record the delivery as deferred; False if it was claimed or deferred before."""

    async def finish(
        self, claim: Claim, status: DeliveryStatus, status_code: int | None, error: str | None
    ) -> bool:
        """Record the delivery's end; False if ``claim`` is no longer the live one."""


class DeferredStore(Store, Protocol):
    """What delivering deferred deliveries needs on top of :class:`Store`."""

    async def deferred(self, limit: int, per_receiver: int) -> list[Deferred]:
        """The oldest deferred deliveries, at most ``per_receiver`` of each receiver."""

    async def claim_deferred(self, batch_id: str) -> Claim | None:
        """Claim a deferred delivery; None if another notifier did."""


class RecoveryStore(DeferredStore, Protocol):
    """What taking over expired claims needs on top of :class:`Store`."""

    async def reclaim_expired(self, limit: int = 20) -> list[Claim]:
        """Renew expired ``sending`` claims as ours; return them."""

    async def mark_unknown(self) -> list[str]:
        """Mark expired ``posting`` claims ``unknown``; return their batch ids."""


async def deliver_webhook(
    event: JobEvent, store: Store, post: Post, gate: ReceiverGate | None = None
) -> str:
    """Deliver the webhook for ``event``; return what happened (for logs and tests).

    With a ``gate``, the claim and the POST hold one of the receiver's slots, waiting a
    bounded time for one; a delivery that gets none is deferred to the ledger (for
    :func:`deliver_deferred`) rather than holding its message. The record is made after
    the slot is released, so a database outage holds no receiver's slot.
    """
    job = await store.job(event.batch_id)
    if job is None or not job.webhook_url or job.cron:
        return "no_webhook"
    url, message_id = job.webhook_url, f"msg_{job.id}"
    try:
        async with _receiver_slot(gate, job.workspace_id, url, wait=True):
            claim = await store.claim(job.id, url, message_id)
            if claim is None:
                return "already_delivered"
            result = await _post(job, url, claim, store, post)
    except ReceiverBusy as busy:
        if not await store.defer(job.id, url, message_id):
            return "already_delivered"
        log.info("webhook_deferred", extra={"batch_id": job.id, "reason": str(busy)})
        return "deferred"
    if result is None:
        return "taken_over"
    return await _record_outcome(job, claim, store, result)


async def deliver_deferred(store: DeferredStore, post: Post, gate: ReceiverGate) -> int:
    """Deliver deferred deliveries whose receiver has a free slot now, concurrently,
    oldest first; repeat while that delivers any (a pass ends when every receiver left
    is busy). Return how many were POSTed."""
    delivered = 0
    for _ in range(DEFERRED_ROUNDS):
        waiting = await store.deferred(DEFERRED_PASS, gate.slots)
        if not waiting:
            break
        # Every delivery runs to its end (none is left behind unawaited) before a
        # failure, e.g. a record that outlasted its budget, ends the pass.
        done = await asyncio.gather(
            *(_deliver_one_deferred(d, store, post, gate) for d in waiting),
            return_exceptions=True,
        )
        for failure in (d for d in done if isinstance(d, BaseException)):
            raise failure
        if not any(done):
            break
        delivered += sum(1 for d in done if d is True)
    return delivered


async def _deliver_one_deferred(
    waiting: Deferred, store: DeferredStore, post: Post, gate: ReceiverGate
) -> bool:
    try:
        async with _receiver_slot(gate, waiting.workspace_id, waiting.url, wait=False):
            claim = await store.claim_deferred(waiting.batch_id)
            if claim is None:
                return False
            job = await store.job(waiting.batch_id)
            if job is None or not job.webhook_url:
                await _record(
                    store, claim, DeliveryStatus.FAILED, None, "batch or webhook URL is gone"
                )
                return False
            result = await _post(job, job.webhook_url, claim, store, post)
    except ReceiverBusy:
        return False
    if result is None:
        return False
    await _record_outcome(job, claim, store, result)
    return True


def _receiver_slot(
    gate: ReceiverGate | None, workspace_id: str, url: str, *, wait: bool
) -> contextlib.AbstractAsyncContextManager[None]:
    if gate is None:
        return contextlib.nullcontext()
    return gate.slot(receiver_key(workspace_id, url), wait=wait)


async def recover_deliveries(store: RecoveryStore, post: Post, limit: int = RECOVER_PASS) -> int:
    """POST the deliveries whose claim expired before their POST (their notifier died);
    mark ``unknown`` those whose claim expired while ``posting`` (never POSTed again).

    One claim is taken over at a time, right before its delivery: a claim taken with
    others would run down its clock while the earlier ones are POSTed.
    """
    for batch_id in await store.mark_unknown():
        WEBHOOK_DELIVERIES.labels(DeliveryStatus.UNKNOWN).inc()
        log.warning("webhook_outcome_unknown", extra={"batch_id": batch_id})
    recovered = 0
    for _ in range(limit):
        claims = await store.reclaim_expired(1)
        if not claims:
            break
        claim = claims[0]
        job = await store.job(claim.batch_id)
        if job is None or not job.webhook_url:
            await _record(store, claim, DeliveryStatus.FAILED, None, "batch or webhook URL is gone")
            continue
        log.warning(
            "webhook_claim_taken_over", extra={"batch_id": claim.batch_id, "claim": claim.number}
        )
        result = await _post(job, job.webhook_url, claim, store, post)
        if result is not None:
            await _record_outcome(job, claim, store, result)
            recovered += 1
    if recovered:
        log.info("deliveries_recovered", extra={"deliveries": recovered})
    return recovered


async def _post(job: Job, url: str, claim: Claim, store: Store, post: Post) -> PostResult | None:
    """Sign, mark ``posting``, POST; None (nothing sent) if the claim was taken over."""
    body = orjson.dumps(job.webhook_body())
    secret = await store.signing_secret(job.workspace_id)
    if not await store.start_post(claim):
        log.warning("webhook_claim_lost", extra={"batch_id": claim.batch_id, "claim": claim.number})
        return None
    return await post(url, body, signed_headers(secret, f"msg_{job.id}", body))


async def _record_outcome(job: Job, claim: Claim, store: Store, result: PostResult) -> str:
    outcome = _outcome(result)
    await _record(store, claim, outcome, result.status_code, result.error)
    WEBHOOK_DELIVERIES.labels(outcome).inc()
    log.info(
        "webhook_" + outcome,
        extra={"batch_id": job.id, "status_code": result.status_code, "error": result.error},
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
    away: the POST went out, and an unrecorded claim would end ``unknown``. A record
    fenced out (the claim was taken over or given up) is only logged."""
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
