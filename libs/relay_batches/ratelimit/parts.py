"""What a row-worker runs for shared rate limits, declared on the service kit: the
election and tick periodic tasks, the idle-consumer pass, and the ``ratelimit.throttled``
subscription. Empty when the routes limit no deployment (nothing runs, no bus traffic)."""

from __future__ import annotations

from dataclasses import dataclass

from relay_batches.bus.topology import EVENT_THROTTLED
from relay_batches.kit.consumer import Intake, Subscribe
from relay_batches.kit.periodic import Periodic, every
from relay_batches.messages import ThrottledEvent
from relay_batches.ratelimit.keeper import ELECT_EVERY_S, Keeper
from relay_batches.ratelimit.limiter import IDLE_S, SharedLimiter
from relay_batches.ratelimit.pacing import TICK_S


@dataclass(frozen=True)
class RateLimitParts:
    """The periodic tasks and intakes of shared rate limits."""

    periodic: tuple[Periodic, ...] = ()
    intakes: tuple[Intake, ...] = ()


def rate_limit_parts(keeper: Keeper | None, limiter: SharedLimiter | None) -> RateLimitParts:
    """The declarations for ``keeper`` and ``limiter`` (None: no limited deployment)."""
    if keeper is None or limiter is None:
        return RateLimitParts()
    periodic = (
        every("ratelimit-elect", ELECT_EVERY_S, keeper.elect),
        # The tick returns its own delay: the middle of the next tenth of a second.
        Periodic("ratelimit-tick", TICK_S, keeper.tick),
        every("ratelimit-idle", IDLE_S / 2, limiter.release_idle),
    )
    throttled = Subscribe(
        {EVENT_THROTTLED: keeper.on_throttled}, ThrottledEvent.decode, kind="throttled"
    )
    return RateLimitParts(periodic, (throttled,))
