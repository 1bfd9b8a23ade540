"""Unit tests of the service kit: settling single deliveries and chunks, periodic tasks,
readiness, the drain, and the schema gate. The bus and its deliveries are fakes with the
interface the kit uses; no broker runs here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from relay_batches.bus.client import MessageCallback
from relay_batches.bus.topology import Names
from relay_batches.errors import HandBack, TransientError, UnstorableError
from relay_batches.kit.base import BusService, Readiness
from relay_batches.kit.chunks import ChunkInbox, ConsumeChunks, DeadLetter
from relay_batches.kit.consumer import Consume, Intake, Subscribe
from relay_batches.kit.periodic import Periodic
from relay_batches.ledger.schema import SchemaGate, expected_migrations, migration_version
from relay_batches.messages import MessageError
from tests.helpers.support import wait_until

WAIT_S = 5.0


@dataclass
class FakeDelivery:
    """A delivery that records how it was settled."""

    body: bytes
    routing_key: str = "q"
    consumer_tag: str | None = None  # the consumer it came through (set by FakeBus.deliver)
    headers: dict[str, Any] = field(default_factory=dict)
    settled: list[tuple[str, bool]] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def ack(self, multiple: bool = False) -> None:
        self.settled.append(("ack", multiple))
        self.done.set()

    async def nack(self, requeue: bool = True) -> None:
        self.settled.append(("nack", requeue))
        self.done.set()


class FakeSubscription:
    """Notes cancels and resumes; ``racing`` are delivered while a cancel is under way
    (as the broker may, before its cancel-ok)."""

    def __init__(self, callback: MessageCallback) -> None:
        self.callback = callback
        self.events: list[str] = []
        self.racing: list[FakeDelivery] = []
        self.resumed = asyncio.Event()

    async def cancel(self) -> None:
        self.events.append("cancel")
        for delivery in self.racing:
            await self.callback(delivery)  # type: ignore[arg-type]

    async def resume(self) -> None:
        self.events.append("resume")
        self.resumed.set()


class FakeBus:
    """Records consumers; :meth:`deliver` hands a delivery to one of them."""

    def __init__(self) -> None:
        self.names = Names("t")
        self.connected = True
        self.callbacks: dict[str, MessageCallback] = {}
        self.prefetch: dict[str, int] = {}
        self.subscriptions: list[FakeSubscription] = []
        self.stopped = False

    async def consume(self, queue: str, callback: MessageCallback, prefetch: int) -> None:
        self.callbacks[queue] = callback
        self.prefetch[queue] = prefetch

    async def consume_queues(
        self, queues: Sequence[str], callback: MessageCallback, prefetch: int
    ) -> FakeSubscription:
        for queue in queues:
            await self.consume(queue, callback, prefetch)
        self.subscriptions.append(FakeSubscription(callback))
        return self.subscriptions[-1]

    async def consume_events(
        self, routing_keys: Sequence[str], callback: MessageCallback, prefetch: int = 64
    ) -> None:
        for key in routing_keys:
            self.callbacks[key] = callback
            self.prefetch[key] = prefetch

    def ready(self) -> bool:
        return self.connected

    async def stop_consuming(self) -> None:
        self.stopped = True

    async def deliver(self, queue: str, delivery: FakeDelivery) -> None:
        delivery.consumer_tag = delivery.consumer_tag or f"ctag.{queue}"
        await self.callbacks[queue](delivery)  # type: ignore[arg-type]


def text(body: bytes) -> str:
    """A decoder that refuses the body ``bad``."""
    if body == b"bad":
        raise MessageError("not a message")
    return body.decode()


@dataclass
class Running:
    """A started service with its stop event and run task."""

    service: BusService
    bus: FakeBus
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, WAIT_S)


@contextlib.asynccontextmanager
async def started(
    intakes: Sequence[Intake], grace_s: float = 1.0, **kwargs: object
) -> AsyncIterator[Running]:
    bus = FakeBus()
    service = BusService(bus, intakes, grace_s=grace_s, **kwargs)  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    running = Running(service, bus, stop, task)
    await wait_until(service.ready, WAIT_S, "the service to consume")
    try:
        yield running
    finally:
        if not task.done():
            await running.finish()


class Recorder:
    """A handler that records what it got; fails while ``failures`` > 0."""

    def __init__(self, failures: int = 0, block: bool = False) -> None:
        self.got: list[object] = []
        self.failures = failures
        self.block = block
        self.entered = asyncio.Event()

    async def __call__(self, value: object) -> None:
        self.got.append(value)
        self.entered.set()
        if self.block:
            await asyncio.Event().wait()
        if self.failures > 0:
            self.failures -= 1
            raise TransientError("database away")


def consume(handler: Recorder) -> Consume[str]:
    return Consume("q", "test", text, handler, prefetch=3, retry_pause_s=0)


async def test_a_good_delivery_is_handled_then_acked() -> None:
    handler = Recorder()
    async with started([consume(handler)]) as running:
        delivery = FakeDelivery(b"hello")
        await running.bus.deliver("q", delivery)
        await asyncio.wait_for(delivery.done.wait(), WAIT_S)
        assert handler.got == ["hello"]
        assert delivery.settled == [("ack", False)]
        assert running.bus.prefetch == {"q": 3}


async def test_an_undecodable_delivery_is_rejected_without_requeue_and_never_handled() -> None:
    handler = Recorder()
    async with started([consume(handler)]) as running:
        delivery = FakeDelivery(b"bad")
        await running.bus.deliver("q", delivery)
        await asyncio.wait_for(delivery.done.wait(), WAIT_S)
        assert handler.got == []
        assert delivery.settled == [("nack", False)]


async def test_a_failing_handler_requeues_the_delivery() -> None:
    handler = Recorder(failures=1)
    async with started([consume(handler)]) as running:
        delivery = FakeDelivery(b"hello")
        await running.bus.deliver("q", delivery)
        await asyncio.wait_for(delivery.done.wait(), WAIT_S)
        assert delivery.settled == [("nack", True)]


async def test_a_delivery_handed_back_is_requeued_at_once_without_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def hand_back(value: str) -> None:
        raise HandBack("stopping")

    slow = Consume("q", "test", text, hand_back, prefetch=3, retry_pause_s=3600)
    async with started([slow]) as running:
        delivery = FakeDelivery(b"hello")
        await running.bus.deliver("q", delivery)
        await asyncio.wait_for(delivery.done.wait(), WAIT_S)  # no hour-long retry pause
        assert delivery.settled == [("nack", True)]
    assert "handler_failed" not in caplog.text


async def test_a_handler_cancelled_at_the_drain_deadline_settles_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler = Recorder(block=True)
    closed: list[bool] = []

    async def close() -> None:
        closed.append(True)

    async with started([consume(handler)], grace_s=0.05, close=close) as running:
        delivery = FakeDelivery(b"hello")
        await running.bus.deliver("q", delivery)
        await asyncio.wait_for(handler.entered.wait(), WAIT_S)
        with caplog.at_level(logging.INFO, logger="relay.service"):
            await running.finish()
        assert delivery.settled == []
        assert running.bus.stopped
        assert closed == [True]
        assert [r.msg for r in caplog.records if r.name == "relay.service"] == [
            "draining",
            "tasks_handed_back",
        ]


async def test_the_drain_waits_for_work_in_flight_within_the_grace() -> None:
    release = asyncio.Event()

    async def slow(value: str) -> None:
        await release.wait()

    stopping: list[bool] = []
    async with started(
        [Consume("q", "test", text, slow, prefetch=1)],
        grace_s=WAIT_S,
        stopping=lambda: stopping.append(True),
    ) as running:
        delivery = FakeDelivery(b"hello")
        await running.bus.deliver("q", delivery)
        running.stop.set()
        await wait_until(lambda: _true(bool(stopping)), WAIT_S, "the drain to begin")
        assert not await running.service.ready()
        assert not running.task.done()
        release.set()
        await asyncio.wait_for(running.task, WAIT_S)
        assert delivery.settled == [("ack", False)]


async def _true(value: bool) -> bool:
    return value


async def test_events_go_to_the_handler_of_their_routing_key() -> None:
    progress, canceled = Recorder(), Recorder()
    events = Subscribe({"job.progress": progress, "job.canceled": canceled}, text)
    async with started([events]) as running:
        first = FakeDelivery(b"a", routing_key="job.canceled")
        await running.bus.deliver("job.canceled", first)
        stray = FakeDelivery(b"b", routing_key="job.finished")
        await running.bus.deliver("job.progress", stray)
        await asyncio.wait_for(first.done.wait(), WAIT_S)
        await asyncio.wait_for(stray.done.wait(), WAIT_S)
        assert (canceled.got, progress.got) == (["a"], [])
        assert first.settled == [("ack", False)]
        assert stray.settled == [("nack", False)]


def chunks(handler: Callable[[list[str]], Awaitable[object]]) -> ConsumeChunks[str]:
    return ConsumeChunks(
        "r", "results", text, handler, prefetch=8, chunk=3, linger_s=1.0, retry_pause_s=0
    )


async def deliver_all(bus: FakeBus, bodies: Sequence[bytes]) -> list[FakeDelivery]:
    deliveries = [FakeDelivery(body) for body in bodies]
    for delivery in deliveries:
        await bus.deliver("r", delivery)
    # Chunks are settled in order: the last delivery is the last one settled.
    await asyncio.wait_for(deliveries[-1].done.wait(), WAIT_S)
    return deliveries


async def test_a_good_chunk_is_handled_as_one_list_and_acked_with_one_multiple_ack() -> None:
    handler = Recorder()
    async with started([chunks(handler)]) as running:
        first = await deliver_all(running.bus, [b"a", b"b", b"c"])
        assert handler.got == [["a", "b", "c"]]
        assert [d.settled for d in first] == [[], [], [("ack", True)]]


async def test_chunks_over_several_queues_share_the_prefetch_and_one_multiple_ack() -> None:
    handler = Recorder()
    consume = ConsumeChunks(
        "r", "results", text, handler, prefetch=8, chunk=3, linger_s=1.0, also_queues=("s0", "s1")
    )
    async with started([consume]) as running:
        assert running.bus.prefetch == {"r": 3, "s0": 3, "s1": 3}
        deliveries = [FakeDelivery(b"a"), FakeDelivery(b"b"), FakeDelivery(b"c")]
        for queue, delivery in zip(("s1", "r", "s0"), deliveries, strict=True):
            await running.bus.deliver(queue, delivery)
        await asyncio.wait_for(deliveries[-1].done.wait(), WAIT_S)
        assert handler.got == [["a", "b", "c"]]
        assert [d.settled for d in deliveries] == [[], [], [("ack", True)]]


async def test_each_queue_may_hold_a_whole_base_chunk_however_the_prefetch_is_shared() -> None:
    consume = ConsumeChunks(
        "r",
        "results",
        text,
        Recorder(),
        prefetch=256,
        chunk=64,
        linger_s=1.0,
        also_queues=("s0", "s1", "s2", "s3"),
    )
    async with started([consume]) as running:
        # 256 / 5 = 52 would leave one busy shard unable to fill a chunk of 64.
        assert running.bus.prefetch == dict.fromkeys(("r", "s0", "s1", "s2", "s3"), 64)


async def test_a_chunk_closes_without_lingering_once_the_inbox_holds_all_it_may() -> None:
    inbox = ChunkInbox(prefetch=1, consumers=2)
    for body, tag in ((b"a", "s0"), (b"b", "s1")):
        await inbox.put(FakeDelivery(body, consumer_tag=tag))  # type: ignore[arg-type]
    # Size 4 and a minute's linger: but with 2 unsettled, the channel delivers no more.
    taken = await asyncio.wait_for(inbox.next_chunk(asyncio.Event(), 4, 1 << 20, 60.0), WAIT_S)
    assert [m.body for m in taken] == [b"a", b"b"]


async def put_from(inbox: ChunkInbox, tag: str, bodies: Sequence[bytes]) -> None:
    for body in bodies:
        await inbox.put(FakeDelivery(body, consumer_tag=tag))  # type: ignore[arg-type]


async def test_a_chunk_from_one_busy_consumer_closes_at_its_prefetch_without_lingering() -> None:
    # One job's outcomes all on one shard: its consumer stops at 64 unacked while the
    # other four are idle. A chunk of 128 with a minute's linger takes the 64 at once.
    inbox = ChunkInbox(prefetch=64, consumers=5)
    await put_from(inbox, "s2", [b"%d" % n for n in range(64)])
    taken = await asyncio.wait_for(inbox.next_chunk(asyncio.Event(), 128, 1 << 20, 60.0), WAIT_S)
    assert [m.body for m in taken] == [b"%d" % n for n in range(64)]
    assert inbox.waiting() == 0


async def test_a_chunk_lingers_while_a_busy_consumer_is_below_its_prefetch() -> None:
    inbox = ChunkInbox(prefetch=2, consumers=3)
    await put_from(inbox, "s0", [b"a", b"b"])  # at its prefetch
    await put_from(inbox, "s1", [b"c"])  # may deliver one more
    chunk = asyncio.ensure_future(inbox.next_chunk(asyncio.Event(), 8, 1 << 20, 60.0))

    async def all_taken() -> bool:
        return inbox.waiting() == 0

    await wait_until(all_taken, WAIT_S, "the three deliveries taken into the chunk")
    assert not chunk.done()  # lingering for s1's next delivery
    await put_from(inbox, "s1", [b"d"])
    # Now both busy consumers are at their prefetch: the chunk closes, the idle s2 aside.
    taken = await asyncio.wait_for(chunk, WAIT_S)
    assert [m.body for m in taken] == [b"a", b"b", b"c", b"d"]


async def test_one_busy_shard_is_taken_chunk_after_chunk_without_lingering() -> None:
    handler = Recorder()
    consume = ConsumeChunks(
        "r",
        "results",
        text,
        handler,
        prefetch=2,
        chunk=2,
        chunk_max=8,
        linger_s=60.0,
        retry_pause_s=0,
        also_queues=("s0", "s1"),
    )
    async with started([consume]) as running:
        deliveries = [FakeDelivery(body) for body in (b"a", b"b", b"c", b"d")]
        for delivery in deliveries:
            await running.bus.deliver("s0", delivery)
        await asyncio.wait_for(deliveries[-1].done.wait(), WAIT_S)
        # Full chunks with more waiting, yet the size stays at what s0 may hold (2),
        # and no chunk waits out the minute's linger.
        assert handler.got == [["a", "b"], ["c", "d"]]


async def test_a_failed_chunk_sets_the_size_back_to_the_base() -> None:
    sizes: list[int] = []

    async def handler(values: list[str]) -> None:
        sizes.append(len(values))
        if len(values) > 2:
            raise TransientError("statement timeout")  # too big a chunk

    consume = ConsumeChunks(
        "r",
        "results",
        text,
        handler,
        prefetch=64,
        chunk=2,
        chunk_max=8,
        linger_s=0.05,
        retry_pause_s=0,
    )
    async with started([consume]) as running:
        await deliver_all(running.bus, [b"a", b"b", b"c", b"d", b"e", b"f"])
        await deliver_all(running.bus, [b"g", b"h", b"i"])
        # 2 (full, more waiting: grows), 4 fails (back to 2, not larger), then 2 and 1.
        assert sizes == [2, 4, 2, 1]


async def test_a_consumer_whose_chunks_keep_failing_steps_aside_and_comes_back() -> None:
    handler = Recorder(failures=3)
    consume = ConsumeChunks(
        "r",
        "results",
        text,
        handler,
        prefetch=8,
        chunk=1,
        linger_s=0.01,
        retry_pause_s=0,
        step_aside_s=0.05,
    )
    async with started([consume]) as running:
        [subscription] = running.bus.subscriptions
        racing = FakeDelivery(b"late")
        subscription.racing.append(racing)
        failed = [FakeDelivery(body) for body in (b"a", b"b", b"c")]
        for delivery in failed:
            await running.bus.deliver("r", delivery)
        await asyncio.wait_for(subscription.resumed.wait(), WAIT_S)
        assert subscription.events == ["cancel", "resume"]
        assert [d.settled for d in failed] == [[("nack", True)]] * 3
        # Delivered while the cancel was under way: requeued unhandled, for the standby.
        assert racing.settled == [("nack", True)]
        assert handler.got == [["a"], ["b"], ["c"]]
        after = await deliver_all(running.bus, [b"d"])
        assert after[0].settled == [("ack", True)]


async def test_a_chunk_with_a_poison_message_rejects_it_and_acks_the_others_one_by_one() -> None:
    handler = Recorder()
    async with started([chunks(handler)]) as running:
        settled = await deliver_all(running.bus, [b"a", b"bad", b"c"])
        assert handler.got == [["a", "c"]]
        assert [d.settled for d in settled] == [
            [("ack", False)],
            [("nack", False)],
            [("ack", False)],
        ]


async def test_a_chunk_whose_handler_fails_is_requeued_whole() -> None:
    handler = Recorder(failures=1)
    async with started([chunks(handler)]) as running:
        settled = await deliver_all(running.bus, [b"a", b"b", b"c"])
        assert [d.settled for d in settled] == [[("nack", True)]] * 3


async def test_a_chunks_unstorable_messages_are_dead_lettered_before_they_are_acked() -> None:
    published: list[tuple[bytes, str]] = []

    async def publish(body: bytes, reason: str) -> None:
        published.append((body, reason))

    async def handler(values: list[str]) -> None:
        raise UnstorableError([1], "no such row")  # the second value: the third message

    consume = ConsumeChunks(
        "r",
        "results",
        text,
        handler,
        prefetch=8,
        chunk=3,
        linger_s=1.0,
        retry_pause_s=0,
        dead_letter=DeadLetter("r.dead", publish),
    )
    async with started([consume]) as running:
        settled = await deliver_all(running.bus, [b"a", b"bad", b"c"])
        assert published == [(b"c", "no such row")]
        assert [d.settled for d in settled] == [
            [("ack", False)],
            [("nack", False)],
            [("ack", False)],
        ]


async def test_a_chunk_cancelled_at_the_drain_deadline_settles_nothing() -> None:
    handler = Recorder(block=True)
    async with started([chunks(handler)], grace_s=0.05) as running:
        deliveries = [FakeDelivery(body) for body in (b"a", b"b", b"c")]
        for delivery in deliveries:
            await running.bus.deliver("r", delivery)
        await asyncio.wait_for(handler.entered.wait(), WAIT_S)
        await running.finish()
        assert [d.settled for d in deliveries] == [[], [], []]


async def test_a_periodic_task_keeps_running_after_an_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    passes = 0
    third = asyncio.Event()

    async def flaky() -> None:
        nonlocal passes
        passes += 1
        if passes == 3:
            third.set()
        if passes == 1:
            raise TransientError("database away")

    task = Periodic("flaky", 0.001, flaky)
    halt = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="relay.periodic"):
        loop = asyncio.create_task(task.loop(halt))
        await asyncio.wait_for(third.wait(), WAIT_S)
        halt.set()
        await asyncio.wait_for(loop, WAIT_S)
    [failure] = [r for r in caplog.records if r.msg == "periodic_failed"]
    assert failure.__dict__["task"] == "flaky"


async def test_a_periodic_pass_survives_a_libraries_cancelled_error_but_not_a_cancel() -> None:
    async def stuck_bus() -> None:
        raise asyncio.CancelledError  # what aiormq raises for calls pending on a dead link

    task = Periodic("elect", 2.0, stuck_bus, after_error_s=0.5)
    assert await task.run_once() == 0.5  # an ordinary failure: the next pass comes

    started = asyncio.Event()

    async def slow() -> None:
        started.set()
        await asyncio.Event().wait()

    waiting = asyncio.create_task(Periodic("slow", 1.0, slow).run_once())
    await asyncio.wait_for(started.wait(), WAIT_S)
    waiting.cancel()  # a stop: the cancel goes through
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_a_periodic_pass_returns_its_next_delay_and_a_wake_cuts_it_short() -> None:
    passes: list[int] = []
    task: Periodic

    async def run() -> float:
        passes.append(len(passes))
        return 3600.0

    task = Periodic("spawn", 60.0, run, after_error_s=1.0)
    assert await task.run_once() == 3600.0
    halt = asyncio.Event()
    loop = asyncio.create_task(task.loop(halt))
    await wait_until(lambda: _true(len(passes) == 2), WAIT_S, "the second pass")
    task.wake.set()
    await wait_until(lambda: _true(len(passes) == 3), WAIT_S, "the woken pass")
    halt.set()
    await asyncio.wait_for(loop, WAIT_S)


async def test_services_run_their_periodic_tasks_until_stopped() -> None:
    ran = asyncio.Event()

    async def scan() -> None:
        ran.set()

    async with started([], periodic=[Periodic("scan", 0.01, scan)]) as running:
        await asyncio.wait_for(ran.wait(), WAIT_S)
        await running.finish()


class Probe:
    """A connected-or-not bus for readiness."""

    def __init__(self, connected: bool) -> None:
        self.connected = connected

    def ready(self) -> bool:
        return self.connected


@pytest.mark.parametrize(
    ("consuming", "connected", "ledger", "expected"),
    [
        (True, True, True, True),
        (False, True, True, False),
        (True, False, True, False),
        (True, True, False, False),
    ],
)
async def test_readiness_needs_consuming_the_bus_and_the_ledger(
    consuming: bool, connected: bool, ledger: bool, expected: bool
) -> None:
    async def ledger_ready() -> bool:
        return ledger

    readiness = Readiness(Probe(connected), ledger_ready)
    readiness.consuming = consuming
    assert await readiness() is expected


async def test_readiness_without_a_ledger_is_consuming_and_connected() -> None:
    readiness = Readiness(Probe(True), None)
    assert not await readiness()
    readiness.consuming = True
    assert await readiness()


SHIPPED = frozenset({"0001_core.sql", "0002_usage.sql", "0003_more.sql"})


class Applied:
    """A database whose recorded migrations the test moves; counts reads."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names: frozenset[str] | Exception = names
        self.reads = 0

    async def read(self) -> frozenset[str]:
        self.reads += 1
        if isinstance(self.names, Exception):
            raise self.names
        return self.names


