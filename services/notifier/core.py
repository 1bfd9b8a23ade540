"""Delivering one completion webhook: claim, mark posting, sign, POST (guarded, bounded),
record.

The claim comes first so a redelivered ``job.finished`` never POSTs twice, and by default
a failed POST is never retried ("once, no retry"). Each attempt is at most once, and
exactly once whenever the notifier that POSTs lives to record it:

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

A workspace may opt into automatic retries (``webhook_max_attempts`` above 1): an attempt
that failed (not delivered, not refused by the URL guard) is recorded ``retrying``,
due after :meth:`RetryPolicy.retry_in`, while attempts remain and before the delivery's
``retry_until``; the deferred pass claims it when due and POSTs the next attempt through
the same claim protocol. A redelivery asked for through the API is one attempt, never
retried.
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
from typing import Protocol

import orjson

from relay_batches.errors import TransientError
from relay_batches.ledger.deliveries import Attempt, Claim, Deferred
from relay_batches.messages import JobEvent
from relay_batches.metrics import WEBHOOK_DELIVERIES
from relay_batches.model import DeliveryStatus, Job
from relay_batches.services.notifier.receivers import Hold, ReceiverBusy, ReceiverGate
from relay_batches.webhooks import signed_headers

log = logging.getLogger("relay.notifier")

# How long recording a result retries through a database outage: under the broker's
# consumer timeout (30 min), which would close the channel of the unacked job.finished.
RECORD_BUDGET_S = 600.0
RECORD_RETRY_S = 1.0
CLAIM_MARGIN_S = 20.0
RECOVER_PASS = 20  # expired claims taken over per recovery pass
DEFERRED_PASS = 64  # deferred deliveries in flight at once in a deferred pass
REFILL_S = 0.5  # while POSTs are in flight, look for more deferred deliveries this often
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

    async def claim_deferred(self, batch_id: str) -> Claim | None:
        """Claim a deferred (or due retrying) delivery; None if another notifier did."""


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
    return await _record_outcome(job, claim, store, result, policy)


def _never() -> bool:
    return False


async def deliver_deferred(
    store: DeferredStore,
    post: Post,
    gate: ReceiverGate,
    stopping: Callable[[], bool] = _never,
    policy: RetryPolicy = DEFAULT_RETRY,
) -> int:
    """Deliver deferred deliveries, and retrying ones that are due, whose receiver has a
    free slot, concurrently, oldest first; return how many were POSTed.

    The listing leaves out the receivers and workspaces that are busy here, so a backlog
    of busy receivers never hides the others'. Up to ``DEFERRED_PASS`` run at once, and
    the pass looks for more whenever one ends and every ``REFILL_S`` meanwhile: a hanging
    POST holds only its own slot, never the others' turn. The pass ends when nothing is
    in flight and nothing more can start; once ``stopping()``, it starts nothing more and
    ends with the POSTs in flight (each within the webhook timeout).
    """
    running: set[asyncio.Task[bool]] = set()
    delivered = 0
    failure: BaseException | None = None
    try:
        while True:
            if failure is None and not stopping() and len(running) < DEFERRED_PASS:
                waiting = await store.deferred(
                    DEFERRED_PASS - len(running),
                    gate.slots,
                    gate.full_workspaces(),
                    gate.busy_receivers(),
                )
                for item in waiting:
                    hold = gate.reserve(item.workspace_id, item.url)
                    if hold is not None:
                        running.add(
                            _start(_deliver_one_deferred(item, store, post, gate, hold, policy))
                        )
            if not running:
                break
            done, _ = await asyncio.wait(
                running, timeout=REFILL_S, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                running.discard(task)
                # Every delivery runs to its end before a failure, e.g. a record that
                # outlasted its budget, ends the pass.
                if task.exception() is not None:
                    failure = failure or task.exception()
                elif task.result():
                    delivered += 1
    finally:
        await _cancel_all(running)
    if failure is not None:
        raise failure
    return delivered


def _start(work: Coroutine[object, object, bool]) -> asyncio.Task[bool]:
    return asyncio.create_task(work, name="webhook-delivery")


async def _cancel_all(tasks: set[asyncio.Task[bool]]) -> None:
    """Cancel what is still running (only when the pass itself is cancelled or failed)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _deliver_one_deferred(
    waiting: Deferred,
    store: DeferredStore,
    post: Post,
    gate: ReceiverGate,
    hold: Hold,
    policy: RetryPolicy,
) -> bool:
    """Claim and POST one deferred (or due retrying) delivery in the slot ``hold``; True
    if POSTed."""
    job: Job | None = None
    try:
        claim = await store.claim_deferred(waiting.batch_id)
        if claim is None:
            return False
        job = await store.job(waiting.batch_id)
        result = None
        if job is not None and job.webhook_url:
            result = await _post(job, job.webhook_url, claim, store, post)
    finally:
        gate.release(hold)
    if job is None or not job.webhook_url:
        await _record(store, claim, DeliveryStatus.FAILED, None, "batch or webhook URL is gone")
        return False
    if result is None:
        return False
    await _record_outcome(job, claim, store, result, policy)
    return True


