"""Unit tests of the row-worker: the runner (concurrency, cancel, one outcome per row)
and the outcome publisher (count/time flush, add waits for the confirm, failures)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from relay_batches.bus.topology import rows_prefetch
from relay_batches.errors import HandBack
from relay_batches.messages import (
    DecodedSlice,
    OutcomesMessage,
    RowOutcome,
    RowRequest,
    SliceMessage,
)
from relay_batches.outcome import to_outcome
from relay_batches.router.aliases import Price
from relay_batches.router.types import Completion, RowResult
from relay_batches.services.row_worker import outcomes as outcomes_module
from relay_batches.services.row_worker.core import CanceledJobs, RowRunner
from relay_batches.services.row_worker.outcomes import OutcomePublisher
from relay_batches.services.row_worker.service import hand_over_priority, outcome_batch_rows

WAIT_S = 5.0  # generous upper bound for anything a test waits on; never a fixed sleep


def row_messages(index: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"row {index}"}]


def make_task(batch_id: str, indexes: Sequence[int], model: str = "m") -> DecodedSlice:
    return DecodedSlice(
        batch_id,
        model,
        tuple((i, RowRequest(row_messages(i))) for i in indexes),
        {"temperature": 0},
    )


def index_of(messages: Sequence[Mapping[str, Any]]) -> int:
    return int(str(messages[0]["content"]).removeprefix("row "))


@dataclass
class FakeRouter:
    """Records calls; each call can be held on a gate until the test opens it."""

    gated: bool = False
    fail_with: Exception | None = None
    calls: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    started: asyncio.Queue[tuple[str, int]] = field(default_factory=asyncio.Queue)
    gates: dict[tuple[str, int], asyncio.Event] = field(default_factory=dict)
    cancelled: list[tuple[str, int]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    workspaces: list[str] = field(default_factory=list)

    def gate(self, batch_id: str, index: int) -> asyncio.Event:
        return self.gates.setdefault((batch_id, index), asyncio.Event())

    def open(self, batch_id: str, index: int) -> None:
        self.gate(batch_id, index).set()

    async def next_started(self) -> tuple[str, int]:
        return await asyncio.wait_for(self.started.get(), WAIT_S)

    async def complete(
        self,
        alias: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        workspace: str = "",
    ) -> RowResult:
        index = index_of(messages)
        self.workspaces.append(workspace)
        batch_id = str(params.get("batch", alias))
        self.calls.append((alias, index, dict(params)))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.started.put_nowait((batch_id, index))
        try:
            if self.gated:
                await self.gate(batch_id, index).wait()
            if self.fail_with is not None:
                raise self.fail_with
            return RowResult(Completion(f"echo {index}", 2, 3), None, 1, "dep")
        except asyncio.CancelledError:
            self.cancelled.append((batch_id, index))
            raise
        finally:
            self.in_flight -= 1


@dataclass
class Sink:
    """Collects outcomes."""

    outcomes: list[RowOutcome] = field(default_factory=list)

    async def __call__(self, outcome: RowOutcome) -> None:
        self.outcomes.append(outcome)


def tagged(batch_id: str, indexes: Sequence[int]) -> DecodedSlice:
    """A task whose params tell the fake router which job a call belongs to."""
    return DecodedSlice(
        batch_id,
        batch_id,
        tuple((i, RowRequest(row_messages(i))) for i in indexes),
        {"batch": batch_id},
    )


async def settle() -> None:
    """Let every ready callback run (no time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)


# --- RowRunner ---------------------------------------------------------------------------


async def test_every_row_gets_one_outcome_with_its_index() -> None:
    router, sink = FakeRouter(), Sink()
    runner = RowRunner(router, sink, concurrency=4, monotonic=lambda: 7.0)
    assert await runner.handle_slice(make_task("b1", range(10, 20))) == 10
    assert sorted(o.row_index for o in sink.outcomes) == list(range(10, 20))
    assert sorted(sink.outcomes, key=lambda o: o.row_index) == [
        RowOutcome("b1", i, f"echo {i}", None, 1, False, "dep", 2, 3, latency_ms=0)
        for i in range(10, 20)
    ]
    assert all(call == ("m", call[1], {"temperature": 0}) for call in router.calls)


