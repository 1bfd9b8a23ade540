"""The scheduler loop. Cron spawning is the subject of its own issue; for now the
service starts, keeps its connections and answers its health endpoints."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from relay.bus.client import Bus


class SchedulerService:
    """Holds the scheduler's connections until stopped."""

    def __init__(self, bus: Bus, db_ready: Callable[[], Awaitable[bool]]) -> None:
        self._bus = bus
        self._db_ready = db_ready

    async def ready(self) -> bool:
        """Connected to the broker and the database."""
        return self._bus.ready() and await self._db_ready()

    async def run(self, stop: asyncio.Event) -> None:
        """Wait for ``stop``."""
        await stop.wait()
