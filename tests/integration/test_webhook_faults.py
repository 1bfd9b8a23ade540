"""Webhook faults on the real servers: a database outage longer than the claim during a
delivery (with a second notifier taking over), and one workspace's hanging receiver
next to another workspace's healthy one."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import EVENT_FINISHED, Names
from relay_batches.ids import new_id
from relay_batches.kit.base import BusService
from relay_batches.ledger.deliveries import DeliveryStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.pool import create_pool
from relay_batches.ledger.schema import ledger_readiness
from relay_batches.messages import JobEvent
from relay_batches.model import JobStatus
from relay_batches.services.notifier import core, deferred
from relay_batches.services.notifier.core import deliver_webhook
from relay_batches.services.notifier.http import guarded_poster
from relay_batches.services.notifier.receivers import ReceiverGate
from relay_batches.services.notifier.recovery import recover_deliveries
from relay_batches.services.notifier.service import (
    NOTIFY_PREFETCH,
    RECEIVER_SLOTS,
    RECEIVER_WAITERS,
    WORKSPACE_OPEN,
    notifier_service,
)
from tests.helpers.faults import TcpProxy
from tests.helpers.receivers import Receiver, serving
from tests.helpers.support import (
    AMQP_URL,
    Isolation,
    create_isolation,
    drop_isolation,
    wait_until,
)

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
CLAIM_S = 2.0  # the notifiers' claim time here: the outage below lasts longer
HANGING = 100  # deliveries to the hanging receiver: more than the notifier's prefetch


async def new_batches(pool: asyncpg.Pool, workspace_name: str, url: str, n: int) -> list[str]:
    """``n`` one-row batches of a new workspace, each with webhook ``url``."""
    workspace = await KeyStore(pool).ensure_workspace(f"{workspace_name}-{new_id()[:6]}")
    jobs = JobStore(pool)
    made = []
    for _ in range(n):
        job = NewJob(new_id(), workspace, "hook", "gpt-4o-mini", 0, 1, url, None, None)
        batch = await jobs.create(job, iter([("c-0", '[{"role":"user","content":"hi"}]')]))
        made.append(batch.id)
    return made


async def delivery(pool: asyncpg.Pool, batch_id: str) -> tuple[str, int | None, int] | None:
    """``(status, status_code, claims)`` of a batch's delivery, or None."""
    row = await pool.fetchrow(
        "SELECT status, status_code, claims FROM webhook_deliveries WHERE batch_id = $1",
        batch_id,
    )
    return None if row is None else (row["status"], row["status_code"], row["claims"])


async def taking_over(store: DeliveryStore, post: core.Post, halt: asyncio.Event) -> int:
    """A second notifier's recovery loop, a pass every 0.1 s until ``halt``."""
    recovered = 0
    while not halt.is_set():
        recovered += await recover_deliveries(store, post)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(halt.wait(), 0.1)
    return recovered


async def test_a_database_outage_longer_than_the_claim_after_the_post_sends_it_once(
    pool: asyncpg.Pool, iso: Isolation, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core, "RECORD_RETRY_S", 0.2)
    proxy = TcpProxy("127.0.0.1", 5432)
    await proxy.start()
    cut_off = await create_pool(
        f"postgresql://postgres@127.0.0.1:{proxy.port}/{iso.database}", max_size=2
    )
    outage = contextlib.AsyncExitStack()
    posted = asyncio.Event()
    halt = asyncio.Event()
    post = guarded_poster(LOOPBACK, 5.0)
    try:
        async with serving(Receiver(on_post=[posted])) as receiver:
            (batch_id,) = await new_batches(pool, "outage", receiver.url, 1)
            event = JobEvent(batch_id, JobStatus.COMPLETED, 1, 1, 0)
            holder = DeliveryStore(cut_off, claim_s=CLAIM_S)
            taker = DeliveryStore(pool, claim_s=CLAIM_S)
            delivering = asyncio.create_task(deliver_webhook(event, holder, post))
            await asyncio.wait_for(posted.wait(), 30)
            # The receiver has the POST: cut the holder off its database before it records.
            await outage.enter_async_context(proxy.outage())
            second = asyncio.create_task(taking_over(taker, post, halt))

            async def marked_unknown() -> bool:
                return (await delivery(pool, batch_id) or ("",))[0] == "unknown"

            # The claim expired during the outage, and the second notifier saw it.
            await wait_until(marked_unknown, 30, "the expired claim to be marked unknown")
            assert await deliver_webhook(event, taker, post) == "already_delivered"
            await outage.aclose()
            assert await asyncio.wait_for(delivering, 60) == "delivered"
            halt.set()
            assert await asyncio.wait_for(second, 30) == 0
            assert receiver.ids == [f"msg_{batch_id}"]
            assert await delivery(pool, batch_id) == ("delivered", 204, 1)
    finally:
        halt.set()
        await outage.aclose()
        await cut_off.close()
        await proxy.stop()


