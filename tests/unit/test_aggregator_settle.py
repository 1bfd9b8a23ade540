"""Unit tests of the aggregator's budget settle in its outbox pass: bounded in time per
pass, each step announced as a chunk is, and never in the way of the announcements."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from relay_batches.bus.topology import EVENT_FINISHED, progress_key
from relay_batches.ledger.outcomes import JobProgress
from relay_batches.messages import JobEvent, RowOutcome
from relay_batches.model import JobStatus
from relay_batches.services.aggregator.core import SETTLE_PASS_S, Aggregator


class Clock:
    """A settable clock (the store moves it 0.3 s per settle step)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SettlingStore:
    """An aggregator store with ``steps`` settle steps to give, each taking 0.3 s."""

    def __init__(self, clock: Clock, steps: list[JobProgress], broken: bool = False) -> None:
        self.clock, self.steps, self.broken = clock, steps, broken
        self.calls: list[str] = []
        self.marked: list[str] = []

    async def record(self, outcomes: Sequence[RowOutcome]) -> list[JobProgress]:
        return []

    async def snapshot(self, batch_ids: list[str]) -> list[JobProgress]:
        return [JobProgress(b, JobStatus.FAILED, 4, 1, 3) for b in batch_ids]

    async def canceled_among(self, batch_ids: list[str]) -> list[tuple[str, JobStatus]]:
        return []

    async def unannounced_terminal(self, older_than_s: float, limit: int = 100) -> list[str]:
        self.calls.append("unannounced")
        return ["old"]

    async def mark_finished_published(self, batch_ids: list[str]) -> None:
        self.marked += batch_ids

    async def settle_budget_stops(self) -> list[JobProgress]:
        self.calls.append("settle")
        if self.broken:
            raise ConnectionError("ledger away")
        if not self.steps:
            return []
        self.clock.now += 0.3
        return [self.steps.pop(0)]


OWNER = "dispatcher-1"
TO_OWNER = progress_key(OWNER)


def step(
    batch_id: str,
    failed: int,
    new: int,
    status: JobStatus = JobStatus.RUNNING,
    owner: str | None = OWNER,
) -> JobProgress:
    return JobProgress(batch_id, status, 100, 1, failed, 0, new, owner)


async def test_a_pass_settles_for_about_a_second_and_announces_every_step() -> None:
    clock, events = Clock(), []

    async def publish(kind: str, body: bytes) -> None:
        events.append((kind, JobEvent.decode(body)))

    steps = [step("big", 10 * (i + 1), 10) for i in range(6)]
    store = SettlingStore(clock, steps)
    aggregator = Aggregator(store, publish, clock=clock)
    assert await aggregator.settle_budget_stops() == 40  # 4 steps: 1.2 s >= SETTLE_PASS_S
    assert SETTLE_PASS_S == 1.0 and len(store.steps) == 2, "the rest waits for the next pass"
    assert [(k, e.failed) for k, e in events] == [(TO_OWNER, f) for f in (10, 20, 30, 40)]

    events.clear()
    store.steps.append(step("big", 99, 39, JobStatus.FAILED))
    assert await aggregator.settle_budget_stops() == 59
    assert [(k, e.status, e.failed) for k, e in events] == [
        (TO_OWNER, "running", 50),
        (TO_OWNER, "running", 60),
        (TO_OWNER, "failed", 99),
        (EVENT_FINISHED, "failed", 99),
    ]
    assert store.marked == ["big"]


async def test_progress_goes_to_the_owner_only_and_nowhere_for_a_job_without_one() -> None:
    clock, events = Clock(), []

    async def publish(kind: str, body: bytes) -> None:
        events.append((kind, JobEvent.decode(body).batch_id))

    steps = [step("owned", 10, 10), step("paused", 10, 10, owner=None)]
    steps.append(step("odd", 10, 10, owner="pod.7*#"))
    aggregator = Aggregator(SettlingStore(clock, steps), publish, clock=clock)
    assert await aggregator.settle_budget_stops() == 30
    assert events == [
        ("job.progress.dispatcher-1", "owned"),
        ("job.progress.pod_7__", "odd"),  # one topic word, no wildcard
    ]


async def test_the_outbox_pass_announces_first_so_a_failing_settle_blocks_nothing() -> None:
    clock, events = Clock(), []

    async def publish(kind: str, body: bytes) -> None:
        events.append((kind, JobEvent.decode(body).batch_id))

    store = SettlingStore(clock, [], broken=True)
    with pytest.raises(ConnectionError):
        await Aggregator(store, publish, clock=clock).outbox_pass(2.0)
    assert store.calls == ["unannounced", "settle"]
    assert events == [(EVENT_FINISHED, "old")] and store.marked == ["old"]
