"""The bus client against the real RabbitMQ: what a consumer leaves registered."""

from __future__ import annotations

from aio_pika.abc import AbstractIncomingMessage

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import EVENT_CANCELED, Names
from tests.helpers.support import AMQP_URL, Isolation


async def _ignore(message: AbstractIncomingMessage) -> None:
    await message.ack()


async def test_each_consumed_queue_is_held_once(iso: Isolation) -> None:
    # The bus keeps strong references so robust reconnects restore its queues; a queue
    # held twice would be restored (and its consumer re-registered) twice.
    bus = Bus(AMQP_URL, Names(iso.namespace), "bus-tests")
    await bus.connect()
    try:
        await bus.consume(bus.names.notify, _ignore, prefetch=1)
        await bus.consume_events([EVENT_CANCELED], _ignore, prefetch=1)
        held = [id(q) for q in bus._queues]
        assert len(held) == 2
        assert len(set(held)) == 2
    finally:
        await bus.close()
