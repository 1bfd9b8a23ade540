"""The grant issuer: runs in every row-worker, issues only while elected leader.

Election: the leader is the connection holding the exclusive queue
``<ns>.ratelimit.leader`` (:meth:`Bus.claim_exclusive`). Only one connection can hold it;
the broker deletes it when that connection closes (``kill -9`` included), and another
candidate's next try (:meth:`Keeper.elect`, every :data:`ELECT_EVERY_S`) wins. When this
worker's bus connection drops, it steps down at once (:meth:`Keeper.step_down`, a close
callback), and issues nothing until it wins again, so two leaders never issue at once.
A stopping worker keeps issuing through its drain (its own rows waiting for budget may
have no other leader to wait for) and resigns (deletes the queue) in its close, so
another takes over without waiting for its connection to close.

Each tick (:meth:`Keeper.tick`, every :data:`TICK_S`, in the middle of each tenth of a
wall-clock second) the leader asks each limited deployment's :class:`Pacer` for the
slots due before the next tick's, a little ahead of their time, and publishes each as a
message, confirmed and non-persistent, to ``<ns>.ratelimit.grants.<name>``: one call
each, stamped with its slot (``start_at``), at which the worker that takes it starts the
call; a worker takes a message per call it has waiting, so the slots are shared by as
many workers as need them. Tokens go out in whole typical calls
(``tokens_per_call``: a moving average of this worker's calls' estimates and of the
units of the grants it saw, see :meth:`SharedLimiter.typical_tokens`, so a new leader
inherits the fleet's). Each deployment's queue is declared, and its failures handled,
on its own: one bad deployment stops no other's grants.
AIMD is shared: every worker applies every ``ratelimit.throttled`` event to its own
pacers (:meth:`Keeper.on_throttled`), so a new leader starts warm; a worker tells the
others only of a throttle that changed its own pacer (:meth:`Keeper.throttle`), about
one event a second for the fleet. With routes files that differ (a rolling update), the
leader's limits are the ones issued.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from relay_batches.bus.topology import Names
from relay_batches.ids import new_id
from relay_batches.kit.periodic import ordinary_error
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
REDECLARE_FAILED_S = 1.0  # a failed declare is tried again this much later


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

    async def queue_states(self, queues: Iterable[str]) -> list[tuple[int, int]]:
        """``(ready messages, consumers)`` of each queue (passive declares)."""


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
        tokens_per_call: Callable[[str], int] = lambda _: 0,
        ident: str = "",
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._tokens_per_call = tokens_per_call  # 0: no typical call known yet
        self.ident = ident or f"keeper-{new_id()[:12]}"
        self.pacers = {name: Pacer(limit) for name, limit in limits.items()}
        self.leader = False
        self._declared_at = dict.fromkeys(self.pacers, -math.inf)
        self._declare_again_at = dict.fromkeys(self.pacers, -math.inf)  # after a failure
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
            self._declared_at = dict.fromkeys(self.pacers, -math.inf)
            now = self._clock()
            for pacer in self.pacers.values():
                pacer.restart(now)
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

    async def close(self) -> None:
        """The worker has drained: stop issuing, and let another take over now."""
        self._stopped = True
        was_leader, self.leader = self.leader, False
        RATELIMIT_LEADER.set(0)
        if was_leader:
            try:
                await self._bus.release_exclusive()
            except (Exception, asyncio.CancelledError) as exc:
                if not ordinary_error(exc):
                    raise
                log.warning("ratelimit_resign_failed", extra={"error": repr(exc)})

    async def tick(self) -> float:
        """Issue and publish each deployment's grant if leader; the seconds to the next
        tick (the middle of the next tenth of a second)."""
        if self.leader:
            await self._issue_all()
        return next_tick_delay(self._clock())

    async def _issue_all(self) -> None:
        now = self._clock()
        messages: list[tuple[str, Grant]] = []
        for name, pacer in self.pacers.items():
            if not await self._declared(name, now):
                continue  # tried again later; the other deployments' grants go out
            grants = pacer.issue(now, self._tokens_per_call(name))
            messages.extend((name, grant) for grant in grants)
        messages = await self._consumed(messages)
        # Every message at once, each confirmed: a tick waits one round trip, not one
        # per message (its slots are LEAD_S ahead, so a slow confirm delays no call).
        results = await asyncio.gather(
            *(self._publish(name, part, now) for name, part in messages), return_exceptions=True
        )
        errors: dict[str, BaseException] = {}
        for (name, _), result in zip(messages, results, strict=True):
            if isinstance(result, BaseException):
                errors.setdefault(name, result)
        for name, error in errors.items():
            self._declared_at[name] = -math.inf  # maybe the queue is gone: declare again
            log.warning("grant_publish_failed", extra={"deployment": name, "error": repr(error)})
        for name, pacer in self.pacers.items():
            RATELIMIT_RATE_FRACTION.labels(name).set(pacer.fraction)

    async def _consumed(self, messages: list[tuple[str, Grant]]) -> list[tuple[str, Grant]]:
        """The messages whose grants queue has a consumer now: nobody waits for budget
        on the others (a worker consumes only while its calls wait), whose grants would
        only expire in the queue. Their credit is spent all the same (issued, not
        published), so a worker subscribing next gets the even rate, not a saved-up
        burst. When the check fails, everything is published."""
        names = sorted({name for name, _ in messages})
        if not names:
            return messages
        queues = [self._bus.names.ratelimit_grants(name) for name in names]
        try:
            states = await self._bus.queue_states(queues)
        except (Exception, asyncio.CancelledError) as exc:
            if not ordinary_error(exc):
                raise
            log.warning("grants_queue_check_failed", extra={"error": repr(exc)})
            return messages
        idle = {name for name, (_, consumers) in zip(names, states, strict=True) if consumers == 0}
        return [(name, part) for name, part in messages if name not in idle]

    async def _declared(self, name: str, now: float) -> bool:
        """Declare ``name``'s grants queue when due (a redeclare keeps it from expiring);
        False when that failed (logged, tried again after :data:`REDECLARE_FAILED_S`)."""
        if now - self._declared_at[name] < REDECLARE_EVERY_S:
            return True
        if now < self._declare_again_at[name]:
            return False
        try:
            await self._bus.declare(self._bus.names.ratelimit_grants(name))
        except (Exception, asyncio.CancelledError) as exc:
            if not ordinary_error(exc):
                raise
            self._declare_again_at[name] = now + REDECLARE_FAILED_S
            log.warning("grants_declare_failed", extra={"deployment": name, "error": repr(exc)})
            return False
        self._declared_at[name] = now
        return True

    async def _publish(self, name: str, grant: Grant, now: float) -> None:
        message = GrantMessage(
            name,
            grant.requests,
            grant.tokens,
            grant.expires_at,
            now,
            call_tokens=self._tokens_per_call(name),
            leader=self.ident,
            start_at=grant.at,
        )
        await self._bus.publish(
            self._bus.names.ratelimit_grants(name), message.encode(), kind="grant", persistent=False
        )
        RATELIMIT_GRANTED_REQUESTS.labels(name).inc(grant.requests)
        RATELIMIT_GRANTED_TOKENS.labels(name).inc(grant.tokens)

    async def on_throttled(self, event: ThrottledEvent) -> None:
        """Some worker's call to a deployment was throttled: lower its rate here too."""
        self.throttle(event.deployment, event.retry_after)

    def throttle(self, deployment: str, retry_after: float | None) -> bool:
        """Apply a throttle to ``deployment``'s pacer; whether it changed the pacer
        (:meth:`Pacer.throttled`): only such a throttle is worth telling the other
        workers."""
        pacer = self.pacers.get(deployment)
        if pacer is None:
            return False
        changed = pacer.throttled(self._clock(), retry_after)
        RATELIMIT_RATE_FRACTION.labels(deployment).set(pacer.fraction)
        if changed:
            log.debug(
                "ratelimit_throttled",
                extra={
                    "deployment": deployment,
                    "retry_after": retry_after,
                    "fraction": round(pacer.fraction, 3),
                },
            )
        return changed
