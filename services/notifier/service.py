"""The notifier loop: consume ``notify`` (bound to ``job.finished``) and deliver."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aio_pika.abc import AbstractIncomingMessage

from notifier.handlers import Post, Store, deliver_webhook
from relay.bus.client import Bus, settle
from relay.messages import JobEvent

NOTIFY_PREFETCH = 16


class NotifierService:
    """Wires the ``notify`` queue to :func:`deliver_webhook`."""

    def __init__(
        self, bus: Bus, store: Store, post: Post, db_ready: Callable[[], Awaitable[bool]]
    ) -> None:
        self._bus = bus
        self._store = store
        self._post = post
        self._db_ready = db_ready
        self._consuming = False

    async def ready(self) -> bool:
        """Connected, consuming, database answering."""
        return self._consuming and self._bus.ready() and await self._db_ready()

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop``."""
        await self._bus.consume(self._bus.names.notify, self._on_finished, NOTIFY_PREFETCH)
        self._consuming = True
        await stop.wait()
        self._consuming = False
        await self._bus.stop_consuming()

    async def _on_finished(self, message: AbstractIncomingMessage) -> None:
        async def handle(body: bytes) -> None:
            await deliver_webhook(JobEvent.decode(body), self._store, self._post)

        await settle(message, "finished", handle)
