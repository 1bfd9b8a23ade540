"""Results shards through the real broker and ledger: one job's outcomes land on one
shard; each shard has one active aggregator; closing it hands its shard to a standby
with nothing lost and nothing counted twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import aio_pika
import asyncpg
import pytest

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import Names, results_shard
from relay_batches.errors import TransientError
from relay_batches.ledger.outcomes import JobProgress, OutcomeStore
from relay_batches.messages import RowOutcome
from relay_batches.services.dispatcher.__main__ import results_state
from relay_batches.services.dispatcher.recording import ResultsQueues
from relay_batches.services.row_worker.outcomes import OutcomePublisher
from relay_batches.settings import ConfigError
from tests.helpers.aggregating import start_aggregating
from tests.helpers.support import AMQP_URL, Isolation, drop_names, wait_until
from tests.integration.test_aggregator import counters, outcome, running_batch

ROWS = 12


@dataclass
class RecordingStore(OutcomeStore):
    """The real store, noting which jobs each recording held; ``gate`` can hold it."""

    pool: asyncpg.Pool
    jobs: list[set[str]] = field(default_factory=list)
    gate: asyncio.Event | None = None
    entered: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        super().__init__(self.pool)

    async def record(self, outcomes: Sequence[RowOutcome]) -> list[JobProgress]:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        progress = await super().record(outcomes)
        self.jobs.append({o.batch_id for o in outcomes})
        return progress

    def recorded(self) -> set[str]:
        return set().union(*self.jobs)


class FailingStore(RecordingStore):
    """A ledger that is never there (the aggregator still has its broker)."""

    async def record(self, outcomes: Sequence[RowOutcome]) -> list[JobProgress]:
        self.entered.set()
        raise TransientError("connection to the ledger lost")


@dataclass
class Running:
    """One aggregator on its own connection."""

    bus: Bus
    store: RecordingStore
    stop: asyncio.Event
    task: asyncio.Task[None]


async def start_aggregator(
    names: Names, pool: asyncpg.Pool, label: str, store: RecordingStore | None = None
) -> Running:
    bus = Bus(AMQP_URL, names, label)
    await bus.connect()
    store = store or RecordingStore(pool)
    what = f"aggregator {label}"
    running = await start_aggregating(bus, store, chunk=4, outbox_every_s=60, grace_s=1, what=what)
    return Running(bus, store, running.stop, running.task)


async def halt(running: Running) -> None:
    running.stop.set()
    await asyncio.wait_for(running.task, 15)
    await running.bus.close()


@pytest.fixture
async def names(iso: Isolation) -> AsyncIterator[Names]:
    """A namespace of its own (its shard queues start empty), deleted afterwards."""
    created = Names(f"{iso.namespace}sh")
    yield created
    await drop_names(created)


async def ready_per_shard(bus: Bus) -> list[int]:
    return [ready for ready, _ in await bus.queue_states(bus.names.results_shards)]


async def publish_rows(bus: Bus, batch_ids: Sequence[str], rows: range) -> None:
    """Publish outcomes of ``rows`` of every job as the row-worker does, interleaved."""
    publisher = OutcomePublisher(
        lambda shard, body: bus.publish(bus.names.results_shard(shard), body, kind="results"),
        max_rows=3,
        flush_s=0.01,
        shards=bus.names.shards,
    )
    await asyncio.gather(*(publisher.add(outcome(b, i)) for i in rows for b in batch_ids))
    await publisher.drain()


async def test_a_jobs_outcomes_all_land_on_its_one_shard(pool: asyncpg.Pool, names: Names) -> None:
    bus = Bus(AMQP_URL, names, "shard-publisher")
    await bus.connect()
    try:
        batch_id = await running_batch(pool, ROWS)
        await publish_rows(bus, [batch_id], range(ROWS))
        ready = await ready_per_shard(bus)
        shard = results_shard(batch_id, names.shards)
        assert ready[shard] == ROWS // 3  # messages of 3 outcomes each
        assert sum(ready) == ready[shard]
        waiting = tuple((ROWS // 3 if k == shard else 0, 0) for k in range(names.shards))
        assert await results_state(bus) == ResultsQueues((0, 0), waiting)  # nobody consumes
    finally:
        await bus.close()


async def test_each_shard_has_one_active_aggregator_and_a_closed_one_hands_over(
    pool: asyncpg.Pool, names: Names
) -> None:
    first = await start_aggregator(names, pool, "aggregator-a")
    second = await start_aggregator(names, pool, "aggregator-b")
    publisher = Bus(AMQP_URL, names, "shard-publisher")
    await publisher.connect()
    try:
        jobs = [await running_batch(pool, ROWS) for _ in range(6)]
        assert len({results_shard(j, names.shards) for j in jobs}) > 1
        # Both count as consumers of every shard, the waiting one too.
        idle = ResultsQueues((0, 2), ((0, 2),) * names.shards)
        assert await results_state(publisher) == idle
        await publish_rows(publisher, jobs, range(ROWS // 2))

        async def half_recorded() -> bool:
            return [(await counters(pool, j))[1] for j in jobs] == [ROWS // 2] * len(jobs)

        await wait_until(half_recorded, 15, "the first half of every job to be recorded")
        # The first to subscribe is each shard's active consumer: it recorded everything.
        assert first.store.recorded() == set(jobs)
        assert second.store.jobs == []

        # The active one takes a chunk, then its connection goes before it commits.
        first.store.gate = asyncio.Event()
        first.store.entered.clear()
        await publish_rows(publisher, jobs, range(ROWS // 2, ROWS))
        await asyncio.wait_for(first.store.entered.wait(), 10)
        await first.bus.close()

        async def all_completed() -> bool:
            return [(await counters(pool, j))[0] for j in jobs] == ["completed"] * len(jobs)

        await wait_until(all_completed, 20, "the standby to record the rest")
        assert second.store.recorded() == set(jobs)
        recorded_before = len(first.store.jobs)
        first.store.gate.set()  # its late commit is a redelivery's: it changes nothing

        async def late_commit_done() -> bool:
            return len(first.store.jobs) > recorded_before

        await wait_until(late_commit_done, 10, "the closed aggregator's late commit")
        await halt(first)
        for job in jobs:
            assert await counters(pool, job) == ("completed", ROWS, 0, ROWS)
    finally:
        await publisher.close()
        await halt(second)
        if not first.task.done():
            first.store.gate = None
            await halt(first)


async def test_an_aggregator_that_keeps_failing_steps_aside_for_the_standby(
    pool: asyncpg.Pool, names: Names
) -> None:
    failing = await start_aggregator(names, pool, "aggregator-failing", FailingStore(pool))
    standby = await start_aggregator(names, pool, "aggregator-standby")
    publisher = Bus(AMQP_URL, names, "shard-publisher")
    await publisher.connect()
    try:
        jobs = [await running_batch(pool, ROWS) for _ in range(3)]
        await publish_rows(publisher, jobs, range(ROWS))

        async def all_completed() -> bool:
            return [(await counters(pool, j))[0] for j in jobs] == ["completed"] * len(jobs)

        # Three failed chunks (a second's pause each), then it cancels and requeues.
        await wait_until(all_completed, 20, "the standby to take over every shard")
        assert failing.store.entered.is_set() and failing.store.jobs == []
        assert standby.store.recorded() == set(jobs)
        for job in jobs:
            assert await counters(pool, job) == ("completed", ROWS, 0, ROWS)
        # Once the ledger check passes it subscribes again, behind the standby.

        async def both_consume() -> bool:
            idle = ResultsQueues((0, 2), ((0, 2),) * publisher.names.shards)
            return await results_state(publisher) == idle

        await wait_until(both_consume, 10, "the failing aggregator to subscribe again")
    finally:
        await publisher.close()
        await halt(standby)
        await halt(failing)


async def test_a_bus_with_fewer_shards_than_the_broker_holds_refuses_to_start(
    names: Names,
) -> None:
    wider = Bus(AMQP_URL, Names(names.namespace, shards=8), "wider")
    await wider.connect()
    narrower = Bus(AMQP_URL, names, "narrower")
    try:
        with pytest.raises(ConfigError) as refused:
            await narrower.connect()
        assert str(refused.value) == (
            f"RELAY_RESULTS_SHARDS=4 but queue {names.results}.4 exists on the broker: some "
            "process of this namespace runs with a larger RELAY_RESULTS_SHARDS; give every "
            "process the same value (delete the extra shard queues once they are empty when "
            "lowering it)"
        )
    finally:
        await narrower.close()
        await wider.close()
        connection = await aio_pika.connect(AMQP_URL, timeout=10)
        async with connection:
            channel = await connection.channel()
            for shard in range(4, 8):
                await channel.queue_delete(names.results_shard(shard))
