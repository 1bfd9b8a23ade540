"""Unit tests of paying for each row once (:mod:`relay_batches.services.row_worker.paid_once`):
a redelivered or re-sent slice runs only its rows without an outcome, and a slice whose
delivery's channel closed starts no more rows."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

import pytest
from aio_pika.exceptions import ChannelInvalidStateError

from relay_batches.errors import TransientError
from relay_batches.kit.consumer import Delivery, channel_open
from relay_batches.messages import DecodedSlice, RowOutcome
from relay_batches.services.row_worker.core import RowRunner
from relay_batches.services.row_worker.paid_once import AnsweredRows, PaidOnce
from tests.unit.test_row_worker import WAIT_S, FakeRouter, Sink, settle, tagged


class Ledger:
    """A fake ledger: the rows with an outcome, the questions asked, failures to give."""

    def __init__(self, answered: set[int] | None = None, failures: int = 0) -> None:
        self.answered = answered or set()
        self.failures = failures
        self.asked: list[list[int]] = []

    async def __call__(self, batch_id: str, indexes: Sequence[int]) -> set[int]:
        self.asked.append(list(indexes))
        if self.failures:
            self.failures -= 1
            raise TransientError("database unavailable")
        return self.answered & set(indexes)


async def no_sleep(_seconds: float) -> None:
    await asyncio.sleep(0)


class Worker:
    """A runner behind :class:`PaidOnce`, as the row-worker wires them."""

    def __init__(self, ledger: Ledger | None = None, gated: bool = False) -> None:
        self.router, self.sink = FakeRouter(gated=gated), Sink()
        self.answered = AnsweredRows()
        self.runner = RowRunner(self.router, self.answered.sink(self.sink), concurrency=2)
        self.paid_once = PaidOnce(self.runner.handle_slice, self.answered, ledger, sleep=no_sleep)

    def called(self) -> list[int]:
        return sorted(index for _, index, _ in self.router.calls)


def delivery(
    job_slice: DecodedSlice, redelivered: bool = False, open_: bool = True
) -> Delivery[DecodedSlice]:
    return Delivery(job_slice, redelivered, lambda: open_)


async def test_a_first_delivery_runs_every_row_without_asking_the_ledger() -> None:
    ledger = Ledger({0, 1})
    worker = Worker(ledger)
    assert await worker.paid_once.handle(delivery(tagged("b", range(4)))) == 4
    assert worker.called() == [0, 1, 2, 3]
    assert ledger.asked == []


@pytest.mark.parametrize("how", ["redelivered", "resent"])
async def test_a_slice_that_came_back_runs_only_its_rows_without_an_outcome(how: str) -> None:
    ledger = Ledger({0, 1, 5})
    worker = Worker(ledger)
    job_slice = tagged("b", range(4))
    if how == "resent":
        job_slice = replace(job_slice, resent=True)
    got = await worker.paid_once.handle(delivery(job_slice, redelivered=how == "redelivered"))
    assert got == 2
    assert worker.called() == [2, 3]
    assert ledger.asked == [[0, 1, 2, 3]], "one question for the whole slice"


async def test_a_slice_all_answered_runs_nothing() -> None:
    worker = Worker(Ledger({0, 1}))
    assert await worker.paid_once.handle(delivery(tagged("b", [0, 1]), redelivered=True)) == 0
    assert worker.router.calls == []


async def test_rows_this_worker_answered_are_dropped_without_the_ledger() -> None:
    ledger = Ledger()
    worker = Worker(ledger)
    await worker.paid_once.handle(delivery(tagged("b", [0, 1])))
    assert await worker.paid_once.handle(delivery(tagged("b", [0, 1]), redelivered=True)) == 0
    assert worker.called() == [0, 1]
    assert ledger.asked == []


async def test_a_redelivery_waits_for_this_workers_run_of_a_closed_delivery() -> None:
    # The channel closed while rows 0 and 1 were in flight: row 2 (waiting for a slot)
    # never starts under it; the slice comes back to this same worker, which waits for
    # rows 0 and 1 and runs only row 2.
    worker = Worker(Ledger(), gated=True)
    is_open = True
    first = asyncio.create_task(
        worker.paid_once.handle(Delivery(tagged("b", [0, 1, 2]), False, lambda: is_open))
    )
    assert {await worker.router.next_started() for _ in range(2)} == {("b", 0), ("b", 1)}
    is_open = False
    again = asyncio.create_task(worker.paid_once.handle(delivery(tagged("b", [0, 1, 2]), True)))
    worker.router.open("b", 0)
    await settle()
    assert worker.called() == [0, 1], "no row starts on a closed delivery"
    assert not again.done(), "the redelivery waits for the rows still running here"
    worker.router.open("b", 1)
    assert await asyncio.wait_for(first, WAIT_S) == 2
    assert await worker.router.next_started() == ("b", 2)
    worker.router.open("b", 2)
    assert await asyncio.wait_for(again, WAIT_S) == 1
    assert worker.called() == [0, 1, 2], "each row called once"


async def test_two_copies_of_a_slice_that_came_back_to_one_worker_run_each_row_once() -> None:
    # A redelivered slice and a re-sent copy of it reach the same worker together:
    # both wait, neither finds an outcome in the ledger; the second to start drops the
    # rows the first runs.
    worker = Worker(Ledger())
    copy = replace(tagged("b", [0, 1, 2]), resent=True)
    got = await asyncio.wait_for(
        asyncio.gather(
            worker.paid_once.handle(delivery(tagged("b", [0, 1, 2]), True)),
            worker.paid_once.handle(delivery(copy)),
        ),
        WAIT_S,
    )
    assert sorted(got) == [0, 3]
    assert worker.called() == [0, 1, 2]


async def test_a_row_whose_outcome_is_being_published_counts_once_confirmed() -> None:
    confirm = asyncio.Event()
    published: list[RowOutcome] = []

    async def slow_sink(outcome: RowOutcome) -> None:
        published.append(outcome)
        await confirm.wait()

    answered = AnsweredRows()
    add = answered.sink(slow_sink)
    pending = asyncio.create_task(add(RowOutcome("b", 3, "x", None, 1)))
    await settle()
    asking = asyncio.create_task(answered.answered("b", [3, 4]))
    await settle()
    assert not asking.done(), "it waits for the confirm"
    confirm.set()
    assert await asyncio.wait_for(asking, WAIT_S) == {3}
    await pending


async def test_a_row_whose_outcome_failed_to_publish_runs_again() -> None:
    async def failing_sink(_outcome: RowOutcome) -> None:
        raise RuntimeError("outcome publish failed")

    answered = AnsweredRows()
    with pytest.raises(RuntimeError):
        await answered.sink(failing_sink)(RowOutcome("b", 3, "x", None, 1))
    assert await answered.answered("b", [3]) == set()


def test_the_memory_of_answers_is_bounded() -> None:
    async def run() -> set[int]:
        answered = AnsweredRows(capacity=2)
        add = answered.sink(Sink())
        for index in range(3):
            await add(RowOutcome("b", index, "x", None, 1))
        return await answered.answered("b", [0, 1, 2])

    assert asyncio.run(run()) == {1, 2}


async def test_the_ledger_away_is_asked_again_then_given_up_on() -> None:
    ledger = Ledger({0}, failures=2)
    worker = Worker(ledger)
    assert await worker.paid_once.handle(delivery(tagged("b", [0, 1]), True)) == 1
    assert worker.called() == [1]
    assert len(ledger.asked) == 3

    clock = iter(range(0, 1000, 30))
    gone = Ledger({0}, failures=10**6)
    worker = Worker()
    paid_once = PaidOnce(
        worker.runner.handle_slice,
        worker.answered,
        gone,
        ledger_wait_s=60,
        sleep=no_sleep,
        monotonic=lambda: float(next(clock)),
    )
    assert await paid_once.handle(delivery(tagged("b", [0, 1]), True)) == 2, "runs whole"
    assert 1 < len(gone.asked) < 5


async def test_a_closed_delivery_starts_no_row() -> None:
    worker = Worker()
    assert await worker.paid_once.handle(delivery(tagged("b", [0, 1]), open_=False)) == 0
    assert worker.router.calls == []


class FakeChannel:
    def __init__(self, closed: bool) -> None:
        self.is_closed = closed


class FakeMessage:
    def __init__(self, channel: FakeChannel | None) -> None:
        self._channel = channel

    @property
    def channel(self) -> FakeChannel:
        if self._channel is None:  # aio-pika raises once its channel closed
            raise ChannelInvalidStateError
        return self._channel


def test_a_delivery_is_open_while_its_channel_is() -> None:
    assert channel_open(FakeMessage(FakeChannel(False))) is True  # type: ignore[arg-type]
    assert channel_open(FakeMessage(FakeChannel(True))) is False  # type: ignore[arg-type]
    assert channel_open(FakeMessage(None)) is False  # type: ignore[arg-type]
