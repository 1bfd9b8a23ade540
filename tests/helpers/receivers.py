"""A webhook receiver for fault tests: records each POST's ``webhook-id`` and arrival,
counts POSTs open at once, runs hooks on arrival, can hang until released, and can
answer given statuses before its 204s."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from tests.helpers.support import free_port


@dataclass
class Receiver:
    """A webhook receiver that records each POST's ``webhook-id`` (and its headers,
    lower-cased, and body); ``on_post`` runs on every POST before it is answered, a
    ``hang``ing receiver answers only once ``release`` is set, and the first POSTs are
    answered with the statuses in ``answers`` (taken in order), the rest 204."""

    hang: bool = False
    ids: list[str] = field(default_factory=list)
    received_at: list[float] = field(default_factory=list)
    open_now: int = 0
    open_most: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    on_post: list[asyncio.Event] = field(default_factory=list)
    port: int = 0
    answers: list[int] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Where the webhooks go."""
        return f"http://127.0.0.1:{self.port}/hook"

    async def handle(self, request: web.Request) -> web.Response:
        """Record, signal, (hang,) answer 204."""
        self.bodies.append(await request.read())
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        self.ids.append(request.headers["webhook-id"])
        self.received_at.append(time.monotonic())
        for event in self.on_post:
            event.set()
        self.open_now += 1
        self.open_most = max(self.open_most, self.open_now)
        try:
            if self.hang:
                await self.release.wait()
        finally:
            self.open_now -= 1
        return web.Response(status=self.answers.pop(0) if self.answers else 204)


@contextlib.asynccontextmanager
async def serving(receiver: Receiver) -> AsyncIterator[Receiver]:
    """Run ``receiver`` on a free loopback port for the block."""
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
    await runner.setup()
    receiver.port = free_port()
    await web.TCPSite(runner, "127.0.0.1", receiver.port).start()
    try:
        yield receiver
    finally:
        receiver.release.set()
        await runner.cleanup()
