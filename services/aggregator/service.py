"""The aggregator: the ``results`` queue in chunks, and the outbox scan.

A chunk is what arrives within ``linger_s`` of its first message, up to ``chunk``
messages and ``chunk_bytes`` of message bodies (one bigger message is a chunk alone);
it is acked (one multiple-ack) only after its transaction committed and its events
were confirmed. If recording fails (database away), the chunk is requeued after
a pause. Every ``outbox_every_s``, terminal jobs nobody announced are announced.
"""

from __future__ import annotations

from relay_batches.kit.base import BusService, ReadyCheck, ServiceBus
from relay_batches.kit.consumer import ConsumeChunks
from relay_batches.kit.periodic import every
from relay_batches.messages import OutcomesMessage
from relay_batches.services.aggregator.core import Aggregator

RETRY_PAUSE_S = 1.0


def aggregator_service(
    bus: ServiceBus,
    aggregator: Aggregator,
    ledger: ReadyCheck,
    *,
    prefetch: int,
    chunk: int,
    outbox_every_s: float,
    grace_s: float,
    linger_s: float = 0.005,
    chunk_bytes: int = 16 * 1024 * 1024,
) -> BusService:
    """The aggregator's declaration."""
    results = ConsumeChunks(
        bus.names.results,
        "results",
        OutcomesMessage.decode,
        aggregator.record_messages,
        prefetch=prefetch,
        chunk=chunk,
        linger_s=linger_s,
        retry_pause_s=RETRY_PAUSE_S,
        chunk_bytes=chunk_bytes,
    )
    outbox = every(
        "outbox-scan", outbox_every_s, lambda: aggregator.announce_unannounced(outbox_every_s)
    )
    return BusService(bus, [results], periodic=[outbox], ledger=ledger, grace_s=grace_s)
