"""A bus-driven service from its declaration: readiness, the run, and the one drain.

Readiness is consuming ∧ bus connected ∧ (for a service with a ledger) ledger reachable
with its schema at the version the code expects.

The drain on stop, the same for every service: stop intake (``stopping`` hook, cancel
the consumers), wait for in-flight work and periodic passes up to the grace period,
cancel what is still running (its deliveries are redelivered, unacked), then ``close``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from relay_batches.bus.topology import Names
from relay_batches.kit.consumer import ConsumingBus, Intake
from relay_batches.kit.periodic import Periodic
from relay_batches.kit.tasks import Tasks

log = logging.getLogger("relay.service")

ReadyCheck = Callable[[], Awaitable[bool]]
# Of the runtime's margin past the grace period, how long cancelled work may take to
# unwind; the close (handing leases back, flushing outcomes) has the rest.
CANCEL_WAIT_S = 2.0


class ServiceBus(ConsumingBus, Protocol):
    """What a service needs of :class:`relay_batches.bus.client.Bus`."""

    names: Names

    def ready(self) -> bool:
        """True while connected with every consumer restored."""

    async def stop_consuming(self) -> None:
        """Cancel every consumer."""


class ConnectedBus(Protocol):
    """A bus that can say whether it is connected."""

    def ready(self) -> bool:
        """True while connected with every consumer restored."""


class Readiness:
    """``/readyz``: intake open ∧ bus connected ∧ ledger reachable and current."""

    def __init__(self, bus: ConnectedBus, ledger: ReadyCheck | None) -> None:
        self._bus = bus
        self._ledger = ledger
        self.consuming = False

    async def __call__(self) -> bool:
        if not (self.consuming and self._bus.ready()):
            return False
        return self._ledger is None or await self._ledger()


class BusService:
    """Runs declared intakes and periodic tasks; ``run``/``ready`` as the runtime wants."""

    def __init__(
        self,
        bus: ServiceBus,
        intakes: Sequence[Intake],
        *,
        grace_s: float,
        periodic: Sequence[Periodic] = (),
        ledger: ReadyCheck | None = None,
        stopping: Callable[[], None] | None = None,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._bus = bus
        self._intakes = intakes
        self._periodic = periodic
        self._grace_s = grace_s
        self._stopping = stopping
        self._close = close
        self._readiness = Readiness(bus, ledger)

    async def ready(self) -> bool:
        """Consuming, connected, and the ledger (if any) reachable at its schema."""
        return await self._readiness()

    async def run(self, stop: asyncio.Event) -> None:
        """Start every intake and periodic task; on ``stop`` (or a crashed loop) drain.

        A loop that crashed stops the service: its exception is raised after the drain.
        """
        tasks = Tasks()
        halt = asyncio.Event()
        try:
            for intake in self._intakes:
                await intake.start(self._bus, tasks, halt)
            for task in self._periodic:
                tasks.spawn(task.loop(halt), name=task.name, loop=True)
            self._readiness.consuming = True
            log.info("consuming", extra={"intakes": len(self._intakes)})
            await _until_stop_or_crash(stop, tasks)
        finally:
            halt.set()
            await self._drain(tasks)
        crashed = tasks.crashed()
        if crashed is not None:
            raise crashed

    async def _drain(self, tasks: Tasks) -> None:
        """Stop intake, let in-flight work finish within the grace period (counted from
        the stop, so a slow broker cancel eats into it rather than past the runtime's
        hard deadline), cancel the rest, then close."""
        grace_ends = asyncio.get_running_loop().time() + self._grace_s
        self._readiness.consuming = False
        if self._stopping is not None:
            self._stopping()
        await self._bus.stop_consuming()
        log.info("draining", extra={"tasks": len(tasks.running())})
        late = await tasks.wait(max(0.0, grace_ends - asyncio.get_running_loop().time()))
        if late:
            for task in late:
                task.cancel()
            await asyncio.wait(late, timeout=CANCEL_WAIT_S)
            log.warning("tasks_handed_back", extra={"tasks": len(late)})
        if self._close is not None:
            await self._close()


async def _until_stop_or_crash(stop: asyncio.Event, tasks: Tasks) -> None:
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({stopped, *tasks.loops}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
