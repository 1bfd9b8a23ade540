"""The notifier loop: consume ``notify`` (bound to ``job.finished``) and deliver; every
reconcile interval, take over the claims of notifiers that died mid-delivery."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aio_pika.abc import AbstractIncomingMessage

from relay_batches.bus.client import Bus, settle
from relay_batches.inflight import InFlight
from relay_batches.messages import JobEvent
from relay_batches.services.notifier.core import (
    Post,
    RecoveryStore,
    deliver_webhook,
    recover_deliveries,
)

log = logging.getLogger("relay.notifier")

NOTIFY_PREFETCH = 16


class NotifierService:
    """Wires the ``notify`` queue to :func:`deliver_webhook`, and takes over dead claims."""

    def __init__(
        self,
        bus: Bus,
        store: RecoveryStore,
        post: Post,
        db_ready: Callable[[], Awaitable[bool]],
        recover_every_s: float,
        grace_s: float,
    ) -> None:
        self._bus = bus
        self._store = store
        self._post = post
        self._db_ready = db_ready
        self._recover_every_s = recover_every_s
        self._grace_s = grace_s
        self._consuming = False
        self._inflight = InFlight()

    async def ready(self) -> bool:
        """Connected, consuming, database answering."""
        return self._consuming and self._bus.ready() and await self._db_ready()

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop``; then let the deliveries in progress finish."""
        await self._bus.consume(self._bus.names.notify, self._on_finished, NOTIFY_PREFETCH)
        self._consuming = True
        try:
            await self._recover_loop(stop)
        finally:
            self._consuming = False
            await self._bus.stop_consuming()
            if not await self._inflight.wait_idle(self._grace_s):
                log.warning("deliveries_still_running", extra={"handlers": self._inflight.count})

    async def _recover_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                async with self._inflight:
                    recovered = await recover_deliveries(self._store, self._post)
                if recovered:
                    log.info("deliveries_recovered", extra={"deliveries": recovered})
            except Exception as exc:
                log.warning("recovery_failed", extra={"error": repr(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._recover_every_s)

    async def _on_finished(self, message: AbstractIncomingMessage) -> None:
        async def handle(body: bytes) -> None:
            await deliver_webhook(JobEvent.decode(body), self._store, self._post)

        async with self._inflight:
            await settle(message, "finished", handle)
