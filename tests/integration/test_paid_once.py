"""Paying once against the real servers: a delivery whose channel closed says so and
comes back flagged redelivered; the ledger says which rows of a slice have an outcome."""

from __future__ import annotations

import asyncio

import asyncpg

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import Names
from relay_batches.ids import new_id
from relay_batches.kit.consumer import ConsumeDeliveries, Delivery
from relay_batches.kit.tasks import Tasks
from relay_batches.ledger.answered import answered_rows
from relay_batches.messages import DecodedSlice, SliceMessage, SliceRow
from tests.helpers.faults import close_broker_connections
from tests.helpers.support import AMQP_URL, create_isolation, drop_isolation

WAIT_S = 30.0


async def test_a_delivery_whose_connection_dropped_is_closed_and_comes_back_redelivered() -> None:
    # A namespace of its own: the connection closed is only this test's.
    own = await create_isolation("drop", migrated=False)
    namespace = own.namespace
    bus = Bus(AMQP_URL, Names(namespace), "deliveries-test")
    await bus.connect()
    deliveries: asyncio.Queue[Delivery[DecodedSlice]] = asyncio.Queue()
    release = asyncio.Event()

    async def handle(delivery: Delivery[DecodedSlice]) -> None:
        await deliveries.put(delivery)
        await release.wait()

    tasks = Tasks()
    try:
        intake = ConsumeDeliveries(bus.names.rows, "rows", SliceMessage.decode, handle, 1)
        await intake.start(bus, tasks, asyncio.Event())
        await bus.publish(
            bus.names.rows, SliceMessage("b", "m", (SliceRow(0, "[]"),)).encode(), kind="rows"
        )
        first = await asyncio.wait_for(deliveries.get(), WAIT_S)
        assert (first.redelivered, first.open()) == (False, True)
        assert await close_broker_connections(namespace)
        again = await asyncio.wait_for(deliveries.get(), WAIT_S)  # after the reconnect
        assert first.open() is False, "the first delivery can no longer be settled"
        assert (again.redelivered, again.open()) == (True, True)
        assert again.value.batch_id == "b"
        release.set()
        assert not await tasks.wait(WAIT_S)
    finally:
        await bus.close()
        await drop_isolation(own)


async def test_the_ledger_names_the_rows_of_a_slice_that_have_an_outcome(
    pool: asyncpg.Pool,
) -> None:
    batch_id = new_id()
    await pool.executemany(
        "INSERT INTO row_results (batch_id, row_index, content, attempts) VALUES ($1, $2, 'x', 1)",
        [(batch_id, 3), (batch_id, 5), (batch_id, 70)],
    )
    assert await answered_rows(pool, batch_id, range(64)) == {3, 5}
    assert await answered_rows(pool, batch_id, []) == set()
    assert await answered_rows(pool, new_id(), [3]) == set()
