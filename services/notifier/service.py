"""The notifier loop: consume ``notify`` (bound to ``job.finished``) and deliver."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
from aio_pika.abc import AbstractIncomingMessage

from notifier.handlers import Post, PostResult, Store, deliver_webhook
from relay.bus.client import Bus, settle
from relay.messages import JobEvent

NOTIFY_PREFETCH = 16


def http_poster(session: aiohttp.ClientSession, timeout_s: float) -> Post:
    """A :data:`Post` that sends JSON with a total timeout and follows no redirect."""

    async def post(url: str, body: bytes) -> PostResult:
        try:
            async with session.post(
                url,
                data=body,
                headers={"Content-Type": "application/json", "User-Agent": "relay-batches"},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                allow_redirects=False,
            ) as response:
                await response.read()
                return PostResult(response.status)
        except TimeoutError:
            return PostResult(None, f"timed out after {timeout_s:g}s")
        except (aiohttp.ClientError, ValueError) as exc:
            return PostResult(None, f"{exc.__class__.__name__}: {exc}")

    return post


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
