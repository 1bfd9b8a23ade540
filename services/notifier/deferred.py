"""The deferred pass: deliveries that waited for their receiver (or a retry that came
due) claimed and POSTed when their receiver has a slot, listed only when a cheap probe
(:class:`DueWatch`) says one is due."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from relay_batches.ledger.deliveries import Deferred
from relay_batches.model import DeliveryStatus
from relay_batches.services.notifier.core import (
    DEFAULT_RETRY,
    DeferredStore,
    Post,
    RetryPolicy,
    Target,
    cancel_all,
    post_claimed,
    record,
    record_outcome,
    resolve_target,
    start_delivery,
)
from relay_batches.services.notifier.receivers import Hold, ReceiverGate

log = logging.getLogger("relay.notifier")


DEFERRED_PASS = 64  # deferred deliveries in flight at once in a deferred pass
REFILL_S = 0.5  # while POSTs are in flight, look for more deferred deliveries this often


# A probe looks this far back before the listing it follows: a delivery deferred (or
# re-armed) in a transaction that had not committed when that listing read is still seen.
PROBE_OVERLAP_S = 1.0


def _never() -> bool:
    return False


class DueWatch:
    """When the deferred pass lists the waiting deliveries (a read of all of them): at
    least every ``full_every_s``, and between those only when :meth:`DeferredStore.probe`
    finds one deferred, or come due, since the last listing (less ``PROBE_OVERLAP_S``)
    of a receiver not busy here. A backlog of a busy (hanging) receiver is thus read
    every ``full_every_s``, not at every poll; one that waited for a receiver busy here
    goes out at the next listing (a slot freed in the pass, or the timer)."""

    def __init__(self, full_every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.full_every_s = full_every_s
        self._clock = clock
        self._since: datetime | None = None
        self._listed_at: float | None = None

    async def listing_due(self, store: DeferredStore, gate: ReceiverGate) -> bool:
        """Ask the probe (cheap); True when the caller should list now (and it records
        the listing as made)."""
        probe = await store.probe(self._since, gate.full_workspaces(), gate.busy_receivers())
        now = self._clock()
        timer = self._listed_at is None or now - self._listed_at >= self.full_every_s
        if not (timer or probe.due):
            return False
        self._since = probe.at - timedelta(seconds=PROBE_OVERLAP_S)
        self._listed_at = now
        return True


async def deliver_deferred(
    store: DeferredStore,
    post: Post,
    gate: ReceiverGate,
    stopping: Callable[[], bool] = _never,
    policy: RetryPolicy = DEFAULT_RETRY,
    watch: DueWatch | None = None,
) -> int:
    """Deliver deferred deliveries, and retrying ones that are due, whose receiver has a
    free slot, concurrently, oldest first; return how many were POSTed.

    The listing leaves out the receivers and workspaces that are busy here, so a backlog
    of busy receivers never hides the others'. Up to ``DEFERRED_PASS`` run at once, and
    the pass looks for more whenever one ends and every ``REFILL_S`` meanwhile: a hanging
    POST holds only its own slot, never the others' turn. With a ``watch``, a look that
    does not follow a POST's end lists only when :meth:`DueWatch.listing_due` says so
    (otherwise each one lists). The pass ends when nothing is in flight and nothing more
    can start; once ``stopping()``, it starts nothing more and ends with the POSTs in
    flight (each within the webhook timeout).
    """
    running: set[asyncio.Task[bool]] = set()
    delivered = 0
    failure: BaseException | None = None
    slot_freed = False
    try:
        while True:
            if (
                failure is None
                and not stopping()
                and len(running) < DEFERRED_PASS
                and (slot_freed or watch is None or await watch.listing_due(store, gate))
            ):
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
                            start_delivery(
                                _deliver_one_deferred(item, store, post, gate, hold, policy)
                            )
                        )
            if not running:
                break
            done, _ = await asyncio.wait(
                running, timeout=REFILL_S, return_when=asyncio.FIRST_COMPLETED
            )
            slot_freed = bool(done)
            for task in done:
                running.discard(task)
                # Every delivery runs to its end before a failure, e.g. a record that
                # outlasted its budget, ends the pass.
                if task.exception() is not None:
                    failure = failure or task.exception()
                elif task.result():
                    delivered += 1
    finally:
        await cancel_all(running)
    if failure is not None:
        raise failure
    return delivered


async def _deliver_one_deferred(
    waiting: Deferred,
    store: DeferredStore,
    post: Post,
    gate: ReceiverGate,
    hold: Hold,
    policy: RetryPolicy,
) -> bool:
    """Claim and POST one deferred (or due retrying) delivery in the slot ``hold`` (a
    batch's own webhook, or a webhook endpoint's event); True if POSTed."""
    target: Target | str = "not claimed"
    try:
        claim = await store.claim_deferred(waiting.batch_id, waiting.endpoint_id)
        if claim is None:
            return False
        job = None if claim.endpoint_id else await store.job(waiting.batch_id)
        target = await resolve_target(job, claim, store)
        result = None
        if isinstance(target, Target):
            result = await post_claimed(target, claim, store, post)
    finally:
        gate.release(hold)
    if not isinstance(target, Target):
        await record(store, claim, DeliveryStatus.FAILED, None, target)
        return False
    if result is None:
        return False
    await record_outcome(claim, store, result, policy)
    return True
