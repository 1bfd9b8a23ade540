"""The named tasks a service runs: its loops (for its lifetime) and its work (one per
delivery), so a stop can wait for them, cancel the late ones and see a crashed loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("relay.service")


class Tasks:
    """Holds a strong reference to every task it spawned until the task is done."""

    def __init__(self) -> None:
        self._loops: set[asyncio.Task[None]] = set()
        self._work: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str, *, loop: bool = False) -> None:
        """Run ``coro`` as a task named ``name``; a loop is kept (crashed or not) for
        :meth:`crashed`, work is forgotten once done."""
        task = asyncio.create_task(coro, name=name)
        if loop:
            self._loops.add(task)
            return
        self._work.add(task)
        task.add_done_callback(self._work_done)

    def _work_done(self, task: asyncio.Task[None]) -> None:
        self._work.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task_failed", extra={"task": task.get_name()}, exc_info=task.exception())

    @property
    def loops(self) -> set[asyncio.Task[None]]:
        """Every loop task spawned."""
        return set(self._loops)

    def running(self) -> set[asyncio.Task[None]]:
        """Loops and work not finished yet."""
        return {t for t in self._loops | self._work if not t.done()}

    def crashed(self) -> BaseException | None:
        """The exception of the first loop that ended with one, if any."""
        for task in self._loops:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None

    async def wait(self, timeout: float) -> set[asyncio.Task[None]]:
        """Wait until nothing runs, at most ``timeout`` seconds (work spawned meanwhile
        is waited for too); return the tasks still running."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while pending := self.running():
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await asyncio.wait(pending, timeout=remaining)
        return self.running()
