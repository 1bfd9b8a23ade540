"""Delivering one completion webhook: claim, mark posting, sign, POST (guarded, bounded),
record.

The claim comes first so a redelivered ``job.finished`` never POSTs twice, and by default
a failed POST is never retried ("once, no retry"). Each attempt is at most once, and
exactly once whenever the notifier that POSTs lives to record it:

- a notifier that dies after its claim and before its POST leaves the claim
  ``sending``; once it expires, the recovery pass
  (:mod:`~relay_batches.services.notifier.recovery`) takes it over and POSTs;
- right before the POST the claim becomes ``posting`` (committed first: no commit, no
  POST), and a ``posting`` delivery is never POSTed again by anyone;
- after the POST the holder records the outcome, retrying through a database outage
  for up to ``RECORD_BUDGET_S``. A ``posting`` claim that outlived its expiry meanwhile
  is marked ``unknown`` by the recovery pass, not taken over: the holder's late record
  still lands (fenced by its claim number), so an outage costs neither a second POST
  nor the record. Only a notifier that dies (or gives up) between its POST and its
  record leaves ``unknown`` for good: the receiver got the POST, or not, once at most.

A workspace may opt into automatic retries (``webhook_max_attempts`` above 1): an attempt
that failed (not delivered, not refused by the URL guard) is recorded ``retrying``,
due after :meth:`RetryPolicy.retry_in`, while attempts remain and before the delivery's
``retry_until``; the deferred pass (:mod:`~relay_batches.services.notifier.deferred`)
claims it when due and POSTs the next attempt through the same claim protocol. A
redelivery asked for through the API is one attempt, never retried.

A batch's end is also an event for each of its workspace's webhook endpoints whose
events name it: :func:`deliver_webhook` records them first, deferred
(:meth:`Store.fan_out`), and the deferred pass POSTs each through the same protocol,
as a claim whose ``endpoint_id`` names the endpoint, signed with the endpoint's secret
(:func:`resolve_target`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import orjson

from relay_batches.errors import TransientError
from relay_batches.ledger.deliveries import Attempt, Claim, Deferred, Probe
from relay_batches.ledger.webhook_endpoints import EndpointTarget
from relay_batches.messages import JobEvent
from relay_batches.metrics import WEBHOOK_DELIVERIES
from relay_batches.model import DeliveryStatus, Job
from relay_batches.services.notifier.receivers import ReceiverBusy, ReceiverGate
from relay_batches.services.notifier.traced import traced_post
from relay_batches.webhooks import signed_headers

log = logging.getLogger("relay.notifier")

# How long recording a result retries through a database outage: under the broker's
# consumer timeout (30 min), which would close the channel of the unacked job.finished.
RECORD_BUDGET_S = 600.0
RECORD_RETRY_S = 1.0
CLAIM_MARGIN_S = 20.0
RETRY_CAP_S = 3600.0  # the longest wait between two automatic attempts
ERROR_CHARS = 500  # of a POST's error, kept in the delivery log (bounded per attempt)


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


@dataclass(frozen=True)
class Target:
    """What one delivery POSTs: where, its ``webhook-id``, its body and the secret that
    signs it."""

    url: str
    message_id: str
    body: bytes
    secret: str
    trace: str | None = None  # the job's trace context, if traced (see .traced)


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed attempt is tried again: after ``min(base_s × 2^(n−1), cap_s)`` with
    full jitter over its upper half (``jitter()`` in [0, 1)), while the workspace allows
    another attempt and the next one would be due before the delivery's retry window
    closes; a redelivery is never retried."""

    base_s: float = 30.0
    cap_s: float = RETRY_CAP_S
    jitter: Callable[[], float] = random.random

    def backoff_s(self, attempt: int) -> float:
        """The wait after attempt number ``attempt`` (1 for the first) failed."""
        top = min(self.base_s * 2.0 ** min(attempt - 1, 64), self.cap_s)
        return top * (0.5 + 0.5 * self.jitter())

    def retry_in(self, attempt: Attempt, elapsed_s: float) -> float | None:
        """Seconds until the next attempt after ``attempt`` failed ``elapsed_s`` after it
        was marked ``posting``; None when there is none (the delivery ends ``failed``)."""
        if attempt.redelivery or attempt.number >= attempt.max_attempts:
            return None
        delay = self.backoff_s(attempt.number)
        if elapsed_s + delay > attempt.retry_window_s:
            return None
        return delay


DEFAULT_RETRY = RetryPolicy()


@dataclass(frozen=True)
class Posted:
    """A POST that went out: how it went, which attempt it was, when it was marked
    ``posting`` (monotonic) and how long the POST took."""

    result: PostResult
    attempt: Attempt
    marked_at: float
    duration_ms: int