async def test_a_claim_taken_over_before_its_post_is_posted_once_by_the_taker(
    pool: asyncpg.Pool, iso: Isolation
) -> None:
    # The holder claimed, then lost its database before marking ``posting``: the taker
    # POSTs, and the holder, back, finds its claim gone and POSTs nothing.
    async with serving(Receiver()) as receiver:
        (batch_id,) = await new_batches(pool, "before", receiver.url, 1)
        holder = DeliveryStore(pool, claim_s=CLAIM_S)
        taker = DeliveryStore(pool, claim_s=30)
        claim = await holder.claim(batch_id, receiver.url, f"msg_{batch_id}")
        assert claim is not None
        await pool.execute(
            "UPDATE webhook_deliveries SET claim_expires_at = now() - interval '1s'"
            " WHERE batch_id = $1",
            batch_id,
        )
        post = guarded_poster(LOOPBACK, 5.0)
        assert await recover_deliveries(taker, post) == 1
        assert not await holder.start_post(claim)
        assert receiver.ids == [f"msg_{batch_id}"]
        assert await delivery(pool, batch_id) == ("delivered", 204, 2)


@pytest.fixture
async def hooks_iso() -> AsyncIterator[Isolation]:
    """A database and namespace of this test's own: its notifier takes every
    ``job.finished`` of the namespace."""
    created = await create_isolation("hooks")
    yield created
    await drop_isolation(created)


@contextlib.asynccontextmanager
async def running_notifier(
    iso: Isolation,
) -> AsyncIterator[tuple[asyncpg.Pool, Bus, BusService]]:
    """The real notifier service on the real bus and ledger of ``iso`` (10 s webhook
    timeout, loopback receivers allowed); stopped and closed on leaving."""
    pool = await create_pool(iso.database_url, max_size=4)
    bus = Bus(AMQP_URL, Names(iso.namespace), "notifier-test")
    await bus.connect()
    stop = asyncio.Event()
    store = DeliveryStore(pool, claim_s=core.claim_seconds(10.0))
    service = notifier_service(
        bus,
        store,
        guarded_poster(LOOPBACK, 10.0),
        ledger_readiness(pool),
        recover_every_s=0.5,
        grace_s=2.0,
        receiver_wait_s=20.0,
    )
    running = asyncio.create_task(service.run(stop))
    try:
        yield pool, bus, service
    finally:
        stop.set()
        await asyncio.wait_for(running, 60)
        await bus.close()
        await pool.close()