async def test_each_call_names_the_workspace_of_its_slice() -> None:
    # The router pools connections per workspace: a slice's calls name its workspace, and
    # a slice that names none its job (never a connection another workspace used).
    router, sink = FakeRouter(), Sink()
    runner = RowRunner(router, sink, concurrency=4)
    await runner.handle_slice(replace(make_task("b1", range(3)), workspace="ws-a"))
    await runner.handle_slice(make_task("b2", range(2)))
    assert router.workspaces == ["ws-a"] * 3 + ["job:b2"] * 2


async def test_never_more_than_concurrency_calls_in_flight() -> None:
    router, sink = FakeRouter(gated=True), Sink()
    runner = RowRunner(router, sink, concurrency=3)
    running = asyncio.create_task(runner.handle_slice(tagged("b1", range(8))))

    first = {await router.next_started() for _ in range(3)}
    assert first == {("b1", 0), ("b1", 1), ("b1", 2)}
    await settle()
    assert router.started.empty()  # the fourth row waits for a slot
    assert router.in_flight == 3

    for index in range(8):
        router.open("b1", index)
        if index + 3 < 8:
            assert await router.next_started() == ("b1", index + 3)
        await settle()
        assert router.in_flight <= 3

    assert await asyncio.wait_for(running, WAIT_S) == 8
    assert router.max_in_flight == 3
    assert sorted(o.row_index for o in sink.outcomes) == list(range(8))


async def test_concurrency_is_shared_across_tasks() -> None:
    router, sink = FakeRouter(gated=True), Sink()
    runner = RowRunner(router, sink, concurrency=2)
    one = asyncio.create_task(runner.handle_slice(tagged("b1", range(3))))
    two = asyncio.create_task(runner.handle_slice(tagged("b2", range(3))))
    await router.next_started()
    await router.next_started()
    await settle()
    assert router.in_flight == 2
    for gate_key in [(b, i) for b in ("b1", "b2") for i in range(3)]:
        router.open(*gate_key)
    assert await asyncio.wait_for(asyncio.gather(one, two), WAIT_S) == [3, 3]
    assert router.max_in_flight == 2
    assert len(sink.outcomes) == 6


async def test_slices_start_their_rows_in_order() -> None:
    # Held slices do not interleave: the first starts every row before the second starts
    # any, so it ends (and is acked) while the second still runs.
    router, sink = FakeRouter(gated=True), Sink()
    runner = RowRunner(router, sink, concurrency=2)
    one = asyncio.create_task(runner.handle_slice(tagged("b1", range(4))))
    two = asyncio.create_task(runner.handle_slice(tagged("b2", range(4))))
    order = [await router.next_started() for _ in range(2)]
    for step in range(6):
        batch_id, index = order[step]
        router.open(batch_id, index)
        order.append(await router.next_started())
    assert order == [("b1", i) for i in range(4)] + [("b2", i) for i in range(4)]
    for batch_id, index in order[6:]:
        router.open(batch_id, index)
    assert await asyncio.wait_for(asyncio.gather(one, two), WAIT_S) == [4, 4]


async def test_a_slices_last_outcome_flushes_its_job() -> None:
    router, sink = FakeRouter(gated=True), Sink()
    flushed: list[tuple[str, int]] = []
    runner = RowRunner(
        router, sink, concurrency=2, flush=lambda b: flushed.append((b, len(sink.outcomes)))
    )
    running = asyncio.create_task(runner.handle_slice(tagged("b1", range(3))))
    for index in range(3):
        await router.next_started()
        router.open("b1", index)
        await settle()
        # Only once the slice's third outcome is queued, and after it.
        assert flushed == ([] if index < 2 else [("b1", 3)])
    assert await asyncio.wait_for(running, WAIT_S) == 3
    runner.canceled.add("b2")  # a slice whose rows are all dropped flushes nothing
    assert await runner.handle_slice(tagged("b2", range(2))) == 0
    await settle()
    assert flushed == [("b1", 3)]


