"""The scheduler loop: spawn what is due, then sleep until the next tick (or a wake-up).

The sleep lasts until the earliest ``next_run_at`` in the ledger, capped (a template
created by an older ingest-api, or a wake-up lost while disconnected, is at most one
cap late), and ends early when a ``template.created`` event arrives. A failed pass
(database away) is retried after a short pause; the loop itself never dies of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from aio_pika.abc import AbstractIncomingMessage

from relay_batches.bus.client import Bus, settle
from relay_batches.bus.topology import EVENT_TEMPLATE_CREATED
from relay_batches.messages import TemplateCreated
from relay_batches.services.scheduler.core import Scheduler

log = logging.getLogger("relay.scheduler")

RETRY_PAUSE_S = 1.0
MIN_SLEEP_S = 0.1
EVENTS_PREFETCH = 16

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The wall clock, in UTC."""
    return datetime.now(UTC)


def sleep_seconds(wake_at: datetime | None, now: datetime, cap: float) -> float:
    """How long to sleep before the next pass: until ``wake_at``, at most ``cap``."""
    if wake_at is None:
        return cap
    return max(0.0, min(cap, (wake_at - now).total_seconds()))


class SchedulerService:
    """Wires the clock, the ledger and ``template.created`` wake-ups to a :class:`Scheduler`."""

    def __init__(
        self,
        bus: Bus,
        scheduler: Scheduler,
        db_ready: Callable[[], Awaitable[bool]],
        max_sleep_s: float,
        clock: Clock = utc_now,
    ) -> None:
        self._bus = bus
        self._scheduler = scheduler
        self._db_ready = db_ready
        self._max_sleep_s = max_sleep_s
        self._clock = clock
        self._wake = asyncio.Event()
        self._consuming = False

    async def ready(self) -> bool:
        """Connected to the broker (consuming wake-ups) and to the database."""
        return self._consuming and self._bus.ready() and await self._db_ready()

    async def run(self, stop: asyncio.Event) -> None:
        """Spawn runs until ``stop``; a pass in progress finishes first."""
        await self._bus.consume_events([EVENT_TEMPLATE_CREATED], self._on_created, EVENTS_PREFETCH)
        self._consuming = True
        try:
            while not stop.is_set():
                # Cleared before the pass: a wake-up arriving during it cuts the sleep.
                self._wake.clear()
                delay = await self._pass()
                await self._sleep(delay, stop)
        finally:
            self._consuming = False
            await self._bus.stop_consuming()

    async def _pass(self) -> float:
        now = self._clock()
        try:
            result = await self._scheduler.tick(now)
        except Exception as exc:
            log.warning("pass_failed", extra={"error": repr(exc)})
            return RETRY_PAUSE_S
        delay = sleep_seconds(result.wake_at, self._clock(), self._max_sleep_s)
        # A template due but locked by another scheduler must not make this loop spin.
        return max(MIN_SLEEP_S, delay)

    async def _sleep(self, delay: float, stop: asyncio.Event) -> None:
        waiters = {
            asyncio.ensure_future(stop.wait()),
            asyncio.ensure_future(self._wake.wait()),
        }
        try:
            await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*waiters, return_exceptions=True)

    async def _on_created(self, message: AbstractIncomingMessage) -> None:
        async def handle(body: bytes) -> None:
            created = TemplateCreated.decode(body)
            log.info("template_created", extra={"template_id": created.template_id})
            self._wake.set()

        await settle(message, "template", handle)