async def test_a_hanging_receiver_delays_only_its_own_workspace(
    hooks_iso: Isolation,
) -> None:
    # More hanging deliveries than the notifier's prefetch: those beyond the receiver's
    # slots and waiters are deferred to the ledger, and each is delivered once later.
    assert HANGING > NOTIFY_PREFETCH
    async with running_notifier(hooks_iso) as (pool, bus, service):
        async with (
            serving(Receiver(hang=True)) as hanging,
            serving(Receiver()) as healthy,
        ):
            await wait_until(service.ready, 30, "the notifier to consume")
            slow = await new_batches(pool, "slow", hanging.url, HANGING)
            (fine,) = await new_batches(pool, "fine", healthy.url, 1)
            for batch_id in slow:
                await bus.publish_event(
                    EVENT_FINISHED, JobEvent(batch_id, JobStatus.COMPLETED, 1, 1, 0).encode()
                )

            async def slots_full() -> bool:
                return hanging.open_now == RECEIVER_SLOTS

            await wait_until(slots_full, 30, "the hanging receiver's slots to fill")
            sent = time.monotonic()
            await bus.publish_event(
                EVENT_FINISHED, JobEvent(fine, JobStatus.COMPLETED, 1, 1, 0).encode()
            )

            async def fine_delivered() -> bool:
                return (await delivery(pool, fine) or ("",))[0] == "delivered"

            await wait_until(fine_delivered, 30, "the healthy workspace's webhook")
            assert healthy.ids == [f"msg_{fine}"]
            # Delivered at once, not after the hanging POSTs time out (10 s).
            assert healthy.received_at[0] - sent < 3.0
            assert hanging.open_most == RECEIVER_SLOTS
            hanging.release.set()

            async def all_delivered() -> bool:
                done = await pool.fetchval(
                    "SELECT count(*) FROM webhook_deliveries"
                    " WHERE batch_id = ANY($1) AND status = 'delivered'",
                    slow,
                )
                return bool(done == HANGING)

            await wait_until(all_delivered, 120, "every deferred webhook to be delivered")
            assert sorted(hanging.ids) == sorted(f"msg_{b}" for b in slow)
            assert hanging.open_most == RECEIVER_SLOTS


async def test_one_workspace_with_many_hanging_receivers_leaves_room_for_others(
    hooks_iso: Isolation,
) -> None:
    # Six hanging receivers of one workspace could hold 6 × (slots + waiters) = 72 of
    # the 64 open deliveries; the workspace's cap keeps it to WORKSPACE_OPEN, deferring
    # the rest at once, so another workspace's webhook goes out without waiting.
    ports = 6
    assert ports * (RECEIVER_SLOTS + RECEIVER_WAITERS) >= NOTIFY_PREFETCH
    async with running_notifier(hooks_iso) as (pool, bus, service):
        async with contextlib.AsyncExitStack() as receivers:
            hanging = [
                await receivers.enter_async_context(serving(Receiver(hang=True)))
                for _ in range(ports)
            ]
            healthy = await receivers.enter_async_context(serving(Receiver()))
            await wait_until(service.ready, 30, "the notifier to consume")
            workspace = await KeyStore(pool).ensure_workspace(f"slow-{new_id()[:6]}")
            jobs = JobStore(pool)
            slow = []
            for n in range(ports * (RECEIVER_SLOTS + RECEIVER_WAITERS)):
                url = hanging[n % ports].url
                job = NewJob(new_id(), workspace, "hook", "gpt-4o-mini", 0, 1, url, None, None)
                batch = await jobs.create(job, iter([("c-0", '[{"role":"user","content":"hi"}]')]))
                slow.append(batch.id)
            (fine,) = await new_batches(pool, "fine", healthy.url, 1)
            for batch_id in slow:
                await bus.publish_event(
                    EVENT_FINISHED, JobEvent(batch_id, JobStatus.COMPLETED, 1, 1, 0).encode()
                )

            async def slow_ones_taken() -> bool:
                # Every slow event left the queue: open (holding the window) or deferred.
                return await bus.ready_count(bus.names.notify) == 0 and sum(
                    r.open_now for r in hanging
                ) == min(WORKSPACE_OPEN, ports * RECEIVER_SLOTS)

            await wait_until(slow_ones_taken, 30, "the slow workspace's events to be taken")
            sent = time.monotonic()
            await bus.publish_event(
                EVENT_FINISHED, JobEvent(fine, JobStatus.COMPLETED, 1, 1, 0).encode()
            )

            async def fine_delivered() -> bool:
                return (await delivery(pool, fine) or ("",))[0] == "delivered"

            await wait_until(fine_delivered, 30, "the healthy workspace's webhook", every=0.02)
            assert healthy.ids == [f"msg_{fine}"]
            # At once, not after the hanging POSTs time out (10 s).
            assert healthy.received_at[0] - sent < 2.0
            assert sum(r.open_most for r in hanging) <= WORKSPACE_OPEN
            for receiver in hanging:
                receiver.release.set()