class Store(Protocol):
    """What the notifier needs of the ledger."""

    async def job(self, batch_id: str) -> Job | None:
        """Read a batch."""

    async def claim(self, batch_id: str, url: str, message_id: str) -> Claim | None:
        """Claim the delivery; None if it was claimed before."""

    async def signing_secret(self, workspace_id: str) -> str:
        """The workspace's webhook signing secret."""

    async def fan_out(self, job: Job) -> int:
        """Record the event of ``job``'s end for each matching webhook endpoint
        (deferred); return how many were new."""

    async def endpoint_target(self, batch_id: str, endpoint_id: str) -> EndpointTarget | None:
        """The recorded delivery of ``batch_id`` to a webhook endpoint."""

    async def start_post(self, claim: Claim) -> Attempt | None:
        """Mark the claim ``posting`` and log its attempt; None if ``claim`` is no longer
        the live one."""

    async def defer(self, batch_id: str, url: str, message_id: str) -> bool:
        """Record the delivery as deferred; False if it was claimed or deferred before."""

    async def finish(
        self,
        claim: Claim,
        status: DeliveryStatus,
        status_code: int | None,
        error: str | None,
        *,
        duration_ms: int | None = None,
        retry_in_s: float | None = None,
    ) -> bool:
        """Record how the attempt went (``retrying``: the next is due in ``retry_in_s``);
        False if ``claim`` is no longer the live one."""


class DeferredStore(Store, Protocol):
    """What delivering deferred deliveries needs on top of :class:`Store`."""

    async def deferred(
        self,
        limit: int,
        per_receiver: int,
        skip_workspaces: Sequence[str] = (),
        skip_receivers: Sequence[tuple[str, str]] = (),
    ) -> list[Deferred]:
        """The oldest deferred (and due retrying) deliveries, at most ``per_receiver`` of
        each receiver, leaving out the workspaces and ``(workspace, url)`` pairs named."""

    async def claim_deferred(self, batch_id: str, endpoint_id: str = "") -> Claim | None:
        """Claim a deferred (or due retrying) delivery; None if another notifier did."""

    async def probe(
        self,
        since: datetime | None,
        skip_workspaces: Sequence[str] = (),
        skip_receivers: Sequence[tuple[str, str]] = (),
    ) -> Probe:
        """Whether a delivery was deferred or came due after ``since``, of a receiver
        not named; with the database's time."""


class RecoveryStore(DeferredStore, Protocol):
    """What taking over expired claims needs on top of :class:`Store`."""

    async def reclaim_expired(self, limit: int = 20) -> list[Claim]:
        """Renew expired ``sending`` claims as ours; return them."""

    async def mark_unknown(self) -> list[str]:
        """Mark expired ``posting`` claims ``unknown``; return their batch ids."""

    async def hand_back(self, claim: Claim) -> bool:
        """Turn a claim we took over into a deferred delivery (nobody holds it)."""


async def deliver_webhook(
    event: JobEvent,
    store: Store,
    post: Post,
    gate: ReceiverGate | None = None,
    policy: RetryPolicy = DEFAULT_RETRY,
) -> str:
    """Deliver the webhook for ``event``; return what happened (for logs and tests).

    With a ``gate``, the claim and the POST hold one of the receiver's slots, waiting a
    bounded time for one; a delivery that gets none is deferred to the ledger (for
    :func:`deliver_deferred`) rather than holding its message. The record is made after
    the slot is released, so a database outage holds no receiver's slot. The events of
    the workspace's webhook endpoints are recorded first, for the deferred pass.
    """
    job = await store.job(event.batch_id)
    if job is None or job.cron:
        return "no_webhook"
    events = await store.fan_out(job)
    if events:
        log.info("webhook_events_recorded", extra={"batch_id": job.id, "endpoints": events})
    if not job.webhook_url:
        return "no_webhook"
    url, message_id = job.webhook_url, f"msg_{job.id}"
    try:
        async with receiver_slot(gate, job.workspace_id, url, wait=True):
            claim = await store.claim(job.id, url, message_id)
            if claim is None:
                return "already_delivered"
            target = await resolve_target(job, claim, store)
            assert isinstance(target, Target)  # the job's own webhook URL, just read
            result = await post_claimed(target, claim, store, post)
    except ReceiverBusy as busy:
        if not await store.defer(job.id, url, message_id):
            return "already_delivered"
        log.info("webhook_deferred", extra={"batch_id": job.id, "reason": str(busy)})
        return "deferred"
    if result is None:
        return "taken_over"
    return await record_outcome(claim, store, result, policy)


def start_delivery(work: Coroutine[object, object, bool]) -> asyncio.Task[bool]:
    """Run one delivery (a deferred one, or a takeover) in a task of its own."""
    return asyncio.create_task(work, name="webhook-delivery")


