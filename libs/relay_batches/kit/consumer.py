"""Consuming single deliveries: decode → handle → settle, each delivery in a task of
its own, held by the service's :class:`~relay_batches.kit.tasks.Tasks` so a stop can wait
for it and cancel it; and the interfaces every intake (this module's, and the chunked
one of :mod:`~relay_batches.kit.chunks`) starts on. How a delivery is settled is
:mod:`relay_batches.kit.settle`'s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import ChannelInvalidStateError

from relay_batches.bus.client import MessageCallback
from relay_batches.kit.settle import settle_one
from relay_batches.kit.tasks import Tasks
from relay_batches.messages import MessageError

log = logging.getLogger("relay.consumer")

T = TypeVar("T")

RETRY_PAUSE_S = 0.5
EVENTS_PREFETCH = 64


class Subscription(Protocol):
    """Consumers that can be cancelled and subscribed again."""

    async def cancel(self) -> None:
        """Cancel the consumers (their unacked deliveries stay unacked)."""

    async def resume(self) -> None:
        """Subscribe again."""


class ConsumingBus(Protocol):
    """What consuming needs of :class:`relay_batches.bus.client.Bus`."""

    async def consume(self, queue: str, callback: MessageCallback, prefetch: int) -> None:
        """Consume a durable queue with ``prefetch`` unacked."""

    async def consume_queues(
        self, queues: Sequence[str], callback: MessageCallback, prefetch: int
    ) -> Subscription:
        """Consume several durable queues on one channel, ``prefetch`` unacked each."""

    async def consume_events(
        self,
        routing_keys: Sequence[str],
        callback: MessageCallback,
        prefetch: int = EVENTS_PREFETCH,
    ) -> None:
        """Consume job events bound to ``routing_keys``."""


class Intake(Protocol):
    """Something a service takes work from."""

    async def start(self, bus: ConsumingBus, tasks: Tasks, halt: asyncio.Event) -> None:
        """Register the consumer; spawn its handlers (and loop) into ``tasks``."""


def _spawning(
    tasks: Tasks,
    kind: str,
    decode: Callable[[AbstractIncomingMessage], T],
    handle: Callable[[T], Awaitable[object]],
    retry_pause_s: float,
) -> MessageCallback:
    async def on_message(message: AbstractIncomingMessage) -> None:
        tasks.spawn(settle_one(message, kind, decode, handle, retry_pause_s), name=kind)

    return on_message


@dataclass(frozen=True)
class Consume(Generic[T]):
    """A durable queue: each delivery decoded by ``decode`` and given to ``handle``."""

    queue: str
    kind: str
    decode: Callable[[bytes], T]
    handle: Callable[[T], Awaitable[object]]
    prefetch: int
    retry_pause_s: float = RETRY_PAUSE_S

    async def start(self, bus: ConsumingBus, tasks: Tasks, halt: asyncio.Event) -> None:
        """Consume the queue."""

        def decode(message: AbstractIncomingMessage) -> T:
            return self.decode(message.body)

        callback = _spawning(tasks, self.kind, decode, self.handle, self.retry_pause_s)
        await bus.consume(self.queue, callback, self.prefetch)


@dataclass(frozen=True)
class Delivery(Generic[T]):
    """A decoded delivery and what the broker says of it: ``redelivered`` (it was
    delivered before, to a consumer that never settled it: one that died, or whose
    channel closed) and :meth:`open`."""

    value: T
    redelivered: bool
    is_open: Callable[[], bool]

    def open(self) -> bool:
        """Whether it can still be settled: once its channel closed (the connection
        dropped) the broker has put it back in the queue for any consumer, so work on
        it started now may be done twice."""
        return self.is_open()


def channel_open(message: AbstractIncomingMessage) -> bool:
    """Whether ``message``'s channel is still open (aio-pika's robust reconnect opens a
    new one; the delivery's stays closed)."""
    try:
        return not message.channel.is_closed
    except ChannelInvalidStateError:
        return False


@dataclass(frozen=True)
class ConsumeDeliveries(Generic[T]):
    """A durable queue, as :class:`Consume`, whose ``handle`` gets each decoded body as
    a :class:`Delivery`: a handler that pays for its work can tell a redelivery, and
    stop starting work on a delivery that can no longer be acked."""

    queue: str
    kind: str
    decode: Callable[[bytes], T]
    handle: Callable[[Delivery[T]], Awaitable[object]]
    prefetch: int
    retry_pause_s: float = RETRY_PAUSE_S

    async def start(self, bus: ConsumingBus, tasks: Tasks, halt: asyncio.Event) -> None:
        """Consume the queue."""

        def decode(message: AbstractIncomingMessage) -> Delivery[T]:
            value = self.decode(message.body)
            is_open = functools.partial(channel_open, message)
            return Delivery(value, bool(message.redelivered), is_open)

        callback = _spawning(tasks, self.kind, decode, self.handle, self.retry_pause_s)
        await bus.consume(self.queue, callback, self.prefetch)


@dataclass(frozen=True)
class Subscribe(Generic[T]):
    """Job events through a private queue: one handler per routing key."""

    handlers: Mapping[str, Callable[[T], Awaitable[object]]]
    decode: Callable[[bytes], T]
    kind: str = "event"
    prefetch: int = EVENTS_PREFETCH
    retry_pause_s: float = RETRY_PAUSE_S

    async def start(self, bus: ConsumingBus, tasks: Tasks, halt: asyncio.Event) -> None:
        """Bind a private queue to every routing key handled and consume it."""

        def decode(message: AbstractIncomingMessage) -> tuple[Callable[[T], Awaitable[object]], T]:
            handler = self.handlers.get(message.routing_key or "")
            if handler is None:
                raise MessageError(f"no handler for routing key {message.routing_key!r}")
            return handler, self.decode(message.body)

        async def handle(routed: tuple[Callable[[T], Awaitable[object]], T]) -> None:
            handler, value = routed
            await handler(value)

        callback = _spawning(tasks, self.kind, decode, handle, self.retry_pause_s)
        await bus.consume_events(list(self.handlers), callback, self.prefetch)
