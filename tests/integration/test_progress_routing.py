"""Progress and windows of real dispatcher services on the real broker and ledger: a job's
progress reaches only the dispatcher that owns it, the aggregator's recording is what
stall recovery reads from the ledger, and a big fleet's heartbeats grow the window."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aio_pika
import asyncpg

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import EVENT_HOLDING, EVENT_PROGRESS, Names
from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.messages import HoldingReport, JobEvent, RowOutcome, SliceMessage
from relay_batches.model import JobStatus
from relay_batches.services.aggregator.core import Aggregator
from relay_batches.services.dispatcher.__main__ import results_state
from relay_batches.services.dispatcher.core import DispatchConfig, Dispatcher
from relay_batches.services.dispatcher.recording import ResultsQueues
from relay_batches.services.dispatcher.service import dispatcher_service
from tests.helpers.support import AMQP_URL, Isolation, drop_names, wait_until


class Watched(Dispatcher):
    """A real dispatcher that notes the progress events it receives and the rows it
    releases (its publishes are recorded, not sent)."""

    def __init__(self, pool: asyncpg.Pool, config: DispatchConfig) -> None:
        super().__init__(DispatchStore(pool), self._publish, self._announce, bool, config)
        self.seen: list[str] = []
        self.tasks: list[SliceMessage] = []

    async def _publish(self, task: SliceMessage, level: int) -> None:
        self.tasks.append(task)

    async def _announce(self, event: JobEvent) -> None:
        raise AssertionError(f"unexpected job failure {event}")

    async def on_progress(self, event: JobEvent) -> None:
        self.seen.append(event.batch_id)
        await super().on_progress(event)

    def rows(self, batch_id: str) -> list[int]:
        return [r.index for t in self.tasks if t.batch_id == batch_id for r in t.rows]


@contextlib.asynccontextmanager
async def serving(iso: Isolation, dispatcher: Dispatcher) -> AsyncIterator[None]:
    """``dispatcher`` as a service on a bus of its own (no reconcile pass in the test)."""
    bus = Bus(AMQP_URL, Names(iso.namespace), dispatcher.owner)
    await bus.connect()

    async def ledger_ready() -> bool:
        return True

    service = dispatcher_service(bus, dispatcher, ledger_ready, reconcile_s=3600, grace_s=5)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        await wait_until(service.ready, 10, f"{dispatcher.owner} to consume")
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await bus.close()


async def heartbeat(bus: Bus, dispatcher: Dispatcher, report: HoldingReport) -> None:
    """Publish a row-worker heartbeat through the broker as row-workers do, and wait until
    ``dispatcher`` counts the concurrency it reports."""
    await bus.publish_event(EVENT_HOLDING, report.encode())

    async def seen() -> bool:
        return dispatcher.inflight.concurrency() == report.concurrency

    await wait_until(seen, 10, "the fleet's heartbeat")


async def queued_job(pool: asyncpg.Pool, total: int) -> str:
    """A queued job of ``total`` small rows in a workspace of its own."""
    workspace = await KeyStore(pool).ensure_workspace(f"route-{new_id()[:6]}")
    batch = await JobStore(pool).create(
        NewJob(new_id(), workspace, "route", "gpt-4o-mini", 0, total, None, None, None),
        ((f"c-{i}", f'[{{"role":"user","content":"row {i}"}}]') for i in range(total)),
    )
    return batch.id


def config(owner: str, window: int = 20, **extra: int) -> DispatchConfig:
    """Windows of ``window`` rows, slices of 4."""
    return DispatchConfig(owner, window, 4, 1000, lease_s=30, **extra)


async def test_progress_reaches_only_the_dispatcher_that_owns_the_job(
    pool: asyncpg.Pool, bus: Bus, iso: Isolation
) -> None:
    batch_id = await queued_job(pool, 100)
    owner = Watched(pool, config(f"dispatcher-{new_id()[:8]}"))
    other = Watched(pool, config(f"dispatcher-{new_id()[:8]}"))
    await owner.claim()
    assert owner.rows(batch_id) == list(range(20))
    async with serving(iso, owner), serving(iso, other):
        aggregator = Aggregator(OutcomeStore(pool), bus.publish_event)
        await aggregator.record([RowOutcome(batch_id, i, "ok", None, 1) for i in range(10)])

        async def topped_up() -> bool:
            return owner.rows(batch_id) == list(range(28))

        await wait_until(topped_up, 10, "the owner to top the window up on its progress")
        # A broadcast after the aggregator's event (same channel, so it arrives after it
        # wherever both are routed): once the other dispatcher has it, it had the job's
        # progress too if it had been routed there.
        sentinel = JobEvent(f"sentinel-{new_id()[:6]}", JobStatus.RUNNING, 1, 0, 0)
        await bus.publish_event(EVENT_PROGRESS, sentinel.encode())

        async def both_saw_the_broadcast() -> bool:
            return sentinel.batch_id in other.seen and sentinel.batch_id in owner.seen

        await wait_until(both_saw_the_broadcast, 10, "the broadcast to reach both")
        assert other.seen == [sentinel.batch_id], "no progress of a job it does not own"
        assert owner.seen == [batch_id, sentinel.batch_id]
        assert other.rows(batch_id) == []


async def test_only_the_aggregator_recording_moves_what_stall_recovery_reads(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await queued_job(pool, 10)
    store = DispatchStore(pool)
    owner = f"dispatcher-{new_id()[:8]}"
    await store.claim_queued(owner, 1000, 30)
    await store.claim_stalled(owner, [batch_id], 0.0)  # restarts the stall clock only
    assert await pool.fetchval("SELECT recorded_at FROM batches WHERE id = $1", batch_id) is None

    await OutcomeStore(pool).record([RowOutcome(batch_id, 0, "ok", None, 1)])
    recorded = await pool.fetchval(
        "SELECT extract(epoch FROM now() - recorded_at) FROM batches WHERE id = $1", batch_id
    )
    assert recorded is not None and float(recorded) < 5
    silences = await store.recording_silences()  # every running job with an outcome
    assert silences[batch_id] < 5


async def test_a_big_fleet_grows_the_window_of_one_job_beyond_the_base(
    pool: asyncpg.Pool, bus: Bus, iso: Isolation
) -> None:
    dispatcher = Watched(
        pool,
        config(f"dispatcher-{new_id()[:8]}", window=64, window_max=4096, window_max_bytes=1 << 30),
    )
    async with serving(iso, dispatcher):
        # Row-workers running 1,000 rows at once report through the broker, as row-workers do.
        await heartbeat(bus, dispatcher, HoldingReport(f"fleet-{new_id()[:6]}", 60.0, (), (), 1000))
        batch_id = await queued_job(pool, 5000)
        await dispatcher.claim()
        upto = await pool.fetchval("SELECT dispatched_upto FROM batches WHERE id = $1", batch_id)
        # A window of 2 x 1,000 rows, not 64 (split with the workspace of any job other
        # tests left for a dispatcher to take over): filled in releases of a few slices
        # while at least a quarter of it is free (the rest goes as outcomes come back).
        # (At least the base window, however many workspaces such jobs add.)
        share = max(64, 2000 // len({o.job.workspace_id for o in dispatcher.jobs.values()}))
        assert share * 3 // 4 <= upto <= share
        assert dispatcher.rows(batch_id) == list(range(upto))


async def test_a_big_fleet_grows_one_window_per_dispatcher_that_its_workspaces_share(
    pool: asyncpg.Pool, bus: Bus, iso: Isolation
) -> None:
    """Workers running 900 rows at once take slices of two dispatchers: each may hold
    2 x 900 / 2 rows in the broker, split by the workspaces it releases for (not twice
    the fleet per workspace: three of them would put 3 x 1,024 rows in the broker)."""
    names = Names(f"{iso.namespace}win")
    rows_bus = Bus(AMQP_URL, names, "window-rows")
    await rows_bus.connect()
    mine: set[str] = set()

    async def publish(task: SliceMessage, level: int) -> None:
        if task.batch_id in mine:  # a job another test left queued goes nowhere
            await rows_bus.publish(names.rows, task.encode(), kind="rows", priority=level)

    owner, other = f"dispatcher-{new_id()[:8]}", f"dispatcher-{new_id()[:8]}"
    settings = config(owner, window=64, window_max=1024, window_max_bytes=1 << 30)
    dispatcher = Dispatcher(DispatchStore(pool), publish, Watched._announce, bool, settings)
    try:
        async with serving(iso, dispatcher):
            fleet = HoldingReport(f"fleet-{new_id()[:6]}", 60.0, (), ((other, 0, 1.0),), 900)
            await heartbeat(bus, dispatcher, fleet)
            assert dispatcher.inflight.dispatchers() == 2
            mine.update([await queued_job(pool, 2000) for _ in range(3)])
            await dispatcher.claim()
            workspaces = {o.job.workspace_id for o in dispatcher.jobs.values()}
            assert len(workspaces) >= 3 and set(dispatcher.jobs) >= mine
            # At least the base window each, however many workspaces jobs that other tests
            # left behind add to the split.
            share = max(64, 900 // len(workspaces))
            released = await pool.fetch(
                "SELECT dispatched_upto FROM batches WHERE id = ANY($1::text[])", list(mine)
            )
            # Each fills its share in releases of a few slices while a quarter is free.
            assert all(share * 3 // 4 <= r[0] <= share for r in released), released
            in_broker = await rows_bus.ready_count(names.rows) * 4  # slices of 4 rows
            assert in_broker == sum(r[0] for r in released) <= 900
    finally:
        await rows_bus.close()
        await drop_names(names)


async def test_results_state_reads_passively_beside_the_publisher(bus: Bus, iso: Isolation) -> None:
    """A results shard the broker lacks reads as unconsumed, without closing the channel
    the dispatcher publishes on (passive declares on a channel of their own)."""
    names = Names(f"{iso.namespace}rs")
    probe = Bus(AMQP_URL, names, "results-probe")
    await probe.connect()
    try:
        await probe.publish(names.results_shard(1), b"{}", kind="results")
        await delete_queue(names.results_shard(2))
        for _ in range(2):  # and again, on a fresh channel
            assert await results_state(probe) == ResultsQueues(
                (0, 0), ((0, 0), (1, 0), (0, 0), (0, 0))
            )
        await probe.publish(names.rows, b"{}", kind="rows")  # the publisher channel lives
        assert probe.ready()
    finally:
        await probe.close()
        await drop_names(names)


async def delete_queue(queue: str) -> None:
    """Delete one queue from outside the service."""
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(queue)