def _receiver_slot(
    gate: ReceiverGate | None, workspace_id: str, url: str, *, wait: bool
) -> contextlib.AbstractAsyncContextManager[None]:
    if gate is None:
        return contextlib.nullcontext()
    return gate.slot(workspace_id, url, wait=wait)


async def recover_deliveries(
    store: RecoveryStore,
    post: Post,
    gate: ReceiverGate | None = None,
    limit: int = RECOVER_PASS,
    policy: RetryPolicy = DEFAULT_RETRY,
) -> int:
    """POST the deliveries whose claim expired before their POST (their notifier died);
    mark ``unknown`` those whose claim expired while ``posting`` (never POSTed again).

    Each claim is taken over right before its own POST (a claim taken with others would
    run down its clock while they are POSTed), and the POSTs run concurrently, each in
    a slot of its receiver: a takeover whose receiver (or workspace) is busy is handed
    back as a deferred delivery rather than waiting, so a hanging receiver delays only
    its own deliveries.
    """
    for batch_id in await store.mark_unknown():
        WEBHOOK_DELIVERIES.labels(DeliveryStatus.UNKNOWN).inc()
        log.warning("webhook_outcome_unknown", extra={"batch_id": batch_id})
    running: list[asyncio.Task[bool]] = []
    try:
        for _ in range(limit):
            claims = await store.reclaim_expired(1)
            if not claims:
                break
            claim = claims[0]
            job = await store.job(claim.batch_id)
            if job is None or not job.webhook_url:
                await _record(
                    store, claim, DeliveryStatus.FAILED, None, "batch or webhook URL is gone"
                )
                continue
            hold = None if gate is None else gate.reserve(job.workspace_id, job.webhook_url)
            if gate is not None and hold is None:
                await store.hand_back(claim)
                log.info("webhook_takeover_deferred", extra={"batch_id": claim.batch_id})
                continue
            log.warning(
                "webhook_claim_taken_over",
                extra={"batch_id": claim.batch_id, "claim": claim.number},
            )
            running.append(_start(_take_over(job, claim, store, post, (gate, hold), policy)))
        done = await asyncio.gather(*running, return_exceptions=True)
    finally:
        await _cancel_all({t for t in running if not t.done()})
    for failure in (d for d in done if isinstance(d, BaseException)):
        raise failure
    recovered = sum(1 for d in done if d is True)
    if recovered:
        log.info("deliveries_recovered", extra={"deliveries": recovered})
    return recovered


async def _take_over(
    job: Job,
    claim: Claim,
    store: Store,
    post: Post,
    slot: tuple[ReceiverGate | None, Hold | None],
    policy: RetryPolicy,
) -> bool:
    assert job.webhook_url is not None
    gate, hold = slot
    try:
        result = await _post(job, job.webhook_url, claim, store, post)
    finally:
        if gate is not None and hold is not None:
            gate.release(hold)
    if result is None:
        return False
    await _record_outcome(job, claim, store, result, policy)
    return True


async def _post(job: Job, url: str, claim: Claim, store: Store, post: Post) -> Posted | None:
    """Sign, mark ``posting``, POST; None (nothing sent) if the claim was taken over."""
    body = orjson.dumps(job.webhook_body())
    secret = await store.signing_secret(job.workspace_id)
    attempt = await store.start_post(claim)
    if not attempt:
        log.warning("webhook_claim_lost", extra={"batch_id": claim.batch_id, "claim": claim.number})
        return None
    marked_at = time.monotonic()
    result = await post(url, body, signed_headers(secret, f"msg_{job.id}", body))
    duration_ms = round((time.monotonic() - marked_at) * 1000)
    return Posted(result, attempt, marked_at, duration_ms)


async def _record_outcome(
    job: Job, claim: Claim, store: Store, posted: Posted, policy: RetryPolicy
) -> str:
    result = posted.result
    outcome = _outcome(result)
    retry_in_s = None
    if outcome is DeliveryStatus.FAILED:
        retry_in_s = policy.retry_in(posted.attempt, time.monotonic() - posted.marked_at)
        if retry_in_s is not None:
            outcome = DeliveryStatus.RETRYING
    error = None if result.error is None else result.error[:ERROR_CHARS]
    await _record(store, claim, outcome, result.status_code, error, posted.duration_ms, retry_in_s)
    WEBHOOK_DELIVERIES.labels(outcome).inc()
    log.info(
        "webhook_" + outcome,
        extra={
            "batch_id": job.id,
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


async def _record(
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