async def cancel_all(tasks: set[asyncio.Task[bool]]) -> None:
    """Cancel what is still running (only when the pass itself is cancelled or failed)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def receiver_slot(
    gate: ReceiverGate | None, workspace_id: str, url: str, *, wait: bool
) -> contextlib.AbstractAsyncContextManager[None]:
    """A slot of the receiver of ``url`` for ``workspace_id`` (nothing to hold without
    a ``gate``)."""
    if gate is None:
        return contextlib.nullcontext()
    return gate.slot(workspace_id, url, wait=wait)


async def resolve_target(job: Job | None, claim: Claim, store: Store) -> Target | str:
    """What ``claim`` POSTs: the batch's completion summary to its webhook URL, signed
    with the workspace's secret, or the event recorded for a webhook endpoint, signed
    with the endpoint's; or why nothing can be sent (the delivery then fails unsent)."""
    if claim.endpoint_id:
        found = await store.endpoint_target(claim.batch_id, claim.endpoint_id)
        if found is None:
            return "the event is gone"
        if found.secret is None:
            return "the webhook endpoint was deleted"
        return Target(found.url, found.message_id, found.body, found.secret)
    if job is None or not job.webhook_url:
        return "batch or webhook URL is gone"
    secret = await store.signing_secret(job.workspace_id)
    body = orjson.dumps(job.webhook_body())
    return Target(job.webhook_url, f"msg_{job.id}", body, secret, job.traceparent)


async def post_claimed(target: Target, claim: Claim, store: Store, post: Post) -> Posted | None:
    """Sign, mark ``posting``, POST; None (nothing sent) if the claim was taken over."""
    attempt = await store.start_post(claim)
    if not attempt:
        log.warning("webhook_claim_lost", extra={"batch_id": claim.batch_id, "claim": claim.number})
        return None
    marked_at = time.monotonic()
    body = target.body
    headers = signed_headers(target.secret, target.message_id, body)
    result = await traced_post(
        post, target.url, body, headers, target.trace, attempt.number, claim.batch_id
    )
    duration_ms = round((time.monotonic() - marked_at) * 1000)
    return Posted(result, attempt, marked_at, duration_ms)


async def record_outcome(claim: Claim, store: Store, posted: Posted, policy: RetryPolicy) -> str:
    """Record what a POST gave (``retrying`` when the policy allows another attempt),
    count and log it; return the outcome."""
    result = posted.result
    outcome = _outcome(result)
    retry_in_s = None
    if outcome is DeliveryStatus.FAILED:
        retry_in_s = policy.retry_in(posted.attempt, time.monotonic() - posted.marked_at)
        if retry_in_s is not None:
            outcome = DeliveryStatus.RETRYING
    error = None if result.error is None else result.error[:ERROR_CHARS]
    await record(store, claim, outcome, result.status_code, error, posted.duration_ms, retry_in_s)
    WEBHOOK_DELIVERIES.labels(outcome).inc()
    log.info(
        "webhook_" + outcome,
        extra={
            "batch_id": claim.batch_id,
            "endpoint_id": claim.endpoint_id or None,
            "attempt": posted.attempt.number,
            "status_code": result.status_code,
            "error": result.error,
            "retry_in_s": retry_in_s,
        },
    )
    return outcome


def _outcome(result: PostResult) -> DeliveryStatus:
    if result.delivered:
        return DeliveryStatus.DELIVERED
    return DeliveryStatus.REFUSED if result.refused else DeliveryStatus.FAILED


async def record(
    store: Store,
    claim: Claim,
    outcome: DeliveryStatus,
    status_code: int | None,
    error: str | None,
    duration_ms: int | None = None,
    retry_in_s: float | None = None,
) -> None:
    """Record the delivery, retrying for up to ``RECORD_BUDGET_S`` while the database is
    away: the POST went out, and an unrecorded claim would end ``unknown``. A record
    fenced out (the claim was taken over or given up) is only logged."""
    finish = functools.partial(
        store.finish,
        claim,
        outcome,
        status_code,
        error,
        duration_ms=duration_ms,
        retry_in_s=retry_in_s,
    )
    try:
        async with asyncio.timeout(RECORD_BUDGET_S):
            recorded = await _finish_retrying(claim, finish)
    except TimeoutError:
        raise TransientError(
            f"could not record the webhook delivery within {RECORD_BUDGET_S:g}s"
        ) from None
    if not recorded:
        log.warning(
            "webhook_record_fenced",
            extra={"batch_id": claim.batch_id, "claim": claim.number, "outcome": outcome},
        )


async def _finish_retrying(claim: Claim, finish: Callable[[], Awaitable[bool]]) -> bool:
    while True:
        try:
            return await finish()
        except TransientError as exc:
            log.warning(
                "webhook_record_failed", extra={"batch_id": claim.batch_id, "error": str(exc)}
            )
            await asyncio.sleep(RECORD_RETRY_S)
