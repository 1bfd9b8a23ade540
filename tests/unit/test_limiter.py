"""Unit tests of the worker-side SharedLimiter on a fake bus with its real interface:
first come first served, a cancelled waiter leaves nothing behind, no bus for a
deployment without a limit, and the grants consumer only while calls wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from relay_batches.bus.client import MessageCallback
from relay_batches.bus.topology import Names
from relay_batches.messages import GrantMessage, ThrottledEvent
from relay_batches.ratelimit.keeper import Keeper
from relay_batches.ratelimit.limiter import CLOCK_MIN_SAMPLES, SharedLimiter
from relay_batches.ratelimit.limits import RateLimit


class Delivery:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.acked = False
        self.requeued = False
        self.nacked = False
        self.redelivered = False

    async def ack(self, multiple: bool = False) -> None:
        self.acked = True

    async def nack(self, requeue: bool = True) -> None:
        self.nacked, self.requeued = True, requeue


class FakeSubscription:
    def __init__(self, bus: FakeBus) -> None:
        self._bus = bus

    async def cancel(self) -> None:
        self._bus.active = False

    async def resume(self) -> None:
        self._bus.active = True


class FakeBus:
    def __init__(self) -> None:
        self.names = Names("unit")
        self.callback: MessageCallback | None = None
        self.active = False
        self.subscribes = 0
        self.events: list[tuple[str, bytes]] = []

    async def consume_queues(
        self,
        queues: Sequence[str],
        callback: MessageCallback,
        prefetch: int,
        *,
        intake: bool = True,
    ) -> FakeSubscription:
        assert not intake  # grants are no intake: a draining worker's rows still need them
        assert list(queues) == [self.names.ratelimit_grants("d")]
        self.callback, self.active = callback, True
        self.subscribes += 1
        return FakeSubscription(self)

    async def publish_event(self, routing_key: str, body: bytes) -> None:
        self.events.append((routing_key, body))

    async def grant(
        self,
        requests: int,
        expires_at: float = 1e12,
        redelivered: bool = False,
        start_at: float = 0.0,
    ) -> Delivery:
        assert self.callback is not None and self.active
        message = GrantMessage("d", requests, 0, expires_at, start_at=start_at)
        delivery = Delivery(message.encode())
        delivery.redelivered = redelivered
        await self.callback(delivery)  # type: ignore[arg-type]
        return delivery


async def until(check: object) -> None:
    for _ in range(1000):
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def one_waiting() -> tuple[FakeBus, SharedLimiter, asyncio.Task[None]]:
    """A limiter of 600 rpm on a fake bus, with one call waiting for budget."""
    bus = FakeBus()
    limiter = SharedLimiter(bus, {"d": RateLimit(rpm=600)})
    call = asyncio.create_task(limiter.acquire("d", 0))
    await until(lambda: bus.active)
    return bus, limiter, call


async def cancelled(call: asyncio.Task[None]) -> None:
    """Cancel a waiting call and see it end so."""
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


async def test_waiters_are_served_in_order_and_a_cancelled_one_leaves_nothing() -> None:
    bus = FakeBus()
    limiter = SharedLimiter(bus, {"d": RateLimit(rpm=600)})
    first = asyncio.create_task(limiter.acquire("d", 0))
    second = asyncio.create_task(limiter.acquire("d", 0))
    third = asyncio.create_task(limiter.acquire("d", 0))
    await until(lambda: limiter.waiting("d") == 3 and bus.active)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert limiter.waiting("d") == 2
    delivery = await bus.grant(1)
    assert delivery.acked
    await first
    assert not third.done()
    await bus.grant(1)
    await third
    assert limiter.waiting("d") == 0


async def test_an_expired_grant_is_acked_and_dropped() -> None:
    bus, _, call = await one_waiting()
    delivery = await bus.grant(5, expires_at=1.0)
    assert delivery.acked
    await asyncio.sleep(0)
    assert not call.done()
    await cancelled(call)


async def test_a_call_starts_at_its_grants_slot_not_when_the_grant_arrives() -> None:
    bus, limiter, call = await one_waiting()
    slot = time.time() + 0.08
    delivery = await bus.grant(1, start_at=slot, expires_at=slot + 0.5)
    assert delivery.acked
    await asyncio.sleep(0.04)
    assert not call.done()  # held until its slot
    await asyncio.wait_for(call, 1.0)
    assert time.time() >= slot
    later = asyncio.create_task(limiter.acquire("d", 0))
    await until(lambda: limiter.waiting("d") == 1)
    gone = time.time() + 0.01
    await bus.grant(1, start_at=gone - 0.02, expires_at=gone)  # its slot passed: expires soon
    await asyncio.sleep(0.02)
    assert limiter.waiting("d") == 0 and later.done()  # taken at once, within its life
    late = asyncio.create_task(limiter.acquire("d", 0))
    await until(lambda: limiter.waiting("d") == 1)
    await asyncio.sleep(0.02)
    assert not late.done()  # no grant left: nothing banked from the last one
    await cancelled(late)


async def test_a_grant_not_needed_here_is_passed_on_while_its_slot_is_ahead() -> None:
    bus, _, call = await one_waiting()
    ahead = time.time() + 0.2
    first = await bus.grant(1, start_at=ahead, expires_at=ahead + 0.03)
    assert first.acked  # one call waits: kept for its slot
    extra = await bus.grant(1, start_at=ahead + 0.1, expires_at=ahead + 0.13)
    assert extra.requeued  # the call is paid for already: for another worker
    again = await bus.grant(1, start_at=ahead + 0.1, expires_at=ahead + 0.13, redelivered=True)
    assert again.requeued  # back again, still well ahead: passed on again
    near = time.time() + 0.01
    kept = await bus.grant(1, start_at=near, expires_at=near + 0.03, redelivered=True)
    assert kept.acked  # too near its slot to pass on
    await asyncio.wait_for(call, 1.0)


async def test_unlimited_deployment_costs_nothing_and_idle_consumer_goes() -> None:
    bus = FakeBus()
    clock = [0.0]
    limiter = SharedLimiter(bus, {"d": RateLimit(rpm=600)}, monotonic=lambda: clock[0])
    await limiter.acquire("free", 100)
    await limiter.throttled("free", 1.0)
    assert (bus.subscribes, bus.events) == (0, [])
    call = asyncio.create_task(limiter.acquire("d", 0))
    await until(lambda: bus.active)
    await bus.grant(1)
    await call
    await limiter.release_idle()
    assert bus.active  # not idle for a second yet
    spare = await bus.grant(1)  # nobody waits: handed back once for another worker
    assert (spare.acked, spare.requeued) == (False, True)
    kept = await bus.grant(1, redelivered=True)
    assert kept.acked
    clock[0] = 1.0
    await limiter.release_idle()  # a grant arriving without waiters is no activity
    assert not bus.active
    await limiter.acquire("d", 0)  # the kept grant, at once
    assert not bus.active
    again = asyncio.create_task(limiter.acquire("d", 0))
    await until(lambda: bus.active)
    assert bus.subscribes == 1  # resumed, not a second consumer
    await bus.grant(1)
    await again


async def test_throttled_events_are_at_most_one_per_100_ms() -> None:
    bus = FakeBus()
    clock = [10.0]
    limiter = SharedLimiter(bus, {"d": RateLimit(rpm=600)}, monotonic=lambda: clock[0])
    await limiter.throttled("d", 1.0)
    await limiter.throttled("d", 1.0)
    clock[0] = 10.125
    await limiter.throttled("d", None)
    await until(lambda: len(bus.events) == 2)
    assert [key for key, _ in bus.events] == ["ratelimit.throttled"] * 2


async def test_only_a_throttle_that_changed_the_own_pacer_is_published() -> None:
    bus = FakeBus()
    clock = [100.0]
    limiter = SharedLimiter(bus, {"d": RateLimit(rpm=600)}, monotonic=lambda: clock[0])
    keeper = Keeper(bus, {"d": RateLimit(rpm=600)}, clock=lambda: clock[0])  # type: ignore[arg-type]
    limiter.apply_throttles(keeper.throttle)
    for step in range(10):  # ten 429s within a second: one decrease, one event
        clock[0] = 100.0 + 0.1 * step
        await limiter.throttled("d", None)
    clock[0] = 100.95
    await limiter.throttled("d", 30.0)  # a pause: a change worth telling
    await limiter.throttled("d", 30.0)  # the same pause
    clock[0] = 101.5
    await limiter.throttled("d", None)  # a second after the decrease: the next one
    await until(lambda: len(bus.events) == 3)
    await asyncio.sleep(0)
    assert [ThrottledEvent.decode(body).retry_after for _, body in bus.events] == [
        None,
        30.0,
        None,
    ]
    assert keeper.pacers["d"].fraction == pytest.approx((0.8 + 0.05 * 1.5) * 0.8)  # two decreases


async def test_a_throttle_publish_stuck_or_failing_never_holds_the_call() -> None:
    bus = FakeBus()
    stuck = asyncio.Event()
    calls = 0

    async def publish_event(routing_key: str, body: bytes) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await stuck.wait()  # a reconnect: the publish waits up to its timeout
        raise asyncio.CancelledError  # aiormq fails the pending calls of a dead link

    bus.publish_event = publish_event  # type: ignore[method-assign]
    clock = [0.0]
    limiter = SharedLimiter(bus, {"d": RateLimit(rpm=600)}, monotonic=lambda: clock[0])
    await asyncio.wait_for(limiter.throttled("d", 2.0), 0.5)  # at once, though stuck
    clock[0] = 1.0
    await asyncio.wait_for(limiter.throttled("d", 2.0), 0.5)
    await until(lambda: calls == 2)
    stuck.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert calls == 2  # both ended: logged, no task left running nor crashed


async def test_a_waiter_cancelled_during_the_first_subscribe_leaves_no_orphan_consumer() -> None:
    bus = FakeBus()
    registered = asyncio.Event()
    go_on = asyncio.Event()
    real = bus.consume_queues

    async def slow_consume(*args: Any, **kwargs: Any) -> FakeSubscription:
        subscription = await real(*args, **kwargs)  # the broker has the consumer now
        registered.set()
        await go_on.wait()  # ... and the consume-ok is on its way
        return subscription

    bus.consume_queues = slow_consume  # type: ignore[method-assign]
    limiter = SharedLimiter(bus, {"d": RateLimit(rpm=600)})
    first = asyncio.create_task(limiter.acquire("d", 0))
    await asyncio.wait_for(registered.wait(), 1.0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    second = asyncio.create_task(limiter.acquire("d", 0))
    go_on.set()
    await until(lambda: limiter.subscribed("d"))
    await bus.grant(1)
    await second
    assert bus.subscribes == 1  # the one consumer is the lane's, not an orphan's


async def test_grants_teach_the_typical_call_and_a_new_leader_resets_the_clock() -> None:
    bus = FakeBus()
    clock = [1000.0]
    limiter = SharedLimiter(bus, {"d": RateLimit(tpm=60_000)}, clock=lambda: clock[0])
    assert limiter.typical_tokens("d") == 0  # nothing known: the leader issues in ones
    call = asyncio.create_task(limiter.acquire("d", 300))
    await until(lambda: bus.active)
    assert bus.callback is not None
    for _ in range(CLOCK_MIN_SAMPLES - 1):  # until the offset is believed, they look expired
        early = Delivery(GrantMessage("d", 0, 300, 997.5, 997.0, 0, "a").encode())
        early.redelivered = False
        await bus.callback(early)  # type: ignore[arg-type]
        assert not call.done()
    ahead = Delivery(GrantMessage("d", 0, 300, 997.5, 997.0, 500, "a").encode())
    ahead.redelivered = False
    await bus.callback(ahead)  # type: ignore[arg-type]  # leader a's clock is 3 s behind
    await asyncio.wait_for(call, 5.0)
    assert limiter.typical_tokens("d") == 320  # 300, then 500 averaged in
    late = asyncio.create_task(limiter.acquire("d", 300))
    await until(lambda: limiter.waiting("d") == 1)
    fresh = Delivery(GrantMessage("d", 0, 600, 1000.5, 1000.0, 0, "b").encode())
    fresh.redelivered = False
    await bus.callback(fresh)  # type: ignore[arg-type]  # leader b: the same clock as ours
    await asyncio.wait_for(late, 5.0)  # on b's clock, not a's 3 s offset (expired there)
    assert limiter.typical_tokens("d") == 318  # 0: b knew no typical call


async def test_a_worker_clock_ahead_of_the_leaders_still_uses_fresh_grants() -> None:
    bus = FakeBus()
    clock = [1000.0]  # the leader's clock reads 997.0: this worker is 3 s ahead
    limiter = SharedLimiter(bus, {"d": RateLimit(rpm=600)}, clock=lambda: clock[0])
    call = asyncio.create_task(limiter.acquire("d", 0))
    await until(lambda: bus.active)
    assert bus.callback is not None
    # The offset is believed after CLOCK_MIN_SAMPLES grants: the first ones look expired.
    for _ in range(CLOCK_MIN_SAMPLES):
        assert not call.done()
        fresh = Delivery(GrantMessage("d", 1, 0, 997.5, issued_at=997.0).encode())
        fresh.redelivered = False
        await bus.callback(fresh)  # type: ignore[arg-type]
        await asyncio.sleep(0)
    await asyncio.wait_for(call, 5.0)
    stale = Delivery(GrantMessage("d", 1, 0, 997.5, issued_at=997.0).encode())
    stale.redelivered = True
    clock[0] = 1000.6  # 0.6 s later on both clocks: that grant has expired
    late = asyncio.create_task(limiter.acquire("d", 0))
    await until(lambda: limiter.waiting("d") == 1)
    await bus.callback(stale)  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert not late.done()
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late


async def test_a_grant_that_waited_in_the_queue_is_not_taken_for_clock_skew() -> None:
    bus = FakeBus()
    clock = [1000.0]
    limiter = SharedLimiter(bus, {"d": RateLimit(rpm=600)}, clock=lambda: clock[0])
    call = asyncio.create_task(limiter.acquire("d", 0))
    await until(lambda: bus.active)
    assert bus.callback is not None
    old = Delivery(GrantMessage("d", 1, 0, 999.9, issued_at=999.8).encode())  # 0.2 s queued
    old.redelivered = False
    await bus.callback(old)  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert old.acked and not call.done()  # expired on the shared clock: dropped
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


async def test_a_settle_under_the_estimate_serves_a_waiter_and_a_bad_grant_is_rejected() -> None:
    bus = FakeBus()
    limiter = SharedLimiter(bus, {"d": RateLimit(tpm=60_000)})
    first = asyncio.create_task(limiter.acquire("d", 100))
    await until(lambda: bus.active)
    assert bus.callback is not None
    poison = Delivery(b'{"kind": "grant"}')
    await bus.callback(poison)  # type: ignore[arg-type]
    assert (poison.acked, poison.nacked, poison.requeued) == (False, True, False)
    grant = Delivery(GrantMessage("d", 0, 100, 1e12).encode())
    await bus.callback(grant)  # type: ignore[arg-type]
    await first  # the budget: 0 tokens left
    second = asyncio.create_task(limiter.acquire("d", 100))
    await until(lambda: limiter.waiting("d") == 1)
    limiter.settle("d", 100, 40)  # the call counted 40: 60 tokens back, a waiter goes
    await asyncio.wait_for(second, 1.0)


async def test_a_worker_clock_behind_the_leaders_reads_expiries_on_the_leaders_time() -> None:
    bus = FakeBus()
    clock = [1000.0]  # the leader's clock reads 1000.3: this worker is 0.3 s behind
    limiter = SharedLimiter(bus, {"d": RateLimit(rpm=600)}, clock=lambda: clock[0])
    for _ in range(2):  # a negative delay is skew, not queueing: believed after two
        call = asyncio.create_task(limiter.acquire("d", 0))
        await until(lambda: bus.active and limiter.waiting("d") == 1)
        assert bus.callback is not None
        fresh = Delivery(GrantMessage("d", 1, 0, 1000.8, issued_at=1000.3).encode())
        fresh.redelivered = False
        await bus.callback(fresh)  # type: ignore[arg-type]
        await asyncio.wait_for(call, 5.0)
    clock[0] = 1000.6  # 1000.9 on the leader's clock: a grant expiring at 1000.8 is gone
    late = asyncio.create_task(limiter.acquire("d", 0))
    await until(lambda: limiter.waiting("d") == 1)
    stale = Delivery(GrantMessage("d", 1, 0, 1000.8, issued_at=1000.3).encode())
    stale.redelivered = True
    await bus.callback(stale)  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert not late.done()
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late