async def test_a_stopping_worker_hands_over_the_rows_of_a_started_slice_it_did_not_start() -> None:
    router, sink = FakeRouter(gated=True), Sink()
    handed: list[SliceMessage] = []

    async def hand_over(rest: SliceMessage) -> None:
        handed.append(rest)

    runner = RowRunner(router, sink, concurrency=2, hand_over=hand_over)
    job_slice = replace(tagged("b1", range(6)), level=3, sent_at=12.5, owner="d1", expires_at=4e9)
    job_slice = replace(
        job_slice,
        rows=(
            *job_slice.rows[:5],
            (5, RowRequest(row_messages(5), "other-model", {"max_tokens": 7})),
        ),
    )
    running = asyncio.create_task(runner.handle_slice(job_slice))
    started = {await router.next_started() for _ in range(2)}
    runner.stop_starting()
    for batch_id, index in started:
        router.open(batch_id, index)
    assert await asyncio.wait_for(running, WAIT_S) == 2  # only the two it started
    assert sorted(o.row_index for o in sink.outcomes) == [0, 1]
    (rest,) = handed
    decoded = SliceMessage.decode(rest.encode())
    assert decoded == replace(job_slice, rows=job_slice.rows[2:])  # same job, marks, rows


async def test_a_failed_hand_over_runs_the_slice_on() -> None:
    router, sink = FakeRouter(), Sink()
    tries: list[SliceMessage] = []

    async def hand_over(rest: SliceMessage) -> None:
        tries.append(rest)
        raise RuntimeError("broker gone")

    runner = RowRunner(router, sink, concurrency=1, hand_over=hand_over)
    router.gated = True
    running = asyncio.create_task(runner.handle_slice(tagged("b1", range(3))))
    await router.next_started()
    runner.stop_starting()
    router.gated = False
    router.open("b1", 0)
    assert await asyncio.wait_for(running, WAIT_S) == 3
    assert sorted(o.row_index for o in sink.outcomes) == [0, 1, 2]
    assert len(tries) == 1, "tried once, not once per row left"


def test_rows_are_handed_over_one_broker_level_up() -> None:
    assert [hand_over_priority(level) for level in (0, 3, 8, 9)] == [1, 4, 9, 9]


async def test_a_canceled_jobs_rows_are_not_handed_over() -> None:
    router, sink = FakeRouter(gated=True), Sink()
    handed: list[SliceMessage] = []

    async def hand_over(rest: SliceMessage) -> None:
        handed.append(rest)

    runner = RowRunner(router, sink, concurrency=1, hand_over=hand_over)
    running = asyncio.create_task(runner.handle_slice(tagged("b1", range(4))))
    await router.next_started()
    runner.stop_starting()
    runner.cancel_job("b1")  # aborts the call in flight; the rest are dropped
    assert await asyncio.wait_for(running, WAIT_S) == 0
    assert handed == []


async def test_a_canceled_jobs_rows_are_dropped_without_waiting_for_a_slot() -> None:
    router, sink = FakeRouter(gated=True), Sink()
    runner = RowRunner(router, sink, concurrency=1)
    busy = asyncio.create_task(runner.handle_slice(tagged("b1", range(1))))
    await router.next_started()  # the only slot is taken
    runner.cancel_job("b2")
    assert await asyncio.wait_for(runner.handle_slice(tagged("b2", range(5))), WAIT_S) == 0
    router.open("b1", 0)
    assert await asyncio.wait_for(busy, WAIT_S) == 1


