"""The aggregator: the results shard queues in chunks, and the outbox scan.

It consumes its shards (``shards``; by default every one) and the unsharded ``results``
queue, all on one channel, so one chunk may hold messages of several shards. Each shard
queue has a single active consumer: one aggregator records a shard's jobs at a time,
the others wait and take over when it goes. A chunk is what arrives within a linger
of its first message (at most ``linger_s``), up to a size that grows from ``chunk`` to
``chunk_max`` messages under load and ``chunk_bytes`` of message bodies (one bigger
message is a chunk alone; see :mod:`relay_batches.kit.pace`); it is acked (one
multiple-ack) only after its transaction committed and its events were confirmed. If
recording fails (database away), the chunk is requeued after a pause; after a few chunks
failed in a row the aggregator steps aside (cancels its consumers, requeues what it
holds, and subscribes again once the ledger check passes, after at most
``step_aside_s``), so a standby takes its shards meanwhile. Messages holding
an outcome the ledger can never store (a row index out of its job's range, a value the
database refuses even as an error outcome) go to ``<ns>.results.dead`` once the rest of
the chunk is recorded. Every ``outbox_every_s``, terminal jobs nobody announced are
announced, and the rows of jobs whose budget stopped them that were never released get
their ``budget_exceeded`` outcome (bounded steps, for about a second per pass).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from relay_batches.kit.base import BusService, ReadyCheck, ServiceBus
from relay_batches.kit.chunks import STEP_ASIDE_S, ConsumeChunks, DeadLetter
from relay_batches.kit.periodic import every
from relay_batches.messages import OutcomesMessage
from relay_batches.services.aggregator.core import Aggregator


class AggregatorBus(ServiceBus, Protocol):
    """What the aggregator needs of :class:`relay_batches.bus.client.Bus`."""

    async def publish(
        self,
        queue: str,
        body: bytes,
        *,
        kind: str,
        priority: int = 0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Publish to a durable queue and wait for the confirm."""


def aggregator_service(
    bus: AggregatorBus,
    aggregator: Aggregator,
    ledger: ReadyCheck,
    *,
    prefetch: int,
    chunk: int,
    outbox_every_s: float,
    grace_s: float,
    linger_s: float = 0.005,
    chunk_bytes: int = 16 * 1024 * 1024,
    chunk_max: int = 0,
    shards: Sequence[int] = (),
    step_aside_s: float = STEP_ASIDE_S,
) -> BusService:
    """The aggregator's declaration; ``shards`` empty: every results shard."""
    dead = bus.names.results_dead
    taken = shards or range(bus.names.shards)

    async def dead_letter(body: bytes, reason: str) -> None:
        await bus.publish(dead, body, kind="dead_letter", headers={"x-relay-error": reason})

    results = ConsumeChunks(
        bus.names.results,
        "results",
        OutcomesMessage.decode,
        aggregator.record_messages,
        prefetch=prefetch,
        chunk=chunk,
        linger_s=linger_s,
        dead_letter=DeadLetter(dead, dead_letter),
        chunk_bytes=chunk_bytes,
        chunk_max=chunk_max,
        also_queues=tuple(bus.names.results_shard(k) for k in taken),
        step_aside_s=step_aside_s,
        recovered=ledger,
    )
    outbox = every("outbox-scan", outbox_every_s, lambda: aggregator.outbox_pass(outbox_every_s))
    return BusService(bus, [results], periodic=[outbox], ledger=ledger, grace_s=grace_s)
