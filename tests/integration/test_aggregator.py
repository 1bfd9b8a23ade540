"""The aggregator against the real ledger and broker: redelivery never counts twice."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aio_pika
import asyncpg
import orjson
import pytest

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import (
    EVENT_FINISHED,
    EVENT_PROGRESS,
    Names,
    declare_all,
    progress_key,
)
from relay_batches.ids import new_id
from relay_batches.kit.base import BusService
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outcomes import JobProgress, OutcomeStore
from relay_batches.messages import JobEvent, OutcomesMessage, RowOutcome
from relay_batches.metrics import AGGREGATOR, service_registry
from relay_batches.services.aggregator.core import Aggregator
from relay_batches.services.aggregator.service import aggregator_service
from tests.helpers.support import AMQP_URL, Isolation, wait_until

DEAD_LETTERED_SAMPLE = "relay_messages_dead_lettered_total"


async def running_batch(pool: asyncpg.Pool, total: int) -> str:
    """A batch of ``total`` rows, claimed so it is ``running``."""
    workspace = await KeyStore(pool).ensure_workspace(f"agg-{new_id()[:6]}")
    batch = await JobStore(pool).create(
        NewJob(new_id(), workspace, "agg", "gpt-4o-mini", 0, total, None, None, None),
        ((f"c-{i}", '[{"role":"user","content":"x"}]') for i in range(total)),
    )
    claimed = await DispatchStore(pool).claim_queued("test-owner", 1000, 30)
    assert batch.id in {job.id for job in claimed}
    return batch.id


def outcome(batch_id: str, index: int, content: str | None = "ok") -> RowOutcome:
    """A content outcome, or an error one when ``content`` is None."""
    error = None if content is not None else "upstream_error: boom"
    return RowOutcome(batch_id, index, content, error, attempts=1)


async def counters(pool: asyncpg.Pool, batch_id: str) -> tuple[str, int, int, int]:
    """(status, completed, failed, result rows) of a batch."""
    row = await pool.fetchrow(
        "SELECT status, completed, failed,"
        " (SELECT count(*) FROM row_results WHERE batch_id = $1) AS results"
        " FROM batches WHERE id = $1",
        batch_id,
    )
    return row["status"], row["completed"], row["failed"], row["results"]


async def test_outcome_store_inserts_each_row_once(pool: asyncpg.Pool) -> None:
    batch_id = await running_batch(pool, 3)
    store = OutcomeStore(pool)
    first = await store.record([outcome(batch_id, 0), outcome(batch_id, 0), outcome(batch_id, 1)])
    assert [(p.completed, p.failed, p.new_completed) for p in first] == [(2, 0, 2)]
    again = await store.record([outcome(batch_id, 0), outcome(batch_id, 1, None)])
    assert again == []
    last = await store.record([outcome(batch_id, 2, None), outcome(batch_id, 1)])
    assert [(p.status, p.completed, p.failed) for p in last] == [("completed", 2, 1)]
    assert await counters(pool, batch_id) == ("completed", 2, 1, 3)
    assert await store.record([outcome(batch_id, 0)]) == []


async def test_outcomes_after_cancel_are_discarded(pool: asyncpg.Pool) -> None:
    batch_id = await running_batch(pool, 3)
    store = OutcomeStore(pool)
    await store.record([outcome(batch_id, 0)])
    workspace = await pool.fetchval("SELECT workspace_id FROM batches WHERE id = $1", batch_id)
    await JobStore(pool).cancel(workspace, batch_id)
    assert await store.record([outcome(batch_id, 1), outcome(batch_id, 2)]) == []
    assert await counters(pool, batch_id) == ("canceled", 1, 0, 1)


async def test_a_chunk_holding_one_row_twice_stores_its_first_outcome(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await running_batch(pool, 3)
    chunk = [outcome(batch_id, 2, "a"), outcome(batch_id, 0, "first"), outcome(batch_id, 0, "b")]
    chunk += [outcome(batch_id, 2, "c"), outcome(batch_id, 1, None)]

    await OutcomeStore(pool).record(chunk)

    stored = await pool.fetch(
        "SELECT row_index, content FROM row_results WHERE batch_id = $1 ORDER BY row_index",
        batch_id,
    )
    assert [tuple(r) for r in stored] == [(0, "first"), (1, None), (2, "a")]
    assert await counters(pool, batch_id) == ("completed", 2, 1, 3)


async def test_redelivered_outcome_is_counted_once(
    pool: asyncpg.Pool, bus: Bus, iso: Isolation, aggregator: BusService
) -> None:
    batch_id = await running_batch(pool, 2)
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        events = await channel.get_exchange(bus.names.events)
        watch = await channel.declare_queue("", exclusive=True)
        await watch.bind(events, EVENT_FINISHED)
        await watch.bind(events, EVENT_PROGRESS)
        await watch.bind(events, progress_key("test-owner"))

        duplicate = OutcomesMessage((outcome(batch_id, 0, "first"),)).encode()
        await bus.publish(bus.names.results, duplicate, kind="results")
        await bus.publish(bus.names.results, duplicate, kind="results")
        await bus.publish(
            bus.names.results,
            OutcomesMessage((outcome(batch_id, 0, "other"), outcome(batch_id, 1, None))).encode(),
            kind="results",
        )

        async def finished() -> bool:
            return (await counters(pool, batch_id))[0] == "completed"

        await wait_until(finished, 15, "the batch to complete")
        # A late duplicate after the job ended changes nothing either.
        await bus.publish(bus.names.results, duplicate, kind="results")

        async def results_queue_empty() -> bool:
            queue = await channel.declare_queue(bus.names.results, passive=True)
            return queue.declaration_result.message_count == 0

        await wait_until(results_queue_empty, 15, "the results queue to drain")
        assert await counters(pool, batch_id) == ("completed", 1, 1, 2)
        content = await pool.fetchval(
            "SELECT content FROM row_results WHERE batch_id = $1 AND row_index = 0", batch_id
        )
        assert content == "first"

        received: list[tuple[str, JobEvent]] = []
        while (message := await watch.get(fail=False, timeout=5)) is not None:
            await message.ack()
            event = JobEvent.decode(message.body)
            if event.batch_id == batch_id:
                received.append((message.routing_key or "", event))
        finished_events = [e for key, e in received if key == EVENT_FINISHED]
        assert [(e.status, e.completed, e.failed) for e in finished_events] == [("completed", 1, 1)]
        # Progress goes to the dispatcher whose lease the job was under, its end included.
        progress = [(key, e.status) for key, e in received if key != EVENT_FINISHED]
        assert progress and set(progress) <= {
            ("job.progress.test-owner", "running"),
            ("job.progress.test-owner", "completed"),
        }
        assert progress[-1] == ("job.progress.test-owner", "completed")
        assert orjson.loads(duplicate)["kind"] == "results"


async def _watch(
    bus: Bus, channel: aio_pika.abc.AbstractChannel, key: str
) -> aio_pika.abc.AbstractQueue:
    events = await channel.get_exchange(bus.names.events)
    queue = await channel.declare_queue("", exclusive=True)
    await queue.bind(events, key)
    return queue


async def _drain(queue: aio_pika.abc.AbstractQueue, batch_id: str) -> list[JobEvent]:
    found: list[JobEvent] = []
    while (message := await queue.get(fail=False, timeout=5)) is not None:
        await message.ack()
        event = JobEvent.decode(message.body)
        if event.batch_id == batch_id:
            found.append(event)
    return found


async def test_an_unstorable_outcome_becomes_that_rows_error_and_the_job_completes(
    pool: asyncpg.Pool, bus: Bus, aggregator: BusService
) -> None:
    batch_id = await running_batch(pool, 3)
    poison = outcome(batch_id, 1, "nul \x00 in a reply")  # Postgres text refuses NUL
    chunk = OutcomesMessage((outcome(batch_id, 0), poison, outcome(batch_id, 2))).encode()
    await bus.publish(bus.names.results, chunk, kind="results")

    async def finished() -> bool:
        return (await counters(pool, batch_id))[0] == "completed"

    await wait_until(finished, 15, "the batch with a poison outcome to complete")
    assert await counters(pool, batch_id) == ("completed", 2, 1, 3)
    error = await pool.fetchval(
        "SELECT error FROM row_results WHERE batch_id = $1 AND row_index = 1", batch_id
    )
    assert error == "internal_error: the upstream reply could not be stored"


async def test_outcomes_for_a_canceled_job_repeat_the_cancel_once(
    pool: asyncpg.Pool, bus: Bus, aggregator: BusService
) -> None:
    batch_id = await running_batch(pool, 4)
    workspace = await pool.fetchval("SELECT workspace_id FROM batches WHERE id = $1", batch_id)
    await JobStore(pool).cancel(workspace, batch_id)
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        watch = await _watch(bus, channel, "job.canceled")
        for index in (0, 1):
            body = OutcomesMessage((outcome(batch_id, index),)).encode()
            await bus.publish(bus.names.results, body, kind="results")

        async def repeated() -> bool:
            queue = await channel.declare_queue(watch.name, passive=True)
            return (queue.declaration_result.message_count or 0) > 0

        await wait_until(repeated, 15, "the cancel to be broadcast again")

        async def results_drained() -> bool:
            queue = await channel.declare_queue(bus.names.results, passive=True)
            return queue.declaration_result.message_count == 0

        await wait_until(results_drained, 15, "the results queue to drain")
        events = await _drain(watch, batch_id)
    assert [e.status for e in events] == ["canceled"]
    assert await counters(pool, batch_id) == ("canceled", 0, 0, 0)


async def test_unstorable_outcomes_are_dead_lettered_and_the_rest_of_the_chunk_is_recorded(
    pool: asyncpg.Pool, bus: Bus, aggregator: BusService
) -> None:
    """A row index out of the ledger's range (2**31) and one past its job's rows can never
    be stored: their messages go to ``<ns>.results.dead`` (counted, logged) once, while
    the good outcomes of the same chunk, and of the same messages, are recorded.

    The row past its job's rows belongs to a job that stays running: an outcome of a job
    that has already ended is dropped as late, whatever its row, so aimed at ``poisoned``
    (which ends with its one row) it was dead-lettered only when it shared a chunk with
    the others, and the test raced the aggregator's chunking."""
    poisoned, other = await running_batch(pool, 1), await running_batch(pool, 2)
    unended = await running_batch(pool, 2)
    bodies = [
        OutcomesMessage((outcome(poisoned, 2**31), outcome(other, 0))).encode(),
        OutcomesMessage((outcome(other, 1), outcome(poisoned, 0))).encode(),
        OutcomesMessage((outcome(unended, 7),)).encode(),
    ]
    dead_queue = bus.names.results_dead
    before = (
        service_registry(AGGREGATOR).get_sample_value(DEAD_LETTERED_SAMPLE, {"queue": dead_queue})
        or 0.0
    )
    for body in bodies:
        await bus.publish(bus.names.results, body, kind="results")

    async def both_completed() -> bool:
        statuses = [(await counters(pool, b))[0] for b in (poisoned, other)]
        return statuses == ["completed", "completed"]

    await wait_until(both_completed, 60, "both jobs to complete despite the poison")
    assert await counters(pool, other) == ("completed", 2, 0, 2)
    assert await counters(pool, poisoned) == ("completed", 1, 0, 1)

    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        dead_letters = await channel.declare_queue(dead_queue, passive=True)
        dead: list[bytes] = []
        for _ in bodies[::2]:
            message = await wait_until(
                lambda: dead_letters.get(fail=False, timeout=5), 60, "a dead-lettered message"
            )
            await message.ack()
            dead.append(message.body)
            assert message.headers["x-relay-error"]
        results = await channel.declare_queue(bus.names.results, passive=True)
        assert results.declaration_result.message_count == 0
    assert sorted(dead) == sorted(bodies[::2])
    after = service_registry(AGGREGATOR).get_sample_value(
        DEAD_LETTERED_SAMPLE, {"queue": dead_queue}
    )
    assert after == before + 2


