"""A named periodic task: run a coroutine every N seconds until halted; an exception is
logged with the task's name and the next pass comes as usual. So is a ``CancelledError``
that nobody aimed at the task (:func:`ordinary_error`: aiormq fails the calls pending on a
stuck connection with one), which would otherwise end the loop for good."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger("relay.periodic")


@dataclass(frozen=True)
class Periodic:
    """``run`` every ``every_s`` seconds.

    ``run`` may return the seconds until its next pass instead (``None``: ``every_s``);
    after a failed pass the next one comes after ``after_error_s`` (default ``every_s``).
    Setting :attr:`wake` cuts the wait short; it is cleared before each pass, so a
    wake-up that arrives during a pass makes the next one start at once.
    """

    name: str
    every_s: float
    run: Callable[[], Awaitable[float | None]]
    after_error_s: float | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    async def loop(self, halt: asyncio.Event) -> None:
        """Pass, wait, pass … until ``halt``; a pass in progress finishes first."""
        while not halt.is_set():
            self.wake.clear()
            delay = await self.run_once()
            await self._wait(delay, halt)

    async def run_once(self) -> float:
        """One pass; return the seconds to wait before the next."""
        try:
            delay = await self.run()
        except (Exception, asyncio.CancelledError) as exc:
            if not ordinary_error(exc):
                raise
            log.warning("periodic_failed", extra={"task": self.name, "error": repr(exc)})
            return self.every_s if self.after_error_s is None else self.after_error_s
        return self.every_s if delay is None else delay

    async def _wait(self, delay: float, halt: asyncio.Event) -> None:
        waiters = {asyncio.ensure_future(halt.wait()), asyncio.ensure_future(self.wake.wait())}
        try:
            await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*waiters, return_exceptions=True)


def ordinary_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an ordinary error: any exception, or a ``CancelledError`` while
    nobody cancels the running task (a library's own, not a stop or timeout of ours)."""
    if not isinstance(exc, asyncio.CancelledError):
        return isinstance(exc, Exception)
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


def every(name: str, seconds: float, run: Callable[[], Awaitable[object]]) -> Periodic:
    """A periodic task whose passes all come ``seconds`` apart, whatever ``run`` returns."""

    async def pass_() -> None:
        await run()

    return Periodic(name, seconds, pass_)