async def test_a_stopping_worker_hands_back_slices_it_has_not_started() -> None:
    router, sink = FakeRouter(gated=True), Sink()
    runner = RowRunner(router, sink, concurrency=2)
    begun = asyncio.create_task(runner.handle_slice(tagged("b1", range(3))))
    waiting = asyncio.create_task(runner.handle_slice(tagged("b2", range(2))))
    assert {await router.next_started() for _ in range(2)} == {("b1", 0), ("b1", 1)}
    runner.stop_starting()
    for index in range(3):
        router.open("b1", index)
    # b1 had started: it finishes, row 2 included. b2 had not: it goes back untouched.
    assert await asyncio.wait_for(begun, WAIT_S) == 3
    with pytest.raises(HandBack):
        await asyncio.wait_for(waiting, WAIT_S)
    assert sorted(i for _, i, _ in router.calls) == [0, 1, 2]
    assert {o.batch_id for o in sink.outcomes} == {"b1"}


async def test_canceled_job_rows_are_dropped_without_a_call() -> None:
    router, sink = FakeRouter(), Sink()
    runner = RowRunner(router, sink, concurrency=2)
    assert runner.cancel_job("b1") == 0
    assert await runner.handle_slice(make_task("b1", range(5))) == 0
    assert router.calls == []
    assert sink.outcomes == []
    # Other jobs are unaffected.
    assert await runner.handle_slice(make_task("b2", [0])) == 1


async def test_rows_of_a_job_past_its_deadline_are_dropped_without_a_call() -> None:
    router, sink = FakeRouter(), Sink()
    runner = RowRunner(router, sink, concurrency=2, clock=lambda: 1000.0)
    past = replace(make_task("b1", range(3)), expires_at=1000.0)
    assert await runner.handle_slice(past) == 0
    assert (router.calls, sink.outcomes) == ([], [])
    # A deadline still ahead, or none, runs every row.
    assert await runner.handle_slice(replace(make_task("b2", [0]), expires_at=1000.5)) == 1
    assert await runner.handle_slice(make_task("b3", [0])) == 1


async def test_cancel_aborts_in_flight_calls_and_drops_waiting_rows() -> None:
    router, sink = FakeRouter(gated=True), Sink()
    runner = RowRunner(router, sink, concurrency=2)
    running = asyncio.create_task(runner.handle_slice(tagged("b1", range(5))))
    started = {await router.next_started() for _ in range(2)}
    assert started == {("b1", 0), ("b1", 1)}

    assert runner.cancel_job("b1") == 2

    assert await asyncio.wait_for(running, WAIT_S) == 0
    assert sorted(router.cancelled) == [("b1", 0), ("b1", 1)]
    assert len(router.calls) == 2  # rows 2..4 never reached the router
    assert sink.outcomes == []
    assert router.in_flight == 0


async def test_a_cancel_before_a_row_task_started_gives_its_slot_back() -> None:
    """A cancel that lands right after a slice created a row's task, before its first
    step, cancels a task whose body never runs: its slot must still come back, or the
    worker runs out of slots and holds its slices unacked for good."""
    router, sink = FakeRouter(), Sink()
    runner = RowRunner(router, sink, concurrency=1)
    running = asyncio.create_task(runner.handle_slice(tagged("b1", range(2))))
    await asyncio.sleep(0)  # the slice creates row 0's task and waits for the slot
    assert runner.cancel_job("b1") == 1  # row 0's task has not run a step yet

    assert await asyncio.wait_for(running, WAIT_S) == 0
    assert router.calls == []
    # Every slot is free: another job's rows run.
    assert await asyncio.wait_for(runner.handle_slice(tagged("b2", [0])), WAIT_S) == 1


async def test_cancel_leaves_other_jobs_running() -> None:
    router, sink = FakeRouter(gated=True), Sink()
    runner = RowRunner(router, sink, concurrency=4)
    doomed = asyncio.create_task(runner.handle_slice(tagged("b1", range(2))))
    kept = asyncio.create_task(runner.handle_slice(tagged("b2", range(2))))
    assert {await router.next_started() for _ in range(4)} == {
        ("b1", 0),
        ("b1", 1),
        ("b2", 0),
        ("b2", 1),
    }
    assert runner.cancel_job("b1") == 2
    assert await asyncio.wait_for(doomed, WAIT_S) == 0
    router.open("b2", 0)
    router.open("b2", 1)
    assert await asyncio.wait_for(kept, WAIT_S) == 2
    assert sorted((o.batch_id, o.row_index) for o in sink.outcomes) == [("b2", 0), ("b2", 1)]
    assert sorted(router.cancelled) == [("b1", 0), ("b1", 1)]