async def test_the_schema_gate_rechecks_while_behind_and_caches_once_current() -> None:
    now = [0.0]
    applied = Applied(frozenset({"0001_core.sql"}))
    gate = SchemaGate(applied.read, expected=SHIPPED, recheck_s=1.0, clock=lambda: now[0])
    assert not await gate.current()
    applied.names = SHIPPED
    assert not await gate.current(), "a re-check came sooner than recheck_s"
    assert applied.reads == 1
    now[0] = 1.5
    assert await gate.current()
    applied.names = TransientError("database away")
    now[0] = 10.0
    assert await gate.current()
    assert applied.reads == 2


async def test_the_schema_gate_is_closed_while_the_database_is_away() -> None:
    applied = Applied(frozenset())
    applied.names = TransientError("database away")
    gate = SchemaGate(applied.read, expected=SHIPPED, recheck_s=0.0)
    assert not await gate.current()
    applied.names = SHIPPED | {"0004_newer.sql"}
    assert await gate.current(), "a database ahead of the code is current"


async def test_a_database_missing_an_earlier_migration_is_not_current() -> None:
    """A later number recorded does not stand for an earlier one never applied."""
    applied = Applied(frozenset({"0001_core.sql", "0003_more.sql", "0004_newer.sql"}))
    gate = SchemaGate(applied.read, expected=SHIPPED, recheck_s=0.0)
    assert not await gate.current()


def test_the_expected_migrations_are_the_files_shipped() -> None:
    assert migration_version("0004_security.sql") == 4
    assert {"0001_core.sql", "0004_security.sql"} <= expected_migrations()
