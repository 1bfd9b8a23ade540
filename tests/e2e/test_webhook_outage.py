"""A database outage longer than the webhook claim, end to end: two notifier processes,
the first cut off from Postgres (through a proxy of this test's own) right after its
POST reached the receiver; the second takes over expired claims meanwhile. The receiver
gets the webhook once and the delivery ends ``delivered``."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp
import asyncpg

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import EVENT_FINISHED, Names
from relay_batches.ids import new_id
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.messages import JobEvent
from relay_batches.model import JobStatus
from relay_batches.services.notifier.core import claim_seconds
from tests.helpers.faults import TcpProxy
from tests.helpers.processes import build_system
from tests.helpers.receivers import Receiver, serving
from tests.helpers.support import AMQP_URL, create_isolation, drop_isolation, wait_until

WEBHOOK_TIMEOUT_S = 1.0  # the shortest claim: 2 × this + the margin


async def delivery_status(pool: asyncpg.Pool, batch_id: str) -> str | None:
    """The status of ``batch_id``'s webhook delivery."""
    return await pool.fetchval(
        "SELECT status FROM webhook_deliveries WHERE batch_id = $1", batch_id
    )


async def test_a_notifier_cut_off_from_the_database_after_its_post_sends_it_once(
    output_dir: Path, http: aiohttp.ClientSession
) -> None:
    iso = await create_isolation("hookout")
    proxy = TcpProxy("127.0.0.1", 5432)
    await proxy.start()
    system = build_system(
        iso, output_dir / "e2e-webhook-outage", RELAY_WEBHOOK_TIMEOUT_S=str(WEBHOOK_TIMEOUT_S)
    )
    cut_off = system.add(
        "notifier",
        RELAY_DATABASE_URL=f"postgresql://postgres@127.0.0.1:{proxy.port}/{iso.database}",
    )
    second = system.add("notifier#2")
    pool = await asyncpg.create_pool(iso.database_url, min_size=1, max_size=2)
    bus = Bus(AMQP_URL, Names(iso.namespace), "webhook-outage-test")
    outage = contextlib.AsyncExitStack()
    posted = asyncio.Event()
    try:
        await bus.connect()
        cut_off.start()
        await cut_off.wait_ready(http)
        async with serving(Receiver(on_post=[posted])) as receiver:
            workspace = await KeyStore(pool).ensure_workspace("hook-outage")
            batch = await JobStore(pool).create(
                NewJob(new_id(), workspace, "hook", "gpt-4o-mini", 0, 1, receiver.url, None, None),
                iter([("c-0", '[{"role":"user","content":"hi"}]')]),
            )
            event = JobEvent(batch.id, JobStatus.COMPLETED, 1, 1, 0)
            await bus.publish_event(EVENT_FINISHED, event.encode())
            await asyncio.wait_for(posted.wait(), 60)
            # The POST is at the receiver: cut the first notifier off before it records.
            await outage.enter_async_context(proxy.outage())
            second.start()
            await second.wait_ready(http)

            async def unknown() -> bool:
                return await delivery_status(pool, batch.id) == "unknown"

            # The claim expired during the outage and the second notifier saw it.
            claim_s = claim_seconds(WEBHOOK_TIMEOUT_S)
            await wait_until(unknown, claim_s + 30, "the expired claim to be marked unknown")
            await outage.aclose()

            async def delivered() -> bool:
                return await delivery_status(pool, batch.id) == "delivered"

            await wait_until(delivered, 60, "the first notifier to record the delivery")
            assert receiver.ids == [f"msg_{batch.id}"]
        codes = await asyncio.to_thread(lambda: {"a": cut_off.stop(), "b": second.stop()})
        assert codes == {"a": 0, "b": 0}
    finally:
        await outage.aclose()
        for process in (cut_off, second):
            await asyncio.to_thread(process.stop)
        await bus.close()
        await pool.close()
        await proxy.stop()
        await drop_isolation(iso)