class ChunkRecorder(Aggregator):
    """The aggregator, remembering the encoded size of every chunk it was handed."""

    def __init__(self, pool: asyncpg.Pool, bus: Bus) -> None:
        super().__init__(OutcomeStore(pool), bus.publish_event)
        self.chunk_bytes: list[list[int]] = []

    async def record_messages(self, messages: Sequence[OutcomesMessage]) -> list[JobProgress]:
        self.chunk_bytes.append([len(m.encode()) for m in messages])
        return await super().record_messages(messages)


async def test_chunks_are_cut_by_bytes_of_message_bodies(pool: asyncpg.Pool, bus: Bus) -> None:
    batch_id = await running_batch(pool, 8)
    # Eight messages of about 300 KiB wait in the queue before the aggregator starts.
    bodies = [
        OutcomesMessage((outcome(batch_id, i, chr(97 + i) * 300 * 1024),)).encode()
        for i in range(8)
    ]
    for body in bodies:
        await bus.publish(bus.names.results, body, kind="results")
    recorder = ChunkRecorder(pool, bus)

    async def db_ready() -> bool:
        return True

    budget = 1024 * 1024
    service = aggregator_service(
        bus,
        recorder,
        db_ready,
        prefetch=16,
        chunk=64,
        outbox_every_s=0.2,
        grace_s=5,
        linger_s=0.5,
        chunk_bytes=budget,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:

        async def finished() -> bool:
            return (await counters(pool, batch_id))[0] == "completed"

        await wait_until(finished, 20, "the batch of big outcomes to complete")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert await counters(pool, batch_id) == ("completed", 8, 0, 8)
    assert [size for chunk in recorder.chunk_bytes for size in chunk] == [len(b) for b in bodies]
    assert all(sum(chunk) <= budget for chunk in recorder.chunk_bytes), recorder.chunk_bytes
    assert len(recorder.chunk_bytes) >= 3  # 2.4 MiB cannot fit fewer chunks of 1 MiB
    content = await pool.fetchval(
        "SELECT content FROM row_results WHERE batch_id = $1 AND row_index = 7", batch_id
    )
    assert content == "h" * 300 * 1024


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_the_dead_letter_queue_keeps_only_its_newest_messages(
    iso: Isolation, queue_type: str
) -> None:
    """Nothing consumes ``<ns>.results.dead``: past RELAY_RESULTS_DEAD_MAX_LENGTH messages
    the oldest are dropped, so it cannot fill the broker (a quorum queue does the same)."""
    names = Names(f"{iso.namespace}dl{queue_type}", dead_max_length=3, queue_type=queue_type)
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        try:
            await declare_all(channel, names)
            for n in range(5):
                await channel.default_exchange.publish(
                    aio_pika.Message(f"dead {n}".encode()), routing_key=names.results_dead
                )
            dead = await channel.declare_queue(names.results_dead, passive=True)
            kept = []
            while (message := await dead.get(fail=False)) is not None:
                await message.ack()
                kept.append(message.body.decode())
            assert kept == ["dead 2", "dead 3", "dead 4"]
        finally:
            for queue in names.durable_queues():
                await channel.queue_delete(queue)
            await channel.exchange_delete(names.events)
