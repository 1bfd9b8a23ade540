"""The bus client: one robust connection, a confirmed publisher and consumers.

After the broker restarts (or closes the connection), aio-pika reconnects and restores
every channel, queue, binding and consumer this bus declared; :meth:`Bus.ready` is
False from the moment the connection drops until that restore is complete. Given several
broker addresses (the nodes of a cluster), the connection moves to the next one when
its node goes (:mod:`relay_batches.bus.cluster`).

Settling deliveries (the ack policy) is :mod:`relay_batches.kit.settle`'s job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustChannel,
    AbstractRobustConnection,
)
from aio_pika.exceptions import AMQPError, ChannelInvalidStateError, ChannelNotFoundEntity
from aiormq.exceptions import ChannelLockedResource

from relay_batches.bus.cluster import connect_cluster
from relay_batches.bus.topology import (
    Names,
    check_shard_count,
    declare_all,
    declare_events,
    declare_queue,
    event_kind,
)
from relay_batches.metrics import MESSAGE_BYTES_PUBLISHED, MESSAGES_PUBLISHED
from relay_batches.reach import BROKER, reaching
from relay_batches.tracing import with_trace

log = logging.getLogger("relay.bus")

PUBLISH_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
CANCEL_TIMEOUT_S = 5.0  # for cancelling consumers, all of them at once
RECONNECT_INTERVAL_S = 2.0

MessageCallback = Callable[[AbstractIncomingMessage], Awaitable[None]]
SETTLE_ERRORS = (AMQPError, ChannelInvalidStateError, RuntimeError, ConnectionError)


class Bus:
    """A service's view of RabbitMQ: publish with confirms, consume with bounded prefetch."""

    def __init__(self, amqp_url: str, names: Names, service: str) -> None:
        self.names = names
        self._url = amqp_url
        self._service = service
        self._connection: AbstractRobustConnection | None = None
        self._publish_channel: AbstractChannel | None = None
        self._inspect_channel: AbstractRobustChannel | None = None  # passive declares only
        self._events: AbstractExchange | None = None
        # Strong references so robust reconnects restore them.
        self._consumer_channels: list[AbstractChannel] = []
        self._queues: list[AbstractQueue] = []
        self._consumers: list[tuple[AbstractQueue, str]] = []
        # Set when the connection drops, cleared once aio-pika restored every channel.
        self._restoring = False
        self._lost_callbacks: list[Callable[[], None]] = []
        # The exclusive queue this connection holds (leader election), with its channel.
        self._exclusive: tuple[AbstractChannel, AbstractQueue] | None = None

    async def connect(self) -> None:
        """Connect (robustly), open the publisher channel and declare the topology.

        The connection is named after the service (and carries the namespace), so an
        operator — or a test — can find and close exactly this service's connection. A
        broker that cannot be reached is :class:`~relay_batches.reach.Unreachable`.
        """
        async with reaching(BROKER, self._url):
            connection = await connect_cluster(
                self._url,
                timeout=CONNECT_TIMEOUT_S,
                reconnect_interval=RECONNECT_INTERVAL_S,
                client_properties={
                    "connection_name": self._service,
                    "relay_namespace": self.names.namespace,
                },
            )
        connection.close_callbacks.add(self._on_connection_lost)
        connection.reconnect_callbacks.add(self._on_reconnected)
        self._connection = connection
        try:
            await check_shard_count(connection, self.names)
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await declare_all(channel, self.names)
            self._events = await declare_events(channel, self.names)
        except BaseException:
            await self.close()  # a refused start leaves no connection (nor its callbacks)
            raise
        self._publish_channel = channel

    def on_connection_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (synchronously) each time the connection drops."""
        self._lost_callbacks.append(callback)

    def _on_connection_lost(self, _: object, exc: BaseException | None) -> None:
        self._exclusive = None  # the broker deletes an exclusive queue with its connection
        for callback in self._lost_callbacks:
            callback()
        if self._connection is not None and not self._restoring:
            self._restoring = True
            log.warning("broker_connection_lost", extra={"error": repr(exc)})

    def _on_reconnected(self, _: object) -> None:
        if self._restoring:
            self._restoring = False
            log.info("broker_reconnected", extra={"consumers": len(self._consumers)})

    def ready(self) -> bool:
        """True while connected with every channel (and so every consumer) restored."""
        conn = self._connection
        if conn is None or conn.is_closed or not conn.connected.is_set() or self._restoring:
            return False
        channels = [self._publish_channel, *self._consumer_channels]
        return all(ch is not None and not ch.is_closed for ch in channels)

    async def close(self) -> None:
        """Close the connection (channels and consumers with it)."""
        if self._connection is not None:
            connection, self._connection = self._connection, None
            await connection.close()

    async def publish(
        self,
        queue: str,
        body: bytes,
        *,
        kind: str,
        priority: int = 0,
        headers: Mapping[str, str] | None = None,
        persistent: bool = True,
        trace: str | None = None,
    ) -> None:
        """Publish a message (persistent unless told otherwise: a grant is worth nothing
        after a broker restart) to a durable queue and wait for the confirm. ``trace``:
        the W3C ``traceparent`` of the job the message is about (a traced job's), carried
        in its headers (the consumer's kit makes it current for the handler)."""
        channel = self._require_channel()
        mode = (
            aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT
        )
        if trace is not None:
            headers = with_trace(headers, trace)
        message = aio_pika.Message(
            body,
            headers=dict(headers) if headers else None,
            delivery_mode=mode,
            priority=priority,
            content_type="application/json",
        )
        await channel.default_exchange.publish(
            message, routing_key=queue, mandatory=True, timeout=PUBLISH_TIMEOUT_S
        )
        MESSAGES_PUBLISHED.labels(kind).inc()
        MESSAGE_BYTES_PUBLISHED.labels(kind).inc(len(body))

    async def publish_event(
        self, routing_key: str, body: bytes, *, trace: str | None = None
    ) -> None:
        """Publish a job event on the topic exchange and wait for the confirm (``trace``:
        as for :meth:`publish`).

        Events are not mandatory: nobody may be listening for progress right now.
        """
        self._require_channel()
        assert self._events is not None
        headers = with_trace(None, trace)
        message = aio_pika.Message(
            body,
            headers=dict(headers) if headers else None,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            content_type="application/json",
        )
        await self._events.publish(
            message, routing_key=routing_key, mandatory=False, timeout=PUBLISH_TIMEOUT_S
        )
        kind = event_kind(routing_key)
        MESSAGES_PUBLISHED.labels(kind).inc()
        MESSAGE_BYTES_PUBLISHED.labels(kind).inc(len(body))

    async def declare(self, queue: str) -> None:
        """Declare one of the namespace's queues (with its arguments) on the publisher
        channel: what a publisher does before publishing to a queue made on demand."""
        await declare_queue(self._require_channel(), self.names, queue)

    async def claim_exclusive(self, queue: str) -> bool:
        """Try to hold ``queue`` as an exclusive queue of this connection (leader
        election): True while held (now or from an earlier claim), False when another
        connection holds it. Declared on a channel of its own, not robust (a reconnect
        does not re-claim it: the caller tries again); the broker deletes it when this
        connection closes, however it dies."""
        if self._exclusive is not None and not self._exclusive[0].is_closed:
            return True
        if self._connection is None:
            raise RuntimeError("bus is not connected")
        channel = await self._connection.channel(publisher_confirms=False)
        try:
            declared = await channel.declare_queue(queue, exclusive=True, robust=False)
        except ChannelLockedResource:
            # RESOURCE_LOCKED closed the channel; closed by us too, or it reopens itself.
            with contextlib.suppress(*SETTLE_ERRORS):
                await channel.close()
            return False
        self._exclusive = (channel, declared)
        return True

    async def release_exclusive(self) -> None:
        """Delete the exclusive queue this connection holds (another may claim it)."""
        held, self._exclusive = self._exclusive, None
        if held is not None:
            channel, queue = held
            with contextlib.suppress(*SETTLE_ERRORS):
                await queue.delete(if_unused=False, if_empty=False)
                await channel.close()

    async def ready_count(self, queue: str) -> int:
        """Messages ready (not yet delivered) in one of the durable queues."""
        declared = await declare_queue(self._require_channel(), self.names, queue)
        return int(declared.declaration_result.message_count or 0)

    async def queue_states(self, queues: Iterable[str]) -> list[tuple[int, int]]:
        """``(ready messages, consumers)`` of each of ``queues``, by passive declares on a
        channel of their own: they check nothing of a queue's arguments (one declared
        with others cannot close the publisher channel), and a queue the broker does
        not have, which closes that channel, reads ``(0, 0)`` (nobody consumes it)."""
        states: list[tuple[int, int]] = []
        for queue in queues:
            channel = await self._inspector()
            try:
                declared = await channel.declare_queue(queue, passive=True, robust=False)
            except ChannelNotFoundEntity:
                # The broker closed the channel: not to be reopened, a fresh one next.
                self._inspect_channel = None
                with contextlib.suppress(*SETTLE_ERRORS):
                    await channel.close()
                states.append((0, 0))
                continue
            result = declared.declaration_result
            states.append((int(result.message_count or 0), int(result.consumer_count or 0)))
        return states

    async def _inspector(self) -> AbstractRobustChannel:
        channel = self._inspect_channel
        if channel is None or channel.is_closed:
            if self._connection is None:
                raise RuntimeError("bus is not connected")
            channel = await self._connection.channel(publisher_confirms=False)
            self._inspect_channel = channel
        return channel

    async def consume(self, queue: str, callback: MessageCallback, prefetch: int) -> None:
        """Consume a durable queue on a channel of its own with ``prefetch`` unacked."""
        channel = await self._new_consumer_channel(prefetch)
        declared = await declare_queue(channel, self.names, queue)
        await self._start(declared, callback)

    async def consume_queues(
        self,
        queues: Iterable[str],
        callback: MessageCallback,
        prefetch: int,
        *,
        intake: bool = True,
    ) -> Subscription:
        """Consume several durable queues on one channel, ``prefetch`` unacked for each
        consumer: their deliveries share the channel's delivery tags, so one
        ``multiple`` ack can settle deliveries of several of them. The returned
        :class:`Subscription` can cancel these consumers and subscribe them again.
        ``intake=False``: not work taken in, so :meth:`stop_consuming` leaves these
        consumers running (rate-limit grants, which rows in flight still need)."""
        channel = await self._new_consumer_channel(prefetch)
        declared = [await declare_queue(channel, self.names, queue) for queue in queues]
        subscription = Subscription(self, declared, callback, intake=intake)
        await subscription.resume()
        return subscription

    async def consume_events(
        self, routing_keys: Iterable[str], callback: MessageCallback, prefetch: int = 64
    ) -> None:
        """Consume job events through a private auto-delete queue bound to ``routing_keys``."""
        channel = await self._new_consumer_channel(prefetch)
        exchange = await declare_events(channel, self.names)
        name = self.names.private(self._service, aio_pika_id())
        declared = await channel.declare_queue(name, exclusive=True, auto_delete=True)
        for key in routing_keys:
            await declared.bind(exchange, key)
        await self._start(declared, callback)  # _start keeps the queue's strong reference

    async def _new_consumer_channel(self, prefetch: int) -> AbstractChannel:
        if self._connection is None:
            raise RuntimeError("bus is not connected")
        channel = await self._connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=prefetch)
        self._consumer_channels.append(channel)
        return channel

    async def _start(
        self, queue: AbstractQueue, callback: MessageCallback, intake: bool = True
    ) -> tuple[AbstractQueue, str]:
        if all(queue is not held for held in self._queues):
            self._queues.append(queue)
        consumer = (queue, await queue.consume(callback, no_ack=False))
        if intake:
            self._consumers.append(consumer)
        return consumer

    async def stop_consuming(self) -> None:
        """Cancel every consumer: no new deliveries; unacked ones stay ours to settle."""
        consumers, self._consumers = self._consumers, []
        if self._connection is None or self._connection.is_closed:
            return  # closed: the broker has cancelled them already (and no wait for a restore)
        await cancel_all(consumers)

    def _forget(self, consumers: Iterable[tuple[AbstractQueue, str]]) -> None:
        gone = set(consumers)
        self._consumers = [c for c in self._consumers if c not in gone]

    def _require_channel(self) -> AbstractChannel:
        if self._publish_channel is None:
            raise RuntimeError("bus is not connected")
        return self._publish_channel


class Subscription:
    """Consumers of several queues on one channel (:meth:`Bus.consume_queues`), which can
    be cancelled and subscribed again (to a single-active-consumer queue, a consumer
    that subscribes again waits behind the others)."""

    def __init__(
        self,
        bus: Bus,
        queues: list[AbstractQueue],
        callback: MessageCallback,
        *,
        intake: bool = True,
    ) -> None:
        self._bus = bus
        self._queues = queues
        self._callback = callback
        self._intake = intake
        self._consumers: list[tuple[AbstractQueue, str]] = []

    async def resume(self) -> None:
        """Subscribe every queue that has no consumer of ours (again): after a resume
        that failed part-way, calling it again adds only the missing ones."""
        held = {id(queue) for queue, _ in self._consumers}
        for queue in self._queues:
            if id(queue) not in held:
                self._consumers.append(await self._bus._start(queue, self._callback, self._intake))

    async def cancel(self) -> None:
        """Cancel these consumers: no new deliveries; those delivered stay unacked
        (the caller settles them) and a reconnect no longer restores the consumers."""
        consumers, self._consumers = self._consumers, []
        self._bus._forget(consumers)
        await cancel_all(consumers)


async def cancel_all(consumers: Iterable[tuple[AbstractQueue, str]]) -> None:
    """Cancel consumers concurrently, all within :data:`CANCEL_TIMEOUT_S` (one by one,
    during a reconnect, several would outlast the shutdown grace)."""
    cancels = [asyncio.ensure_future(queue.cancel(tag)) for queue, tag in consumers]
    if not cancels:
        return
    done, late = await asyncio.wait(cancels, timeout=CANCEL_TIMEOUT_S)
    for task in late:
        task.cancel()
    errors = [t.exception() for t in done if not t.cancelled() and t.exception() is not None]
    for exc in errors:
        log.warning("consumer_cancel_failed", extra={"error": repr(exc)})
    if late:
        log.warning("consumer_cancel_failed", extra={"error": f"{len(late)} timed out"})


def aio_pika_id() -> str:
    """A short random suffix for private queue names."""
    from relay_batches.ids import new_id

    return new_id()[:12]
