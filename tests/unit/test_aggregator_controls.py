"""The aggregator's side of the controls on rows not yet started: rows handed back in a
chunk are recorded for their job's next release; ``job.budget_stopped`` goes out when a
job's budget stops it and again at most every few seconds while its outcomes keep
coming (for row-workers that missed it), never for a job that ended."""

from __future__ import annotations

from collections.abc import Sequence

from relay_batches.bus.topology import EVENT_BUDGET_STOPPED, EVENT_PAUSED
from relay_batches.ledger.outcomes import JobProgress
from relay_batches.messages import JobEvent, OutcomesMessage, RowOutcome
from relay_batches.model import JobStatus
from relay_batches.services.aggregator.core import CANCEL_REPEAT_S, Aggregator
from tests.unit.test_aggregator_settle import Clock, SettlingStore


class ControlStore(SettlingStore):
    """Gives each recorded chunk's job the next of ``chunks``' counters."""

    def __init__(self, clock: Clock, chunks: list[JobProgress]) -> None:
        super().__init__(clock, [])
        self.chunks = chunks
        self.returned: list[tuple[str, int, int]] = []

    async def record(self, outcomes: Sequence[RowOutcome]) -> list[JobProgress]:
        return [self.chunks.pop(0)] if outcomes else []

    async def record_returned(self, returned: Sequence[tuple[str, int, int]]) -> int:
        self.returned += returned
        return len(returned)


def stopped(status: JobStatus = JobStatus.RUNNING) -> JobProgress:
    return JobProgress("b1", status, 10, 3, 0, 1, 0, "d1", budget_stopped=True)


async def test_budget_stops_are_announced_then_repeated_at_most_every_few_seconds() -> None:
    clock, published = Clock(), []

    async def publish(key: str, body: bytes) -> None:
        published.append((key, JobEvent.decode(body).batch_id))

    chunks = [stopped(), stopped(), stopped(), stopped(JobStatus.FAILED)]
    aggregator = Aggregator(ControlStore(clock, chunks), publish, clock)
    outcome = RowOutcome("b1", 0, "ok", None, 1)

    def stops() -> int:
        return published.count((EVENT_BUDGET_STOPPED, "b1"))

    await aggregator.record([outcome])
    assert stops() == 1
    clock.now += CANCEL_REPEAT_S / 2
    await aggregator.record([outcome])
    assert stops() == 1
    clock.now += CANCEL_REPEAT_S
    await aggregator.record([outcome])
    assert stops() == 2
    clock.now += CANCEL_REPEAT_S
    await aggregator.record([outcome])  # the job ended: nobody holds its rows
    assert stops() == 2


async def test_rows_handed_back_are_recorded_with_the_chunk() -> None:
    clock = Clock()

    async def publish(key: str, body: bytes) -> None:
        return None

    store = ControlStore(clock, [])
    aggregator = Aggregator(store, publish, clock)
    await aggregator.record_messages([OutcomesMessage((), (("b1", 4, 0), ("b1", 5, 0)))])
    assert store.returned == [("b1", 4, 0), ("b1", 5, 0)]


async def test_a_pause_is_repeated_while_outcomes_of_the_paused_job_keep_coming() -> None:
    clock, published = Clock(), []

    async def publish(key: str, body: bytes) -> None:
        published.append((key, JobEvent.decode(body)))

    paused = JobProgress("b1", JobStatus.PAUSED, 10, 3, 0, 1, 0, None, pauses=2)
    aggregator = Aggregator(ControlStore(clock, [paused, paused, paused]), publish, clock)
    outcome = RowOutcome("b1", 0, "ok", None, 1)

    await aggregator.record([outcome])
    clock.now += CANCEL_REPEAT_S / 2
    await aggregator.record([outcome])
    clock.now += CANCEL_REPEAT_S
    await aggregator.record([outcome])

    pauses = [(e.batch_id, e.pauses) for key, e in published if key == EVENT_PAUSED]
    assert pauses == [("b1", 2), ("b1", 2)]
