"""The grant issuer: runs in every row-worker, issues only while elected leader.

Election: the leader is the connection holding the exclusive queue
``<ns>.ratelimit.leader`` (:meth:`Bus.claim_exclusive`). Only one connection can hold it;
the broker deletes it when that connection closes (``kill -9`` included), and another
candidate's next try (:meth:`Keeper.elect`, every :data:`ELECT_EVERY_S`) wins. When this
worker's bus connection drops, it steps down at once (:meth:`Keeper.step_down`, a close
callback), and issues nothing until it wins again, so two leaders never issue at once.
A stopping worker resigns (deletes the queue) so another takes over without waiting
for its connection to close.

Each tick (:meth:`Keeper.tick`, every :data:`TICK_S`, in the middle of each tenth of a
wall-clock second) the leader asks each limited deployment's :class:`Pacer` for a grant
and publishes it, confirmed and non-persistent, to ``<ns>.ratelimit.grants.<name>``;
tokens go out in whole typical calls (``tokens_per_call``: the leader's own moving
average of its calls' estimates, see :meth:`SharedLimiter.typical_tokens`).
AIMD is shared: every worker applies every ``ratelimit.throttled`` event to its own
pacers (:meth:`Keeper.on_throttled`), so a new leader starts warm. With routes files
that differ (a rolling update), the leader's limits are the ones issued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from relay_batches.bus.topology import Names
from relay_batches.messages import GrantMessage, ThrottledEvent
from relay_batches.metrics import (
    RATELIMIT_GRANTED_REQUESTS,
    RATELIMIT_GRANTED_TOKENS,
    RATELIMIT_LEADER,
    RATELIMIT_RATE_FRACTION,
)
from relay_batches.ratelimit.limits import RateLimit
from relay_batches.ratelimit.pacing import TICK_S, Grant, Pacer

log = logging.getLogger("relay.ratelimit")

ELECT_EVERY_S = 1.0
REDECLARE_EVERY_S = 60.0  # a redeclare is a use: the grants queue never expires in use


class KeeperBus(Protocol):
    """What the keeper needs of :class:`relay_batches.bus.client.Bus`."""

    names: Names

    async def claim_exclusive(self, queue: str) -> bool:
        """Hold ``queue`` exclusively: True while held."""

    async def release_exclusive(self) -> None:
        """Let go of the exclusive queue."""

    async def declare(self, queue: str) -> None:
        """Declare one of the namespace's queues."""

    async def publish(self, queue: str, body: bytes, *, kind: str, persistent: bool = True) -> None:
        """Publish with a confirm."""


def next_tick_delay(now: float, tick_s: float = TICK_S) -> float:
    """Seconds from ``now`` to the next middle of a tick of the wall clock (ticks land
    there, so a grant and the call it pays for fall in the calendar second it was
    issued, whatever a few milliseconds of delay)."""
    target = (math.floor(now / tick_s) + 0.5) * tick_s
    if target <= now + tick_s * 0.25:
        target += tick_s
    return target - now


class Keeper:
    """The limited deployments' pacers, and the leader's issuing of their grants."""

    def __init__(
        self,
        bus: KeeperBus,
        limits: Mapping[str, RateLimit],
        clock: Callable[[], float] = time.time,
        tokens_per_call: Callable[[str], int] = lambda _: 1,
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._tokens_per_call = tokens_per_call
        self.pacers = {name: Pacer(limit) for name, limit in limits.items()}
        self.leader = False
        self._declared_at = -math.inf
        self._resigning: asyncio.Task[None] | None = None
        self._stopped = False
        for name in self.pacers:
            RATELIMIT_RATE_FRACTION.labels(name).set(1.0)

    async def elect(self) -> None:
        """Try to become the leader (a periodic pass); nothing once leader or stopped."""
        if self.leader or self._stopped:
            return
        if await self._bus.claim_exclusive(self._bus.names.ratelimit_leader):
            if self.stopped():  # resigned while the claim was on its way
                await self._bus.release_exclusive()
                return
            self.leader = True
            self._declared_at = -math.inf
            now = self._clock()
            for pacer in self.pacers.values():
                pacer.skip_second(now)
            RATELIMIT_LEADER.set(1)
            log.info("ratelimit_leader", extra={"deployments": sorted(self.pacers)})

    def stopped(self) -> bool:
        """Whether the worker resigned (it stands no more)."""
        return self._stopped

    def step_down(self) -> None:
        """The bus connection dropped: the broker let go of the queue; stop issuing."""
        if self.leader:
            self.leader = False
            RATELIMIT_LEADER.set(0)
            log.warning("ratelimit_leader_lost")

    def resign(self) -> None:
        """The worker is stopping: stop issuing and let another take over now."""
        self._stopped = True
        was_leader, self.leader = self.leader, False
        RATELIMIT_LEADER.set(0)
        if was_leader:
            self._resigning = asyncio.ensure_future(self._bus.release_exclusive())

    async def close(self) -> None:
        """Wait for a resignation in progress."""
        if self._resigning is not None:
            with contextlib.suppress(Exception):
                await self._resigning

    async def tick(self) -> float:
        """Issue and publish each deployment's grant if leader; the seconds to the next
        tick (the middle of the next tenth of a second)."""
        if self.leader:
            await self._issue_all()
        return next_tick_delay(self._clock())

    async def _issue_all(self) -> None:
        now = self._clock()
        if now - self._declared_at >= REDECLARE_EVERY_S:
            for name in self.pacers:
                await self._bus.declare(self._bus.names.ratelimit_grants(name))
            self._declared_at = now
        grants = [
            (name, pacer.issue(now, self._tokens_per_call(name)))
            for name, pacer in self.pacers.items()
        ]
        issued = [(name, grant) for name, grant in grants if grant is not None]
        results = await asyncio.gather(
            *(self._publish(name, grant, now) for name, grant in issued), return_exceptions=True
        )
        for (name, _), result in zip(issued, results, strict=True):
            if isinstance(result, BaseException):
                self._declared_at = -math.inf  # maybe the queue is gone: declare again
                log.warning(
                    "grant_publish_failed", extra={"deployment": name, "error": repr(result)}
                )
        for name, pacer in self.pacers.items():
            RATELIMIT_RATE_FRACTION.labels(name).set(pacer.fraction)

    async def _publish(self, name: str, grant: Grant, now: float) -> None:
        message = GrantMessage(name, grant.requests, grant.tokens, grant.expires_at, now)
        await self._bus.publish(
            self._bus.names.ratelimit_grants(name), message.encode(), kind="grant", persistent=False
        )
        RATELIMIT_GRANTED_REQUESTS.labels(name).inc(grant.requests)
        RATELIMIT_GRANTED_TOKENS.labels(name).inc(grant.tokens)

    async def on_throttled(self, event: ThrottledEvent) -> None:
        """Some worker's call to a deployment was throttled: lower its rate here too."""
        pacer = self.pacers.get(event.deployment)
        if pacer is None:
            return
        pacer.throttled(self._clock(), event.retry_after)
        RATELIMIT_RATE_FRACTION.labels(event.deployment).set(pacer.fraction)
        log.info(
            "ratelimit_throttled",
            extra={
                "deployment": event.deployment,
                "retry_after": event.retry_after,
                "fraction": round(pacer.fraction, 3),
            },
        )