async def defer_batches(pool: asyncpg.Pool, name: str, url: str, n: int) -> list[str]:
    """``n`` batches of a new workspace whose deliveries are deferred (as a notifier does
    when their receiver is busy)."""
    store = DeliveryStore(pool)
    made = await new_batches(pool, name, url, n)
    for batch_id in made:
        assert await store.defer(batch_id, url, f"msg_{batch_id}")
    return made


async def test_deferred_deliveries_of_busy_receivers_do_not_hide_the_others(
    hooks_iso: Isolation,
) -> None:
    # More busy receivers' deferred deliveries than one listing holds, all older than a
    # healthy receiver's: the deferred pass still reaches the healthy one.
    pool = await create_pool(hooks_iso.database_url, max_size=4)
    gate = ReceiverGate(RECEIVER_SLOTS, RECEIVER_WAITERS, 20.0, WORKSPACE_OPEN)
    store = DeliveryStore(pool, claim_s=core.claim_seconds(10.0))
    try:
        async with serving(Receiver()) as healthy:
            busy_receivers = deferred.DEFERRED_PASS // RECEIVER_SLOTS + 1
            for n in range(busy_receivers):
                # Another notifier task of ours holds every slot of these receivers.
                url = f"http://127.0.0.1:{40000 + n}/hook"
                first = (await defer_batches(pool, f"busy{n}", url, RECEIVER_SLOTS))[0]
                job = await store.job(first)
                assert job is not None
                for _ in range(RECEIVER_SLOTS):
                    assert gate.reserve(job.workspace_id, url) is not None
            (fine,) = await defer_batches(pool, "fine", healthy.url, 1)
            post = guarded_poster(LOOPBACK, 10.0)
            async with asyncio.timeout(30):
                assert await deferred.deliver_deferred(store, post, gate) == 1
            assert healthy.ids == [f"msg_{fine}"]
            assert await delivery(pool, fine) == ("delivered", 204, 1)
    finally:
        await pool.close()


async def test_a_hanging_deferred_post_does_not_hold_up_the_others(
    hooks_iso: Isolation,
) -> None:
    # While one deferred POST hangs, deliveries deferred meanwhile to another receiver go
    # out within the pass, not after the hanging one's timeout.
    pool = await create_pool(hooks_iso.database_url, max_size=4)
    gate = ReceiverGate(RECEIVER_SLOTS, RECEIVER_WAITERS, 20.0, WORKSPACE_OPEN)
    store = DeliveryStore(pool, claim_s=core.claim_seconds(10.0))
    try:
        async with serving(Receiver(hang=True)) as hanging, serving(Receiver()) as healthy:
            await defer_batches(pool, "slow", hanging.url, 1)
            post = guarded_poster(LOOPBACK, 10.0)
            passing = asyncio.create_task(deferred.deliver_deferred(store, post, gate))

            async def hanging_open() -> bool:
                return hanging.open_now == 1

            await wait_until(hanging_open, 10, "the hanging POST to start")
            (fine,) = await defer_batches(pool, "fine", healthy.url, 1)
            sent = time.monotonic()

            async def fine_delivered() -> bool:
                return (await delivery(pool, fine) or ("",))[0] == "delivered"

            await wait_until(fine_delivered, 30, "the healthy deferred webhook", every=0.02)
            assert healthy.received_at[0] - sent < 3.0
            assert not passing.done()
            hanging.release.set()
            async with asyncio.timeout(30):
                assert await passing == 2
    finally:
        await pool.close()