async def test_router_exception_becomes_an_internal_error_outcome() -> None:
    router, sink = FakeRouter(fail_with=ValueError("boom")), Sink()
    prices = {"dep": Price(1.0, 1.0)}
    runner = RowRunner(router, sink, concurrency=2, prices=prices, monotonic=lambda: 7.0)
    assert await runner.handle_slice(make_task("b1", [0, 1])) == 2
    assert sorted(sink.outcomes, key=lambda o: o.row_index) == [
        RowOutcome("b1", i, None, "internal_error: ValueError", 1, False, None, 0, 0, latency_ms=0)
        for i in (0, 1)
    ]


async def test_sink_failure_propagates_from_handle_task() -> None:
    async def broken_sink(outcome: RowOutcome) -> None:
        raise RuntimeError("outcome publish failed")

    runner = RowRunner(FakeRouter(), broken_sink, concurrency=2)
    with pytest.raises(RuntimeError, match="outcome publish failed"):
        await runner.handle_slice(make_task("b1", [0, 1]))


def test_to_outcome_of_a_failure() -> None:
    result = RowResult(None, "upstream_error: a: HTTP 503: x", 4, None, dead_letter=True)
    assert to_outcome("b", 3, result) == RowOutcome(
        "b", 3, None, "upstream_error: a: HTTP 503: x", 4, True, None, 0, 0
    )
    assert to_outcome("b", 3, RowResult(None, None, 1, None)).error == "upstream_error: unknown"


def test_to_outcome_of_a_success_ignores_dead_letter() -> None:
    result = RowResult(Completion("hi", 1, 2), None, 2, "dep", dead_letter=True)
    assert to_outcome("b", 0, result) == RowOutcome("b", 0, "hi", None, 2, False, "dep", 1, 2)


@dataclass
class FakeMonotonic:
    """A monotonic clock the test moves by hand."""

    now: float = 100.0

    def __call__(self) -> float:
        return self.now


async def test_latency_is_the_rows_time_in_the_router() -> None:
    router, sink, clock = FakeRouter(gated=True), Sink(), FakeMonotonic()
    runner = RowRunner(router, sink, concurrency=2, monotonic=clock)
    running = asyncio.create_task(runner.handle_slice(make_task("m", [0])))
    assert await router.next_started() == ("m", 0)
    clock.now += 1.2345
    router.open("m", 0)
    assert await asyncio.wait_for(running, WAIT_S) == 1
    assert [o.latency_ms for o in sink.outcomes] == [1234]


async def test_cost_is_the_answering_deployments_price_of_its_tokens() -> None:
    sink = Sink()
    prices = {"dep": Price(prompt_per_mtok=1000.0, completion_per_mtok=2000.0)}
    runner = RowRunner(FakeRouter(), sink, concurrency=2, prices=prices)
    await runner.handle_slice(make_task("b1", [0, 1]))
    # 2 prompt and 3 completion tokens each (FakeRouter's answer)
    assert [o.cost_usd for o in sink.outcomes] == [pytest.approx(0.008)] * 2


async def test_an_unpriced_deployment_gives_no_cost() -> None:
    sink = Sink()
    runner = RowRunner(FakeRouter(), sink, concurrency=2, prices={"other": Price(1.0, 1.0)})
    await runner.handle_slice(make_task("b1", [0]))
    assert [o.cost_usd for o in sink.outcomes] == [None]


