"""The notifier: ``notify`` (bound to ``job.finished``) delivers each webhook; every
``recover_every_s`` it takes over the claims of notifiers that died mid-delivery.

Up to ``NOTIFY_PREFETCH`` deliveries are open at once, but each receiver (a workspace's
``host:port``) gets at most ``RECEIVER_SLOTS`` POSTs in flight and
``RECEIVER_WAITERS`` deliveries waiting (for at most ``wait_s``) behind them, and each
workspace at most ``WORKSPACE_OPEN`` deliveries open over all its receivers: one
workspace holds at most 16 of the 64 open deliveries however many hanging URLs it
names, so a hanging receiver delays only its own workspace's webhooks (see
:mod:`.receivers`). Deliveries beyond that are deferred to the ledger (their message
acked) and delivered by the ``deliver-deferred`` pass, as their receiver has room;
takeovers of dead notifiers' claims take the same slots. The same pass POSTs the
retrying deliveries that are due (automatic retries, and redeliveries asked for through
the API), so it runs every ``DUE_POLL_S`` (or ``recover_every_s`` if shorter): a
redelivery goes out within about half a second. Most passes are only a probe (see
:class:`DueWatch`): two index ranges of what was deferred or came due since the last
listing. The full listing, which reads every waiting delivery (a hanging receiver's
backlog too), runs when the probe finds one, when a POST of the pass ends, and at least
every ``recover_every_s``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from relay_batches.kit.base import BusService, ReadyCheck, ServiceBus
from relay_batches.kit.consumer import Consume
from relay_batches.kit.periodic import Periodic, every
from relay_batches.messages import JobEvent
from relay_batches.services.notifier.core import Post, RecoveryStore, RetryPolicy, deliver_webhook
from relay_batches.services.notifier.deferred import DueWatch, deliver_deferred
from relay_batches.services.notifier.receivers import ReceiverGate
from relay_batches.services.notifier.recovery import recover_deliveries

NOTIFY_PREFETCH = 64
RECEIVER_SLOTS = 4
RECEIVER_WAITERS = 8
WORKSPACE_OPEN = 16
DUE_POLL_S = 0.5  # the deferred pass's period at most: how late a due retry may go out


@dataclass(frozen=True)
class _HaltSeen(Periodic):
    """A periodic task whose pass can tell the service is stopping: the deferred pass
    runs as long as it has work, so it must stop starting POSTs within the grace."""

    halts: list[asyncio.Event] = field(default_factory=list)

    async def loop(self, halt: asyncio.Event) -> None:
        """Remember ``halt``, then pass as usual."""
        self.halts.append(halt)
        await super().loop(halt)

    def halted(self) -> bool:
        """Whether the service is stopping."""
        return any(halt.is_set() for halt in self.halts)


def notifier_service(
    bus: ServiceBus,
    store: RecoveryStore,
    post: Post,
    ledger: ReadyCheck,
    *,
    recover_every_s: float,
    grace_s: float,
    receiver_wait_s: float,
    retry_base_s: float = 30.0,
) -> BusService:
    """The notifier's declaration; a delivery waits at most ``receiver_wait_s`` for a
    slot of its receiver before it is deferred for later, and a failed attempt that may
    be retried waits about ``retry_base_s`` × 2^(attempt−1) (see :class:`RetryPolicy`)."""
    gate = ReceiverGate(RECEIVER_SLOTS, RECEIVER_WAITERS, receiver_wait_s, WORKSPACE_OPEN)
    policy = RetryPolicy(retry_base_s)
    finished = Consume(
        bus.names.notify,
        "finished",
        JobEvent.decode,
        lambda event: deliver_webhook(event, store, post, gate, policy),
        NOTIFY_PREFETCH,
    )
    recovery = every(
        "recover-deliveries",
        recover_every_s,
        lambda: recover_deliveries(store, post, gate, policy=policy),
    )

    watch = DueWatch(recover_every_s)

    async def deferred_pass() -> None:
        await deliver_deferred(store, post, gate, deferred.halted, policy, watch)

    deferred = _HaltSeen("deliver-deferred", min(recover_every_s, DUE_POLL_S), deferred_pass)
    return BusService(
        bus, [finished], periodic=[recovery, deferred], ledger=ledger, grace_s=grace_s
    )
