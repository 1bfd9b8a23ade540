"""The worker side of shared rate limits: what the model router calls around each call.

:class:`SharedLimiter` keeps, per rate-limited deployment, a :class:`Budget`, the calls
waiting for it (first come, first served) and an on-demand consumer of the deployment's
grants queue: subscribed while calls wait and the budget is short, cancelled once no
call waited for :data:`IDLE_S` (:meth:`SharedLimiter.release_idle`, a periodic pass), so
an idle worker holds no grant a busy one needs; a grant delivered meanwhile is handed
back to the queue once, for another worker. A grant is added to the budget, then
acked: its effect lives in memory only, so a worker that dies loses at most what it
held. A grant that arrives expired is acked and dropped; one that does not decode is
rejected without requeue (the kit's policy for a poison message).

A grant is stamped with its slot (``start_at``): it counts from then on (the budget keeps
it pending, and a timer serves the waiters at that moment), so calls start as evenly
spaced as the leader issued the slots, whenever the grants arrived. A worker whose
pending grants already pay for all its waiting calls hands a new one back to the queue,
for another worker, as long as its slot is more than :data:`PASS_ON_S` ahead.

A waiting call holds no upstream connection (the router acquires before it takes one)
and can be cancelled: it leaves no waiter behind, and budget handed to it just as it was
cancelled goes back; the subscribe it started runs on as the lane's own task, so a
consumer it registers is always the lane's (never an orphan taking grants for nobody).

A throttled call (:meth:`SharedLimiter.throttled`) is applied to this worker's pacer at
once (the ``local`` hook, the keeper's); only one that changed it is published, and
that publish is fired and forgotten: bus trouble never reaches the row's call.

A deployment without a limit costs nothing: no wait, no bus traffic. :class:`NoLimiter`
(the router's default) limits nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aio_pika.abc import AbstractIncomingMessage

from relay_batches.bus.client import MessageCallback
from relay_batches.bus.topology import EVENT_THROTTLED, Names
from relay_batches.kit.consumer import Subscription
from relay_batches.kit.periodic import ordinary_error
from relay_batches.kit.settle import ack, reject
from relay_batches.messages import GrantMessage, MessageError, ThrottledEvent
from relay_batches.metrics import RATELIMIT_USED_REQUESTS, RATELIMIT_USED_TOKENS, RATELIMIT_WAIT
from relay_batches.ratelimit.budget import Budget
from relay_batches.ratelimit.limits import RateLimit
from relay_batches.ratelimit.pacing import Grant

log = logging.getLogger("relay.ratelimit")

GRANTS_PREFETCH = 2
IDLE_S = 1.0  # without waiters this long, a deployment's grants consumer is cancelled
PASS_ON_S = 0.025  # a grant not needed here goes back to the queue while its slot is this far
RESUBSCRIBE_S = 1.0  # a waiter retries a failed subscribe this often
THROTTLE_EVENT_EVERY_S = 0.1  # at most one throttled event per deployment per worker
CLOCK_SAMPLES = 32  # grants whose delivery delay estimates the leader's clock offset
CLOCK_AHEAD_S = 0.5  # a smaller positive offset may be queueing (grants live 0.5 s), not skew
CLOCK_BEHIND_S = 0.02  # a negative offset cannot come from queueing: past this it is skew
CLOCK_MIN_SAMPLES = 8  # grants seen before a positive offset is believed (2 for a negative)


class Limiter(Protocol):
    """What the model router needs of a rate limiter."""

    def limited(self, deployment: str) -> bool:
        """Whether calls to ``deployment`` go through :meth:`acquire`."""

    async def acquire(self, deployment: str, tokens: int) -> None:
        """Wait until a call of ``tokens`` estimated tokens may go."""

    def settle(self, deployment: str, estimated: int, used: int) -> None:
        """A call debited ``estimated`` tokens and counted ``used``."""

    async def throttled(self, deployment: str, retry_after: float | None) -> None:
        """A call got a 429 (or a Retry-After)."""


class NoLimiter:
    """Limits nothing (a deployment without ``rpm``/``tpm``, or no limiter wired)."""

    def limited(self, deployment: str) -> bool:
        """Never."""
        return False

    async def acquire(self, deployment: str, tokens: int) -> None:
        """Returns at once."""

    def settle(self, deployment: str, estimated: int, used: int) -> None:
        """Nothing to settle."""

    async def throttled(self, deployment: str, retry_after: float | None) -> None:
        """Nothing to tell."""


class LimiterBus(Protocol):
    """What the limiter needs of :class:`relay_batches.bus.client.Bus`."""

    names: Names

    async def consume_queues(
        self,
        queues: Sequence[str],
        callback: MessageCallback,
        prefetch: int,
        *,
        intake: bool = True,
    ) -> Subscription:
        """Consume queues on a channel of their own; the subscription can cancel
        (``intake=False``: not stopped with the service's intake)."""

    async def publish_event(self, routing_key: str, body: bytes) -> None:
        """Publish an event with a confirm."""


@dataclass(eq=False)
class _Waiter:
    tokens: int
    future: asyncio.Future[None]


@dataclass(eq=False)
class _Lane:
    """One limited deployment's budget, waiters and grants consumer."""

    name: str
    queue: str
    budget: Budget
    waiters: deque[_Waiter] = field(default_factory=deque)
    subscription: Subscription | None = None
    subscribed: bool = False
    subscribing: asyncio.Task[None] | None = None  # the lane's own: a waiter may leave
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    idle_since: float = -math.inf
    throttle_sent_at: float = -math.inf
    typical_tokens: float = 0.0  # moving average of the calls' estimates (0: none yet)
    wake: asyncio.TimerHandle | None = None  # serves the waiters at the next pending slot
    wake_at: float = math.inf


class SharedLimiter:
    """Per limited deployment: a budget filled by the leader's grants (module doc)."""

    def __init__(
        self,
        bus: LimiterBus,
        limits: Mapping[str, RateLimit],
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._monotonic = monotonic
        # Applies a throttle to this worker's own pacer: whether it changed it (None:
        # no pacer here, every throttle is published). See :meth:`apply_throttles`.
        self._local: Callable[[str, float | None], bool] | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._lanes = {
            name: _Lane(name, bus.names.ratelimit_grants(name), Budget(limit))
            for name, limit in limits.items()
        }
        # How far this worker's clock runs ahead of the leader's: the least delay
        # (now - issued_at) of the recent grants (delivery takes milliseconds), so
        # expiries stamped by a leader with another clock are read right here. A
        # negative one (this clock behind) cannot come from queueing and is believed
        # after two grants; a positive one only past CLOCK_AHEAD_S and after
        # CLOCK_MIN_SAMPLES grants: grants that waited in the queue (the broker
        # delivers none older than their lifetime, half a second) must still expire on
        # time (a clock ahead by 0.02-0.5 s sees grants expire that much early).
        # Measured: a fresh worker whose first grants had queued 0.3-0.5 s took them
        # for skew, read stale grants as fresh and spent them in the next second (17
        # 429s at a job's start).
        self._delays: deque[float] = deque(maxlen=CLOCK_SAMPLES)
        self._offset = 0.0
        self._leader = ""  # whose grants the delays were measured on

    def apply_throttles(self, local: Callable[[str, float | None], bool]) -> None:
        """Apply each throttled call to this worker's pacer with ``local`` first (the
        keeper's :meth:`~relay_batches.ratelimit.keeper.Keeper.throttle`), and tell the
        other workers only when it changed that pacer."""
        self._local = local

    def _now(self) -> float:
        """This worker's clock, on the leader's time."""
        return self._clock() - self._offset

    def _observe_clock(self, issued_at: float, leader: str) -> None:
        if leader != self._leader:  # another leader, maybe another clock: measure anew
            self._leader = leader
            self._delays.clear()
            self._offset = 0.0
        if issued_at > 0:
            self._delays.append(self._clock() - issued_at)
            least, seen = min(self._delays), len(self._delays)
            ahead = least > CLOCK_AHEAD_S and seen >= CLOCK_MIN_SAMPLES
            behind = least < -CLOCK_BEHIND_S and seen >= 2
            self._offset = least if ahead or behind else 0.0

    def limited(self, deployment: str) -> bool:
        """Whether ``deployment`` has a limit."""
        return deployment in self._lanes

    def waiting(self, deployment: str) -> int:
        """Calls waiting for ``deployment``'s budget now."""
        lane = self._lanes.get(deployment)
        return 0 if lane is None else len(lane.waiters)

    def typical_tokens(self, deployment: str) -> int:
        """A typical call's token estimate (a moving average of this worker's calls and
        of the units of the grants it received; 0 before either): the unit the leader
        issues tokens in."""
        lane = self._lanes.get(deployment)
        return 0 if lane is None or lane.typical_tokens < 1 else round(lane.typical_tokens)

    def subscribed(self, deployment: str) -> bool:
        """Whether this worker consumes ``deployment``'s grants now."""
        lane = self._lanes.get(deployment)
        return lane is not None and lane.subscribed

    async def acquire(self, deployment: str, tokens: int) -> None:
        """Wait (first come, first served) until the budget lets a call of ``tokens``
        go; at once when nobody waits and the budget allows it."""
        lane = self._lanes.get(deployment)
        if lane is None:
            return
        _average_in(lane, tokens)
        if not lane.waiters and lane.budget.take(tokens, self._now()):
            self._taken(lane, 0.0)
            return
        started = self._monotonic()
        waiter = _Waiter(tokens, asyncio.get_running_loop().create_future())
        lane.waiters.append(waiter)
        self._wake(lane, self._now())  # a grant may be pending for its slot already
        try:
            while not waiter.future.done():
                await self._subscribe(lane)
                await asyncio.wait({waiter.future}, timeout=RESUBSCRIBE_S)
        except asyncio.CancelledError:
            self._abandon(lane, waiter)
            raise
        self._taken(lane, self._monotonic() - started)

    def _taken(self, lane: _Lane, waited_s: float) -> None:
        RATELIMIT_USED_REQUESTS.labels(lane.name).inc()
        RATELIMIT_WAIT.labels(lane.name).observe(waited_s)

    def _abandon(self, lane: _Lane, waiter: _Waiter) -> None:
        """A cancelled waiter: gone from the queue, or its budget given back."""
        if waiter.future.done() and not waiter.future.cancelled():
            lane.budget.give_back(waiter.tokens)
            self._serve(lane)
        else:
            waiter.future.cancel()
            with contextlib.suppress(ValueError):
                lane.waiters.remove(waiter)
        if not lane.waiters:
            lane.idle_since = self._monotonic()

    async def _subscribe(self, lane: _Lane) -> None:
        """Consume the lane's grants (again) unless already, in a task of the lane's own
        (shielded: a waiter cancelled meanwhile leaves it running, so the consumer it
        registers is kept in ``lane.subscription``)."""
        if lane.subscribed:
            return
        if lane.subscribing is None or lane.subscribing.done():
            lane.subscribing = asyncio.create_task(
                self._subscribe_lane(lane), name=f"grants-subscribe-{lane.name}"
            )
        await asyncio.shield(lane.subscribing)

    async def _subscribe_lane(self, lane: _Lane) -> None:
        """The subscribe itself; a failure is logged (a waiter tries again after
        :data:`RESUBSCRIBE_S`)."""
        async with lane.lock:
            if lane.subscribed or not lane.waiters:
                return
            try:
                if lane.subscription is None:
                    # Not intake: a draining worker's rows in flight still need grants.
                    lane.subscription = await self._bus.consume_queues(
                        [lane.queue], self._on_grant(lane), GRANTS_PREFETCH, intake=False
                    )
                else:
                    await lane.subscription.resume()
            except (Exception, asyncio.CancelledError) as exc:
                if not ordinary_error(exc):
                    raise
                log.warning(
                    "grants_subscribe_failed", extra={"deployment": lane.name, "error": repr(exc)}
                )
                return
            lane.subscribed = True

    def _on_grant(self, lane: _Lane) -> MessageCallback:
        async def on_message(message: AbstractIncomingMessage) -> None:
            try:
                grant = GrantMessage.decode(message.body)
            except MessageError as exc:
                log.error("message_rejected", extra={"kind": "grant", "error": str(exc)})
                await reject(message, requeue=False)  # the kit's policy for a poison message
                return
            now = self._now()
            if lane.budget.held(now) >= len(lane.waiters) and (
                not message.redelivered or grant.start_at - now > PASS_ON_S
            ):
                # Nobody here needs it (the consumer lingers a second after the last
                # waiter, and the grants held already pay for every waiting call): back to
                # the queue for a worker whose calls wait, while its slot is ahead (a grant
                # that comes back too late to pass on is kept).
                await reject(message, requeue=True)
                return
            self._observe_clock(grant.issued_at, grant.leader)
            if grant.call_tokens > 0:
                _average_in(lane, grant.call_tokens)
            budget = Grant(grant.requests, grant.tokens, grant.expires_at, grant.start_at)
            lane.budget.add(budget, self._now())
            self._serve(lane)
            await ack(message)

        return on_message

    def _serve(self, lane: _Lane) -> None:
        """Hand the budget to the waiters in order, as far as it goes (the last one
        served starts the lane's idle time); wake again at the next pending slot."""
        if not lane.waiters:
            return
        now = self._now()
        while lane.waiters:
            head = lane.waiters[0]
            if head.future.done():
                lane.waiters.popleft()
                continue
            if not lane.budget.take(head.tokens, now):
                self._wake(lane, now)
                return
            lane.waiters.popleft()
            head.future.set_result(None)
        lane.idle_since = self._monotonic()

    def _wake(self, lane: _Lane, now: float) -> None:
        """Serve ``lane`` again when its next pending grant's slot comes (one timer a
        lane, moved earlier when an earlier slot arrives)."""
        at = lane.budget.next_at()
        if at is None or (lane.wake is not None and lane.wake_at <= at):
            return
        if lane.wake is not None:
            lane.wake.cancel()
        lane.wake_at = at
        lane.wake = asyncio.get_running_loop().call_later(max(0.0, at - now), self._woken, lane)

    def _woken(self, lane: _Lane) -> None:
        lane.wake, lane.wake_at = None, math.inf
        self._serve(lane)

    def settle(self, deployment: str, estimated: int, used: int) -> None:
        """Correct the budget by what a finished call counted (tokens, by its usage); a
        call that counted less than its estimate gives the rest to the waiters at once."""
        lane = self._lanes.get(deployment)
        if lane is None:
            return
        lane.budget.settle(estimated, used)
        RATELIMIT_USED_TOKENS.labels(deployment).inc(used)
        self._serve(lane)

    async def throttled(self, deployment: str, retry_after: float | None) -> None:
        """Apply a throttled call to this worker's pacer, and tell every worker when it
        changed it (at most one event per deployment per :data:`THROTTLE_EVENT_EVERY_S`).
        Returns at once: the publish is fired and forgotten, its failure logged, never
        the row's (a stuck connection holds a publish up to its timeout)."""
        lane = self._lanes.get(deployment)
        if lane is None:
            return
        if self._local is not None and not self._local(deployment, retry_after):
            return
        now = self._monotonic()
        if now - lane.throttle_sent_at < THROTTLE_EVENT_EVERY_S:
            return
        lane.throttle_sent_at = now
        body = ThrottledEvent(deployment, retry_after).encode()
        task = asyncio.create_task(self._send(deployment, body), name=f"throttled-{deployment}")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, deployment: str, body: bytes) -> None:
        try:
            await self._bus.publish_event(EVENT_THROTTLED, body)
        except (Exception, asyncio.CancelledError) as exc:
            if not ordinary_error(exc):
                raise
            log.warning(
                "throttled_publish_failed", extra={"deployment": deployment, "error": repr(exc)}
            )

    async def release_idle(self) -> None:
        """Cancel the grants consumers of deployments nobody waited for in :data:`IDLE_S`
        (a periodic pass): the grants go to the workers that need them."""
        now = self._monotonic()
        for lane in self._lanes.values():
            if lane.subscribed and not lane.waiters and now - lane.idle_since >= IDLE_S:
                await self._unsubscribe(lane)

    async def _unsubscribe(self, lane: _Lane) -> None:
        async with lane.lock:
            if not lane.subscribed or lane.waiters or lane.subscription is None:
                return
            lane.subscribed = False
            await lane.subscription.cancel()


def _average_in(lane: _Lane, tokens: int) -> None:
    """Move the lane's typical call towards ``tokens`` (the first sample sets it)."""
    lane.typical_tokens = (
        tokens if not lane.typical_tokens else lane.typical_tokens * 0.9 + tokens * 0.1
    )