def test_to_outcome_costs_an_answer_and_never_an_error() -> None:
    price = Price(prompt_per_mtok=0.15, completion_per_mtok=0.60)
    answered = to_outcome("b", 0, RowResult(Completion("hi", 2000, 500), None, 1, "d"), 40, price)
    assert answered.cost_usd == pytest.approx((2000 * 0.15 + 500 * 0.60) / 1e6)
    assert answered.latency_ms == 40
    failed = to_outcome("b", 1, RowResult(None, "upstream_error: x", 4, "d"), 9000, price)
    assert (failed.cost_usd, failed.latency_ms) == (None, 9000)
    free = to_outcome("b", 2, RowResult(Completion("hi", 5, 5), None, 1, "d"), 1, Price())
    assert free.cost_usd == 0.0
    assert to_outcome("b", 3, RowResult(Completion("hi", 5, 5), None, 1, "d")).cost_usd is None


def test_to_outcome_bounds_latency_to_what_the_ledger_stores() -> None:
    result = RowResult(Completion("hi"), None, 1, "d")
    assert to_outcome("b", 0, result, 2**40).latency_ms == 2**31 - 1
    assert to_outcome("b", 0, result, -3).latency_ms == 0
    assert to_outcome("b", 0, result).latency_ms is None


def test_canceled_jobs_memory_is_bounded() -> None:
    canceled = CanceledJobs(capacity=2)
    for batch_id in ("a", "b", "a", "c"):
        canceled.add(batch_id)
    assert "a" in canceled
    assert "c" in canceled
    assert "b" not in canceled


# --- OutcomePublisher ----------------------------------------------------------------------


def outcome(index: int, batch_id: str = "b1") -> RowOutcome:
    return RowOutcome(batch_id, index, f"echo {index}", None, 1)


@dataclass
class FakePublish:
    """Records every published body; can be held on a gate or made to fail."""

    gate: asyncio.Event | None = None
    failures: int = 0
    bodies: list[bytes] = field(default_factory=list)
    shards: list[int] = field(default_factory=list)
    entered: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, shard: int, body: bytes) -> None:
        self.bodies.append(body)
        self.shards.append(shard)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise ConnectionError("broker away")

    def messages(self) -> list[list[int]]:
        return [[o.row_index for o in OutcomesMessage.decode(b).outcomes] for b in self.bodies]


async def test_flush_at_max_rows_without_waiting_for_the_timer() -> None:
    publish = FakePublish()
    publisher = OutcomePublisher(publish, max_rows=3, flush_s=3600)
    await asyncio.wait_for(asyncio.gather(*(publisher.add(outcome(i)) for i in range(3))), WAIT_S)
    assert publish.messages() == [[0, 1, 2]]
    assert OutcomesMessage.decode(publish.bodies[0]) == OutcomesMessage(
        tuple(map(outcome, range(3)))
    )


async def test_full_messages_go_out_as_they_fill() -> None:
    publish = FakePublish()
    publisher = OutcomePublisher(publish, max_rows=2, flush_s=3600)
    adds = [asyncio.create_task(publisher.add(outcome(i))) for i in range(5)]
    # Four rows make two full messages; the fifth waits for its (hour-long) timer.
    await asyncio.wait_for(asyncio.gather(*adds[:4]), WAIT_S)
    await settle()
    assert not adds[4].done()
    assert publish.messages() == [[0, 1], [2, 3]]
    await publisher.drain()
    await asyncio.wait_for(adds[4], WAIT_S)
    assert publish.messages() == [[0, 1], [2, 3], [4]]


async def test_an_outcomes_message_never_grows_past_its_byte_cap() -> None:
    # The aggregator's memory bound is its prefetch × this cap: an outcome that would
    # cross it sends what is pending first, and one larger than the cap goes alone.
    publish = FakePublish()
    cap = 64 * 1024
    publisher = OutcomePublisher(publish, max_rows=1000, flush_s=3600, max_bytes=cap)
    sizes = [20_000, 20_000, 20_000, 20_000, 100_000, 1_000]
    contents = [replace(outcome(i), content="x" * n) for i, n in enumerate(sizes)]
    adding = [asyncio.create_task(publisher.add(o)) for o in contents]
    await asyncio.sleep(0)
    await asyncio.wait_for(publisher.drain(), WAIT_S)
    await asyncio.wait_for(asyncio.gather(*adding), WAIT_S)
    assert publish.messages() == [[0, 1, 2], [3], [4], [5]]
    assert [len(b) <= cap for b in publish.bodies] == [True, True, False, True]


