"""Counting in-flight message handlers, so a stopping service can wait for them.

aio-pika runs each delivery's callback as its own task; a service wraps its callback
body in ``async with inflight:`` and, on SIGTERM, stops consuming and then awaits
:meth:`InFlight.wait_idle` (bounded by its grace period) before closing connections.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class InFlight:
    """A counter of handlers running now, with a wait for zero."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def count(self) -> int:
        """Handlers running now."""
        return self._count

    async def __aenter__(self) -> None:
        self._count += 1
        self._idle.clear()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._count -= 1
        if self._count == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no handler runs, at most ``timeout`` seconds; True if idle."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
