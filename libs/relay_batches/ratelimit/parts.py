"""What a row-worker runs for shared rate limits, declared on the service kit: the
election and idle-consumer periodic tasks, the tick (a periodic task that goes on
through the drain, :class:`DrainingTicks`), and the ``ratelimit.throttled``
subscription. Empty when the routes limit no deployment (nothing runs, no bus traffic)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from relay_batches.bus.topology import EVENT_THROTTLED
from relay_batches.kit.consumer import ConsumingBus, Intake, Subscribe
from relay_batches.kit.periodic import Periodic, every
from relay_batches.kit.tasks import Tasks
from relay_batches.messages import ThrottledEvent
from relay_batches.ratelimit.keeper import ELECT_EVERY_S, Keeper
from relay_batches.ratelimit.limiter import IDLE_S, SharedLimiter
from relay_batches.ratelimit.pacing import TICK_S


@dataclass(frozen=True)
class RateLimitParts:
    """The periodic tasks and intakes of shared rate limits."""

    periodic: tuple[Periodic, ...] = ()
    intakes: tuple[Intake, ...] = ()


@dataclass(frozen=True)
class DrainingTicks:
    """Runs ``periodic`` as one of the service's loops that, unlike the others, goes on
    after the stop until every other task of the service is done: a stopping leader
    keeps issuing while its rows finish (with one replica, or all stopping, nobody else
    would, and rows waiting for budget would wait out the grace period). The kit's
    drain waits for it as for any loop, and cancels it at the grace period's end."""

    periodic: Periodic

    async def start(self, bus: ConsumingBus, tasks: Tasks, halt: asyncio.Event) -> None:
        """Spawn the loop into ``tasks``."""
        tasks.spawn(self._run(tasks, halt), name=self.periodic.name, loop=True)

    async def _run(self, tasks: Tasks, halt: asyncio.Event) -> None:
        done = asyncio.Event()
        me = asyncio.current_task()  # the task in ``tasks`` (gather runs its own children)
        await asyncio.gather(self.periodic.loop(done), _after_the_rest(tasks, me, halt, done))


async def _after_the_rest(
    tasks: Tasks, me: asyncio.Task[object] | None, halt: asyncio.Event, done: asyncio.Event
) -> None:
    """Set ``done`` once ``halt`` is set and no task of ``tasks`` but ``me`` runs (work
    spawned meanwhile included)."""
    await halt.wait()
    while others := {task for task in tasks.running() if task is not me}:
        await asyncio.wait(others)
    done.set()


def rate_limit_parts(keeper: Keeper | None, limiter: SharedLimiter | None) -> RateLimitParts:
    """The declarations for ``keeper`` and ``limiter`` (None: no limited deployment)."""
    if keeper is None or limiter is None:
        return RateLimitParts()
    periodic = (
        every("ratelimit-elect", ELECT_EVERY_S, keeper.elect),
        every("ratelimit-idle", IDLE_S / 2, limiter.release_idle),
    )
    throttled = Subscribe(
        {EVENT_THROTTLED: keeper.on_throttled}, ThrottledEvent.decode, kind="throttled"
    )
    # The tick returns its own delay: the middle of the next tenth of a second.
    ticks = DrainingTicks(Periodic("ratelimit-tick", TICK_S, keeper.tick))
    return RateLimitParts(periodic, (throttled, ticks))
