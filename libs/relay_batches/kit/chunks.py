"""Chunked consuming: a queue (or several on one channel) taken a chunk at a
time by one loop, in delivery order; the chunk's messages settled together
(:func:`~relay_batches.kit.settle.settle_chunk`), unstorable ones dead-lettered, and a
consumer that keeps failing steps aside for a while (see :mod:`relay_batches.kit.settle`
for the policy)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from aio_pika.abc import AbstractIncomingMessage

from relay_batches.bus.client import SETTLE_ERRORS
from relay_batches.errors import UnstorableError
from relay_batches.kit.consumer import ConsumingBus, Subscription
from relay_batches.kit.pace import ChunkPace
from relay_batches.kit.settle import elapsed_ms, reject, settle_chunk
from relay_batches.kit.tasks import Tasks
from relay_batches.messages import MessageError
from relay_batches.metrics import MESSAGES_CONSUMED, MESSAGES_DEAD_LETTERED

log = logging.getLogger("relay.consumer")

T = TypeVar("T")


FAIL_LIMIT = 3  # chunks failed in a row before a chunked consumer steps aside
STEP_ASIDE_S = 10.0  # how long it stays away at most
RECHECK_S = 1.0  # how often it asks ``recovered`` meanwhile


@dataclass(frozen=True)
class DeadLetter:
    """Where a chunked queue's unstorable messages go: ``publish(body, reason)`` publishes
    to ``queue`` and returns once the broker confirmed."""

    queue: str
    publish: Callable[[bytes, str], Awaitable[None]]


@dataclass(frozen=True)
class ConsumeChunks(Generic[T]):
    """A durable queue (and ``also_queues``, on the same channel) taken in chunks: what
    arrives within a linger of a chunk's first message, up to a size in messages and
    ``chunk_bytes`` of bodies (a single larger message is a chunk alone), is decoded and
    handled as one list. The size starts at ``chunk`` and grows up to ``chunk_max`` under
    load, the linger stays between 1 ms and ``linger_s`` (:class:`ChunkPace`). With
    several queues, ``prefetch`` is shared out: each consumer holds ``prefetch / n``
    (rounded up) but never fewer than ``chunk``, so one busy queue can still fill a
    chunk; what is held is at most ``n × max(prefetch / n, chunk)`` messages. A chunk
    stops lingering once every consumer with deliveries unsettled is at its prefetch
    (:class:`ChunkInbox`), and the size never grows past what the consumers that
    delivered the last chunk may hold together. After :data:`FAIL_LIMIT` failed chunks
    in a row the consumers step aside (module doc) for up to ``step_aside_s``, or until
    ``recovered`` passes."""

    queue: str
    kind: str
    decode: Callable[[bytes], T]
    handle: Callable[[list[T]], Awaitable[object]]
    prefetch: int
    chunk: int
    linger_s: float
    retry_pause_s: float = 1.0
    dead_letter: DeadLetter | None = None
    chunk_bytes: int = 16 * 1024 * 1024
    chunk_max: int = 0  # 0: ``chunk``, a fixed size
    also_queues: tuple[str, ...] = ()
    fail_limit: int = FAIL_LIMIT
    step_aside_s: float = STEP_ASIDE_S
    recovered: Callable[[], Awaitable[bool]] | None = None

    def prefetch_each(self) -> int:
        """Each consumer's prefetch: a share of ``prefetch``, at least ``chunk``."""
        return max(math.ceil(self.prefetch / (1 + len(self.also_queues))), self.chunk)

    async def start(self, bus: ConsumingBus, tasks: Tasks, halt: asyncio.Event) -> None:
        """Consume the queues into an inbox and take chunks from it until ``halt``."""
        queues = (self.queue, *self.also_queues)
        each = self.prefetch_each()
        inbox = ChunkInbox(prefetch=each, consumers=len(queues))
        subscription = await bus.consume_queues(queues, inbox.put, each)
        pace = ChunkPace(self.chunk, self.chunk_max or self.chunk, self.linger_s)
        loop = self._take(inbox, pace, subscription, halt, each)
        tasks.spawn(loop, name=f"{self.kind}-chunks", loop=True)

    async def _take(
        self,
        inbox: ChunkInbox,
        pace: ChunkPace,
        subscription: Subscription,
        halt: asyncio.Event,
        each: int,
    ) -> None:
        failures = 0
        while not halt.is_set():
            chunk = await inbox.next_chunk(halt, pace.size, self.chunk_bytes, pace.linger)
            if not chunk:
                continue
            started = time.perf_counter()
            if await self.settle(chunk):
                failures = 0
                elapsed = time.perf_counter() - started
                # What the consumers that delivered it may hold together.
                ceiling = each * len({message.consumer_tag for message in chunk})
                pace.observe(len(chunk), inbox.waiting(), elapsed, ceiling)
                continue
            # The requeued chunk comes back as a full backlog: no reason to grow; and a
            # chunk that failed because of its size must not be retried larger.
            pace.reset()
            failures += 1
            if failures >= self.fail_limit:
                await self._step_aside(inbox, subscription, halt, failures)
                failures = 0

    async def _step_aside(
        self, inbox: ChunkInbox, subscription: Subscription, halt: asyncio.Event, failures: int
    ) -> None:
        """Cancel the consumers and requeue what is held, so another consumer of the
        queues takes them; subscribe again after a while (unless halted)."""
        log.warning(
            "consumers_stepping_aside",
            extra={"kind": self.kind, "failures": failures, "pause_s": self.step_aside_s},
        )
        await subscription.cancel()
        await _requeue_all(inbox)
        await self._wait_recovered(halt)
        if halt.is_set():
            return  # the drain follows: the channel's close requeues the rest
        await _requeue_all(inbox)  # anything delivered just before the cancel took effect
        while True:
            try:
                await subscription.resume()
                break
            except SETTLE_ERRORS as exc:  # the broker is away: again shortly, not a crash
                log.warning(
                    "consumers_resume_failed", extra={"kind": self.kind, "error": repr(exc)}
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(halt.wait(), RECHECK_S)
            if halt.is_set():
                break
        if halt.is_set():
            await subscription.cancel()  # resumed as the drain began: hand the queues back
            return
        log.info("consumers_resumed", extra={"kind": self.kind})

    async def _wait_recovered(self, halt: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + self.step_aside_s
        while (remaining := until - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(halt.wait(), min(RECHECK_S, remaining))
            if halt.is_set():
                return
            if self.recovered is not None and await self._passes(self.recovered):
                return

    async def _passes(self, check: Callable[[], Awaitable[bool]]) -> bool:
        try:
            return await check()
        except Exception as exc:
            log.warning("recovery_check_failed", extra={"kind": self.kind, "error": repr(exc)})
            return False

    async def settle(self, chunk: Sequence[AbstractIncomingMessage]) -> bool:
        """Decode, handle and settle one chunk by the policy of the module doc; whether
        it was recorded (False: it failed and was requeued)."""
        MESSAGES_CONSUMED.labels(self.kind).inc(len(chunk))
        values: list[T] = []
        decoded: list[int] = []  # each value's position in the chunk
        bad: set[int] = set()
        for position, message in enumerate(chunk):
            try:
                values.append(self.decode(message.body))
                decoded.append(position)
            except MessageError as exc:
                log.error("message_rejected", extra={"kind": self.kind, "error": str(exc)})
                bad.add(position)
        started = time.perf_counter()
        try:
            await self._handle(chunk, values, decoded)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error(
                "chunk_failed",
                extra={"kind": self.kind, "messages": len(chunk), "error": repr(exc)},
            )
            await asyncio.sleep(self.retry_pause_s)
            for message in chunk:
                await reject(message, requeue=True)
            return False
        await settle_chunk(chunk, bad)
        log.debug(
            "chunk_done",
            extra={"kind": self.kind, "messages": len(chunk), "elapsed_ms": elapsed_ms(started)},
        )
        return True

    async def _handle(
        self, chunk: Sequence[AbstractIncomingMessage], values: list[T], decoded: list[int]
    ) -> None:
        """Handle the values; dead-letter the messages the handler can never store."""
        try:
            await self.handle(values)
        except UnstorableError as exc:
            if self.dead_letter is None:
                raise
            for index in sorted(exc.positions):
                await self._dead_letter(self.dead_letter, chunk[decoded[index]], exc.reason)

    async def _dead_letter(
        self, dead_letter: DeadLetter, message: AbstractIncomingMessage, reason: str
    ) -> None:
        await dead_letter.publish(message.body, reason)
        MESSAGES_DEAD_LETTERED.labels(dead_letter.queue).inc()
        log.error(
            "message_dead_lettered",
            extra={"kind": self.kind, "queue": dead_letter.queue, "error": reason},
        )


async def _requeue_all(inbox: ChunkInbox) -> None:
    for message in inbox.take_all():
        await reject(message, requeue=True)


class ChunkInbox:
    """Deliveries waiting to be taken in chunks, in delivery order. A delivery that would
    have taken a chunk over its byte budget waits at the front for the next chunk.

    ``prefetch``: how many unsettled deliveries each of the channel's ``consumers`` may
    hold (the channel delivers no more for a consumer at its prefetch until we settle).
    The chunk being taken and the inbox are all that is unsettled (a chunk is settled
    before the next is taken), so a chunk stops lingering, and closes with what it has,
    once every consumer with a delivery in the chunk or the inbox holds its prefetch:
    those busy consumers can deliver nothing more before the ack. A consumer that has
    delivered nothing is taken as quiet (its queue is idle): it is not waited for, and
    what it delivers later starts the next chunk. So with one busy shard, a chunk
    closes at that shard's prefetch at once; while some busy consumer is below its
    prefetch, the chunk lingers as before. Every consumer at its prefetch (the inbox
    and the chunk holding ``prefetch × consumers``) is the special case of the same
    rule. A delivery without a consumer tag is counted against the whole channel's
    ``prefetch × consumers``. Without ``prefetch``, a chunk always lingers."""

    def __init__(self, prefetch: int | None = None, consumers: int = 1) -> None:
        self._queue: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self._held: AbstractIncomingMessage | None = None
        self._prefetch = prefetch
        self._capacity = None if prefetch is None else prefetch * consumers
        self._waiting_by: Counter[str | None] = Counter()  # queue and held, per consumer

    async def put(self, message: AbstractIncomingMessage) -> None:
        """Take a delivery in (the consumer callback)."""
        self._queue.put_nowait(message)
        self._waiting_by[message.consumer_tag] += 1

    def waiting(self) -> int:
        """Deliveries in the inbox, not yet taken into a chunk."""
        return self._queue.qsize() + (self._held is not None)

    def take_all(self) -> list[AbstractIncomingMessage]:
        """Empty the inbox: every delivery waiting, in delivery order."""
        taken = [self._held] if self._held is not None else []
        self._held = None
        while not self._queue.empty():
            taken.append(self._queue.get_nowait())
        self._waiting_by.clear()
        return taken

    async def next_chunk(
        self, halt: asyncio.Event, size: int, max_bytes: int, linger_s: float
    ) -> list[AbstractIncomingMessage]:
        """Wait for a first message (or ``halt``: then ``[]``), then take what arrives
        within ``linger_s`` of it, up to ``size`` messages and ``max_bytes`` of bodies
        (no waiting once nothing more can arrive from the busy consumers: class doc)."""
        first = self._held or await self._first(halt)
        self._held = None
        if first is None:
            return []
        chunk, total = [first], len(first.body)
        by_consumer: Counter[str | None] = Counter()
        self._into(by_consumer, first)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + linger_s
        while len(chunk) < size:
            blocked = self._queue.empty() and self._nothing_more(by_consumer)
            message = await self._next(0.0 if blocked else deadline - loop.time())
            if message is None:
                break
            if total + len(message.body) > max_bytes:
                self._held = message
                break
            chunk.append(message)
            self._into(by_consumer, message)
            total += len(message.body)
        return chunk

    def _into(self, by_consumer: Counter[str | None], message: AbstractIncomingMessage) -> None:
        """Count ``message`` as in the chunk, no longer in the inbox."""
        tag = message.consumer_tag
        by_consumer[tag] += 1
        self._waiting_by[tag] -= 1
        if self._waiting_by[tag] <= 0:
            del self._waiting_by[tag]

    def _nothing_more(self, by_consumer: Counter[str | None]) -> bool:
        """Whether every consumer with a delivery unsettled holds its prefetch."""
        if self._prefetch is None or self._capacity is None:
            return False
        if sum(by_consumer.values()) + self.waiting() >= self._capacity:
            return True
        for tag in by_consumer.keys() | self._waiting_by.keys():
            limit = self._capacity if tag is None else self._prefetch
            if by_consumer[tag] + self._waiting_by[tag] < limit:
                return False
        return True

    async def _first(self, halt: asyncio.Event) -> AbstractIncomingMessage | None:
        getter = asyncio.ensure_future(self._queue.get())
        halted = asyncio.ensure_future(halt.wait())
        await asyncio.wait({getter, halted}, return_when=asyncio.FIRST_COMPLETED)
        halted.cancel()
        if not getter.done():
            getter.cancel()
            return None
        return getter.result()

    async def _next(self, remaining: float) -> AbstractIncomingMessage | None:
        if not self._queue.empty():
            return self._queue.get_nowait()
        if remaining <= 0:
            return None
        try:
            return await asyncio.wait_for(self._queue.get(), remaining)
        except TimeoutError:
            return None