async def test_flush_by_time_for_fewer_rows() -> None:
    publish = FakePublish()
    publisher = OutcomePublisher(publish, max_rows=100, flush_s=0.005)
    await asyncio.wait_for(
        asyncio.gather(publisher.add(outcome(0)), publisher.add(outcome(1))), WAIT_S
    )
    assert publish.messages() == [[0, 1]]


async def test_add_returns_only_after_the_publish_completed() -> None:
    gate = asyncio.Event()
    publish = FakePublish(gate=gate)
    publisher = OutcomePublisher(publish, max_rows=2, flush_s=3600)
    adds = [asyncio.create_task(publisher.add(outcome(i))) for i in range(2)]
    await asyncio.wait_for(publish.entered.wait(), WAIT_S)
    await settle()
    assert not any(a.done() for a in adds)
    gate.set()
    await asyncio.wait_for(asyncio.gather(*adds), WAIT_S)
    assert publish.messages() == [[0, 1]]


async def test_publish_failure_propagates_to_every_waiter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outcomes_module, "PUBLISH_RETRY_S", 0)
    publish = FakePublish(failures=1000)
    publisher = OutcomePublisher(publish, max_rows=2, flush_s=3600, retry_for_s=0)
    results = await asyncio.wait_for(
        asyncio.gather(
            publisher.add(outcome(0)), publisher.add(outcome(1)), return_exceptions=True
        ),
        WAIT_S,
    )
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    assert all(str(r) == "outcome publish failed: ConnectionError('broker away')" for r in results)
    assert publish.messages() == [[0, 1]]


async def test_publish_is_retried_until_it_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    # A broker away for long (a restart, an outage): the answer is kept and published
    # once it is back, not given up after a few seconds (a row given up is paid twice).
    monkeypatch.setattr(outcomes_module, "PUBLISH_RETRY_S", 0)
    publish = FakePublish(failures=60)
    publisher = OutcomePublisher(publish, max_rows=1, flush_s=3600)
    await asyncio.wait_for(publisher.add(outcome(7)), WAIT_S)
    assert publish.messages() == [[7]] * 61


async def test_a_stopping_publisher_gives_up_a_failing_publish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outcomes_module, "PUBLISH_RETRY_S", 0.001)
    monkeypatch.setattr(outcomes_module, "DRAIN_RETRY_S", 0)
    publish = FakePublish(failures=10**9)
    publisher = OutcomePublisher(publish, max_rows=1, flush_s=3600)
    add = asyncio.create_task(publisher.add(outcome(7)))
    await asyncio.wait_for(publish.entered.wait(), WAIT_S)
    await asyncio.wait_for(publisher.drain(), WAIT_S)
    with pytest.raises(RuntimeError, match="outcome publish failed"):
        await asyncio.wait_for(add, WAIT_S)


async def test_drain_publishes_pending_outcomes() -> None:
    publish = FakePublish()
    publisher = OutcomePublisher(publish, max_rows=100, flush_s=3600)
    adds = [asyncio.create_task(publisher.add(outcome(i))) for i in range(3)]
    await settle()
    assert publish.bodies == []
    await asyncio.wait_for(publisher.drain(), WAIT_S)
    await asyncio.wait_for(asyncio.gather(*adds), WAIT_S)
    assert publish.messages() == [[0, 1, 2]]


async def test_drain_with_nothing_pending_publishes_nothing() -> None:
    publish = FakePublish()
    publisher = OutcomePublisher(publish, max_rows=10, flush_s=3600)
    await publisher.drain()
    assert publish.bodies == []


