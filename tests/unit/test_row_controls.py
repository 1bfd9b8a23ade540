"""A row-worker's controls on the rows it holds and has not started: a pause hands them
back (one confirmed results message of returned rows, on the job's shard), a budget stop
withholds them (each its budget error outcome); rows started run on, and slices
released after the resume (a higher pause count) run."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from relay_batches.bus.topology import results_shard
from relay_batches.messages import UNPAUSED, OutcomesMessage, SliceMessage
from relay_batches.model import BUDGET_HELD_ERROR
from relay_batches.services.row_worker.controls import Halt, JobControls
from relay_batches.services.row_worker.core import RowRunner
from tests.unit.test_row_worker import WAIT_S, FakeRouter, Sink, tagged

SHARDS = 4


class Published:
    """The results messages a worker published, with their shard."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, OutcomesMessage]] = []

    async def __call__(self, shard: int, body: bytes) -> None:
        self.messages.append((shard, OutcomesMessage.decode(body)))


def controlled(concurrency: int) -> tuple[FakeRouter, Sink, Published, RowRunner]:
    router, sink, published = FakeRouter(gated=True), Sink(), Published()
    runner = RowRunner(router, sink, concurrency, controls=JobControls(published, SHARDS))
    return router, sink, published, runner


def test_a_pause_halts_the_slices_released_before_it_only() -> None:
    controls = JobControls(Published(), SHARDS)
    before, after = tagged("b1", [0]), replace(tagged("b1", [1]), pauses=1)
    assert controls.halt(before) is None
    controls.pause("b1", 1)
    assert (controls.halt(before), controls.halt(after)) == (Halt.PAUSED, None)
    controls.pause("b1", 0)  # an older pause's event, late: the newer count holds
    assert controls.halt(before) is Halt.PAUSED
    assert controls.halt(tagged("b2", [0])) is None


def test_a_budget_stop_halts_every_slice_of_its_job() -> None:
    controls = JobControls(Published(), SHARDS)
    controls.budget_stop("b1")
    assert controls.halt(replace(tagged("b1", [0]), pauses=7)) is Halt.BUDGET
    assert controls.halt(tagged("b2", [0])) is None


def test_memory_is_bounded() -> None:
    controls = JobControls(Published(), SHARDS, capacity=2)
    for n in range(3):
        controls.pause(f"b{n}", 1)
    assert controls.halt(tagged("b0", [0])) is None
    assert controls.halt(tagged("b2", [0])) is Halt.PAUSED


async def test_a_paused_jobs_rows_not_started_are_handed_back_and_the_started_finish() -> None:
    router, sink, published, runner = controlled(concurrency=2)
    running = asyncio.create_task(runner.handle_slice(tagged("b1", range(6))))
    assert {await router.next_started() for _ in range(2)} == {("b1", 0), ("b1", 1)}

    assert runner.controls is not None
    runner.controls.pause("b1", 1)
    router.open("b1", 0)
    router.open("b1", 1)

    assert await asyncio.wait_for(running, WAIT_S) == 2
    assert sorted(o.row_index for o in sink.outcomes) == [0, 1]
    assert len(router.calls) == 2
    [(shard, message)] = published.messages
    assert shard == results_shard("b1", SHARDS)
    assert message.outcomes == ()
    assert message.returned == tuple(("b1", i, 0) for i in range(2, 6))


async def test_a_slice_of_a_paused_job_delivered_later_is_handed_back_whole() -> None:
    router, sink, published, runner = controlled(concurrency=2)
    assert runner.controls is not None
    runner.controls.pause("b1", 1)

    assert await asyncio.wait_for(runner.handle_slice(tagged("b1", range(3))), WAIT_S) == 0
    assert router.calls == [] and sink.outcomes == []
    assert [m.returned for _, m in published.messages] == [tuple(("b1", i, 0) for i in range(3))]


async def test_a_budget_stopped_jobs_rows_not_started_are_withheld() -> None:
    router, sink, published, runner = controlled(concurrency=1)
    running = asyncio.create_task(runner.handle_slice(tagged("b1", range(3))))
    assert await router.next_started() == ("b1", 0)

    assert runner.controls is not None
    runner.controls.budget_stop("b1")
    router.open("b1", 0)

    assert await asyncio.wait_for(running, WAIT_S) == 1
    assert [o.row_index for o in sink.outcomes] == [0]
    [(_, message)] = published.messages
    assert [(o.row_index, o.error, o.attempts) for o in message.outcomes] == [
        (1, BUDGET_HELD_ERROR, 0),
        (2, BUDGET_HELD_ERROR, 0),
    ]
    assert message.returned == ()


def test_returned_rows_survive_the_wire() -> None:
    message = OutcomesMessage((), (("b1", 3, 0), ("b2", 0, 2)))
    assert OutcomesMessage.decode(message.encode()) == message
    assert b"returned" not in OutcomesMessage(()).encode()


def test_a_slice_the_offloader_forwards_is_never_handed_back_on_a_pause() -> None:
    controls = JobControls(Published(), SHARDS)
    controls.pause("b1", 3)
    forwarded = replace(tagged("b1", [0]), pauses=UNPAUSED)
    assert controls.halt(forwarded) is None
    assert SliceMessage.decode(forwarded.with_rows(forwarded.rows).encode()).pauses == UNPAUSED
