"""The dispatcher loop: wake-ups, progress and cancel events, and a reconcile timer.

Messages are wake-ups; the ledger is the truth. A missed wake-up or progress event only
delays work until the next reconcile tick, which claims queued and orphaned jobs and
renews leases (topping up every window on the way) and re-publishes the unfinished rows
of jobs that made no progress for the stall timeout.

On stop: no new deliveries, in-flight handlers finish (within the grace period), and
the leases are handed back so another dispatcher takes the jobs over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aio_pika.abc import AbstractIncomingMessage

from relay_batches.bus.client import Bus, settle
from relay_batches.bus.topology import EVENT_CANCELED, EVENT_PROGRESS
from relay_batches.inflight import InFlight
from relay_batches.messages import DispatchWakeup, JobEvent
from relay_batches.services.dispatcher.core import Dispatcher

log = logging.getLogger("relay.dispatcher")

DISPATCH_PREFETCH = 4
EVENTS_PREFETCH = 64


class DispatcherService:
    """Wires the bus and a reconcile timer to a :class:`Dispatcher`."""

    def __init__(
        self,
        bus: Bus,
        dispatcher: Dispatcher,
        reconcile_s: float,
        db_ready: Callable[[], Awaitable[bool]],
        grace_s: float,
    ) -> None:
        self._bus = bus
        self._dispatcher = dispatcher
        self._reconcile_s = reconcile_s
        self._db_ready = db_ready
        self._grace_s = grace_s
        self._consuming = False
        self._inflight = InFlight()

    async def ready(self) -> bool:
        """Connected, consuming, and the database answering."""
        return self._consuming and self._bus.ready() and await self._db_ready()

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatch until ``stop``, then let handlers finish and hand our leases back."""
        await self._bus.consume_events(
            [EVENT_PROGRESS, EVENT_CANCELED], self._on_event, EVENTS_PREFETCH
        )
        await self._bus.consume(self._bus.names.dispatch, self._on_wakeup, DISPATCH_PREFETCH)
        self._consuming = True
        try:
            await self._reconcile_loop(stop)
        finally:
            self._consuming = False
            await self._bus.stop_consuming()
            if not await self._inflight.wait_idle(self._grace_s):
                log.warning("handlers_still_running", extra={"handlers": self._inflight.count})
            try:
                await self._dispatcher.release_all()
            except Exception as exc:
                # The leases simply expire and another dispatcher takes the jobs over.
                log.warning("release_failed", extra={"error": repr(exc)})

    async def _reconcile_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._dispatcher.claim()
                await self._dispatcher.renew()
                await self._dispatcher.recover_stalled()
            except Exception as exc:
                log.warning("reconcile_failed", extra={"error": repr(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._reconcile_s)

    async def _on_wakeup(self, message: AbstractIncomingMessage) -> None:
        async def handle(body: bytes) -> None:
            DispatchWakeup.decode(body)
            if self._consuming:
                await self._dispatcher.claim()

        async with self._inflight:
            await settle(message, "dispatch", handle)

    async def _on_event(self, message: AbstractIncomingMessage) -> None:
        async def handle(body: bytes) -> None:
            event = JobEvent.decode(body)
            if message.routing_key == EVENT_CANCELED:
                self._dispatcher.forget(event.batch_id)
            else:
                await self._dispatcher.on_progress(event)

        async with self._inflight:
            await settle(message, "event", handle)