def test_outcomes_are_made_storable() -> None:
    from relay_batches.router.types import Completion, RowResult
    from relay_batches.services.row_worker.core import to_outcome

    done = to_outcome("b" * 32, 3, RowResult(Completion("a\x00b", 2**40, -5), None, 1, "d"))
    assert (done.content, done.prompt_tokens, done.completion_tokens) == ("a\ufffdb", 2**31 - 1, 0)
    failed = to_outcome("b" * 32, 4, RowResult(None, "upstream_error: d: HTTP 500: \x00", 2, None))
    assert failed.error == "upstream_error: d: HTTP 500: \ufffd"


def test_routes_without_limits_run_no_rate_limit_machinery() -> None:
    from relay_batches.ratelimit.parts import RateLimitParts, rate_limit_parts
    from relay_batches.router.aliases import AliasTable, Deployment
    from relay_batches.services.row_worker.__main__ import shared_limits

    table = AliasTable({"m": (Deployment("d", "openai", "http://127.0.0.1:9/v1", "x"),)})
    assert shared_limits(table, None) == (None, None)  # type: ignore[arg-type]
    assert rate_limit_parts(None, None) == RateLimitParts((), ())


def test_a_results_message_waits_for_no_more_outcomes_than_the_worker_holds_beyond_its_slots() -> (
    None
):
    # 16 slots, slices of 16: prefetch 3 slices (48 rows), so at most 32 outcomes can
    # gather while every slot is busy; waiting for 64 would idle the slots for a linger.
    assert rows_prefetch(16, 16) == 3
    assert outcome_batch_rows(64, 16, 16) == 32
    # Slices of 32: two slices (64 rows) beyond 16 slots leave 48.
    assert outcome_batch_rows(64, 16, 32) == 48
    # Large slices: the configured count is the cap.
    assert outcome_batch_rows(64, 16, 64) == 64
    # One slot, slices of one row: three rows held, two may wait.
    assert outcome_batch_rows(64, 1, 1) == 2
    assert outcome_batch_rows(1, 32, 16) == 1


async def test_a_held_slice_overtaken_hands_back_its_rows_and_the_higher_one_runs_first() -> None:
    router, sink = FakeRouter(gated=True), Sink()
    handed: list[SliceMessage] = []

    async def hand_over(rest: SliceMessage) -> None:
        handed.append(rest)

    runner = RowRunner(router, sink, concurrency=2, hand_over=hand_over)
    running = asyncio.create_task(runner.handle_slice(tagged("big", range(2))))
    assert {await router.next_started() for _ in range(2)} == {("big", 0), ("big", 1)}
    held = asyncio.create_task(runner.handle_slice(tagged("big", range(2, 6))))
    await asyncio.sleep(0.01)  # it waits for a slot
    assert runner.overtaken_below(1) == 1  # a new tenant's rows are queued at level 1
    assert await asyncio.wait_for(held, WAIT_S) == 0  # acked: nothing of it started here
    (rest,) = handed
    assert [r.index for r in rest.rows] == [2, 3, 4, 5]
    new = asyncio.create_task(runner.handle_slice(replace(tagged("new", range(2)), level=1)))
    later = asyncio.create_task(runner.handle_slice(tagged("big", range(6, 8))))
    await asyncio.sleep(0.01)
    router.open("big", 0)
    assert await router.next_started() == ("new", 0), "the higher slice takes the freed slot"
    router.gated = False
    for batch_id, index in (("big", 1), ("new", 0)):
        router.open(batch_id, index)
    assert await asyncio.wait_for(asyncio.gather(running, new, later), WAIT_S) == [2, 2, 2]
    assert runner.overtaken_below(1) == 0  # nothing waits any more


async def test_without_a_hand_over_a_held_slice_is_not_overtaken() -> None:
    router, sink = FakeRouter(), Sink()
    runner = RowRunner(router, sink, concurrency=1)
    assert runner.overtaken_below(5) == 0
    assert await asyncio.wait_for(runner.handle_slice(tagged("b1", range(3))), WAIT_S) == 3
