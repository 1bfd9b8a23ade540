"""The bus client given several broker addresses (a cluster's nodes): here two proxies in
front of the one real RabbitMQ, each standing for a node; the one in use going away is
a node lost (``make ha-check`` does it to a real three-node cluster)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aio_pika.abc import AbstractIncomingMessage

from relay_batches.bus.client import Bus
from relay_batches.bus.cluster import broker_addresses
from relay_batches.bus.topology import Names
from tests.helpers.faults import TcpProxy
from tests.helpers.support import AMQP_URL, Isolation, free_port, wait_until


@pytest.fixture
async def nodes() -> AsyncIterator[tuple[TcpProxy, TcpProxy]]:
    """Two started proxies to the broker."""
    first, second = TcpProxy("127.0.0.1", 5672), TcpProxy("127.0.0.1", 5672)
    await first.start()
    await second.start()
    try:
        yield first, second
    finally:
        await first.stop()
        await second.stop()


def _url(proxy: TcpProxy) -> str:
    return f"amqp://guest:guest@127.0.0.1:{proxy.port}/"


def test_a_list_of_addresses_is_split_on_commas() -> None:
    assert broker_addresses("amqp://a:1/, amqp://b:2/,") == ["amqp://a:1/", "amqp://b:2/"]
    assert broker_addresses(AMQP_URL) == [AMQP_URL]


async def test_a_bus_whose_node_goes_moves_to_the_other_and_keeps_consuming(
    iso: Isolation, nodes: tuple[TcpProxy, TcpProxy]
) -> None:
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def take(message: AbstractIncomingMessage) -> None:
        # The session's notify queue also carries other tests' job events: only ours count.
        if not message.body.startswith(b"{"):
            await received.put(message.body)
        await message.ack()

    bus = Bus(",".join(_url(p) for p in nodes), Names(iso.namespace), "bus-cluster-tests")
    await bus.connect()
    try:
        await bus.consume(bus.names.notify, take, prefetch=1)
        used = next(p for p in nodes if p.accepted)
        other = next(p for p in nodes if p is not used)
        async with used.outage() as cut:
            assert cut >= 1
            await wait_until(
                lambda: asyncio.sleep(0, other.accepted >= 1 and bus.ready()),
                30,
                "the bus back, through the other node",
            )
            await bus.publish(bus.names.notify, b"after the move", kind="test")
            assert await asyncio.wait_for(received.get(), 30) == b"after the move"
    finally:
        await bus.close()


async def test_a_bus_starts_while_one_of_its_nodes_is_down(
    iso: Isolation, nodes: tuple[TcpProxy, TcpProxy]
) -> None:
    down = f"amqp://guest:guest@127.0.0.1:{free_port()}/"  # nothing listens there
    for _ in range(4):  # the first address tried is drawn at random: both orders
        bus = Bus(f"{down},{_url(nodes[0])}", Names(iso.namespace), "bus-cluster-tests")
        await bus.connect()
        try:
            assert bus.ready()
        finally:
            await bus.close()
