"""Recovering deliveries whose notifier died: a claim that expired before its POST
is taken over and POSTed; one that expired while ``posting`` is marked ``unknown``, never
POSTed again."""

from __future__ import annotations

import asyncio
import logging

from relay_batches.ledger.deliveries import Claim
from relay_batches.metrics import WEBHOOK_DELIVERIES
from relay_batches.model import DeliveryStatus
from relay_batches.services.notifier import core
from relay_batches.services.notifier.core import (
    DEFAULT_RETRY,
    Post,
    RecoveryStore,
    RetryPolicy,
    Store,
    Target,
)
from relay_batches.services.notifier.receivers import Hold, ReceiverGate

log = logging.getLogger("relay.notifier")


RECOVER_PASS = 20  # expired claims taken over per recovery pass


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
            target = await core.resolve_target(job, claim, store)
            if job is None or not isinstance(target, Target):
                await core.record(
                    store,
                    claim,
                    DeliveryStatus.FAILED,
                    None,
                    target if isinstance(target, str) else "the batch is gone",
                )
                continue
            hold = None if gate is None else gate.reserve(job.workspace_id, target.url)
            if gate is not None and hold is None:
                await store.hand_back(claim)
                log.info("webhook_takeover_deferred", extra={"batch_id": claim.batch_id})
                continue
            log.warning(
                "webhook_claim_taken_over",
                extra={"batch_id": claim.batch_id, "claim": claim.number},
            )
            running.append(
                core.start_delivery(_take_over(target, claim, store, post, (gate, hold), policy))
            )
        done = await asyncio.gather(*running, return_exceptions=True)
    finally:
        await core.cancel_all({t for t in running if not t.done()})
    for failure in (d for d in done if isinstance(d, BaseException)):
        raise failure
    recovered = sum(1 for d in done if d is True)
    if recovered:
        log.info("deliveries_recovered", extra={"deliveries": recovered})
    return recovered


async def _take_over(
    target: Target,
    claim: Claim,
    store: Store,
    post: Post,
    slot: tuple[ReceiverGate | None, Hold | None],
    policy: RetryPolicy,
) -> bool:
    gate, hold = slot
    try:
        result = await core.post_claimed(target, claim, store, post)
    finally:
        if gate is not None and hold is not None:
            gate.release(hold)
    if result is None:
        return False
    await core.record_outcome(claim, store, result, policy)
    return True
