"""The notifier: ``notify`` (bound to ``job.finished``) delivers each webhook; every
``recover_every_s`` it takes over the claims of notifiers that died mid-delivery."""

from __future__ import annotations

from relay_batches.kit.base import BusService, ReadyCheck, ServiceBus
from relay_batches.kit.consumer import Consume
from relay_batches.kit.periodic import every
from relay_batches.messages import JobEvent
from relay_batches.services.notifier.core import (
    Post,
    RecoveryStore,
    deliver_webhook,
    recover_deliveries,
)

NOTIFY_PREFETCH = 16


def notifier_service(
    bus: ServiceBus,
    store: RecoveryStore,
    post: Post,
    ledger: ReadyCheck,
    *,
    recover_every_s: float,
    grace_s: float,
) -> BusService:
    """The notifier's declaration."""
    finished = Consume(
        bus.names.notify,
        "finished",
        JobEvent.decode,
        lambda event: deliver_webhook(event, store, post),
        NOTIFY_PREFETCH,
    )
    recovery = every("recover-deliveries", recover_every_s, lambda: recover_deliveries(store, post))
    return BusService(bus, [finished], periodic=[recovery], ledger=ledger, grace_s=grace_s)
