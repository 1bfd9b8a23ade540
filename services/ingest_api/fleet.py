"""The row-workers and queues as the panel's Workers page shows them (``GET /v1/workers``).

The ingest-api listens to two kinds of events on the bus, through a private auto-delete
queue: every row-worker's heartbeat (``worker.holding``: the rows it holds and how many it
runs at once) and every 429 a deployment answered (``ratelimit.throttled``). It keeps the
latest heartbeat per worker until its ``ttl_s`` passes (a worker that stops reporting is
gone) and the latest throttle per deployment for :data:`THROTTLE_SHOWN_S`, so memory is
one entry per live worker (:data:`MAX_WORKERS` at most) and per throttled deployment
(:data:`MAX_DEPLOYMENTS` at most). Queue depths are read by passive declares, at most one
reading every :data:`DEPTHS_EVERY_S` whatever the number of panels polling.

A heartbeat names jobs of every workspace: the API shows a workspace the names of its own
jobs only (one ``= ANY`` query) and the count of other rows a worker holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import EVENT_HOLDING, EVENT_THROTTLED
from relay_batches.messages import HoldingReport, MessageError, ThrottledEvent

log = logging.getLogger("relay.ingest_api")

MAX_WORKERS = 1000
MAX_DEPLOYMENTS = 1000
THROTTLE_SHOWN_S = 60.0  # a deployment's last 429 is shown this long
DEPTHS_EVERY_S = 1.0


@dataclass(frozen=True)
class SeenWorker:
    """A live worker's latest heartbeat and when it came (monotonic seconds)."""

    report: HoldingReport
    at: float


@dataclass
class FleetWatch:
    """The latest heartbeat per live worker, the latest 429 per deployment, and the
    queue depths read at most every :data:`DEPTHS_EVERY_S`."""

    clock: Callable[[], float] = time.monotonic
    workers: dict[str, SeenWorker] = field(default_factory=dict)
    throttled: dict[str, tuple[ThrottledEvent, float]] = field(default_factory=dict)
    _depths: tuple[float, list[dict[str, Any]]] | None = None

    async def start(self, bus: Bus) -> None:
        """Bind the private queue and consume the two kinds of event."""
        await bus.consume_events([EVENT_HOLDING, EVENT_THROTTLED], self.on_message)

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """Take one event into memory, then ack it (a bad one is dropped)."""
        try:
            if message.routing_key == EVENT_HOLDING:
                self.on_holding(HoldingReport.decode(message.body))
            elif message.routing_key == EVENT_THROTTLED:
                self.on_throttled(ThrottledEvent.decode(message.body))
        except MessageError as exc:
            log.warning("bad_fleet_event", extra={"error": str(exc)})
        await message.ack()

    def on_holding(self, report: HoldingReport) -> None:
        """A worker's heartbeat replaces its previous one."""
        self._expire()
        if report.worker in self.workers or len(self.workers) < MAX_WORKERS:
            self.workers[report.worker] = SeenWorker(report, self.clock())

    def on_throttled(self, event: ThrottledEvent) -> None:
        """A deployment's 429 replaces its previous one."""
        self._expire()
        if event.deployment in self.throttled or len(self.throttled) < MAX_DEPLOYMENTS:
            self.throttled[event.deployment] = (event, self.clock())

    def _expire(self) -> None:
        now = self.clock()
        for name, seen in list(self.workers.items()):
            if now - seen.at > seen.report.ttl_s:
                del self.workers[name]
        for name, (_, at) in list(self.throttled.items()):
            if now - at > THROTTLE_SHOWN_S:
                del self.throttled[name]

    def live(self) -> list[SeenWorker]:
        """The live workers, by name."""
        self._expire()
        return [self.workers[name] for name in sorted(self.workers)]

    def throttles(self) -> list[dict[str, Any]]:
        """The deployments that answered 429 lately: name, Retry-After, seconds since."""
        self._expire()
        now = self.clock()
        return [
            {
                "deployment": name,
                "retry_after_s": event.retry_after,
                "seconds_ago": round(now - at, 1),
            }
            for name, (event, at) in sorted(self.throttled.items())
        ]

    async def depths(self, bus: Bus, queues: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
        """``[{queue, ready, consumers}]`` of ``queues`` (``(label, queue name)``), read
        again only when the last reading is older than :data:`DEPTHS_EVERY_S`."""
        now = self.clock()
        if self._depths is not None and now - self._depths[0] < DEPTHS_EVERY_S:
            return self._depths[1]
        states = await bus.queue_states([name for _, name in queues])
        found = [
            {"queue": label, "ready": ready, "consumers": consumers}
            for (label, _), (ready, consumers) in zip(queues, states, strict=True)
        ]
        self._depths = (now, found)
        return found


@dataclass(frozen=True)
class Fleet:
    """A :class:`FleetWatch` on a bus: what ``GET /v1/workers`` reads."""

    watch: FleetWatch
    bus: Bus

    def queues(self) -> list[tuple[str, str]]:
        """The queues shown, ``(label, name)``: jobs waiting for a dispatcher, slices
        waiting for a row-worker, outcomes waiting for an aggregator (per shard), finished
        jobs waiting for the notifier, and the outcomes dead-lettered."""
        names = self.bus.names
        shards = [(f"results {i}", q) for i, q in enumerate(names.results_shards)]
        return [
            ("dispatch", names.dispatch),
            ("rows", names.rows),
            *shards,
            ("notify", names.notify),
            ("results dead letter", names.results_dead),
        ]

    async def depths(self) -> list[dict[str, Any]]:
        """The queues' depths and consumers (cached a second)."""
        return await self.watch.depths(self.bus, self.queues())
