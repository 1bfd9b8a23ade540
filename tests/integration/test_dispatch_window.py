"""The dispatcher's byte window on the real ledger: a job of big rows keeps at most
``window_bytes`` of message text in flight, measured from the stored rows."""

from __future__ import annotations

import asyncpg
import orjson

from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.messages import JobEvent, RowOutcome, SliceMessage
from relay_batches.services.dispatcher.core import DispatchConfig, Dispatcher

KIB = 1024
BUDGET = 1024 * KIB


def messages(index: int, size: int) -> str:
    """A messages document of about ``size`` bytes."""
    return orjson.dumps([{"role": "user", "content": f"{index} " + "x" * size}]).decode()


class Published:
    """The slices a dispatcher released for one job (it may claim others queued by other
    tests of the session)."""

    def __init__(self, batch_id: str) -> None:
        self.batch_id = batch_id
        self.tasks: list[SliceMessage] = []

    async def publish(self, task: SliceMessage, priority: int) -> None:
        if task.batch_id == self.batch_id:
            self.tasks.append(task)

    async def announce(self, event: JobEvent) -> None:
        raise AssertionError(f"unexpected job failure {event}")

    def rows(self) -> list[int]:
        return [r.index for t in self.tasks for r in t.rows]

    def in_flight(self, done: set[int]) -> int:
        """Bytes of message text published whose row has no outcome."""
        return sum(len(r.request_json) for t in self.tasks for r in t.rows if r.index not in done)


async def test_a_job_of_big_rows_keeps_its_message_bytes_in_flight_within_the_window(
    pool: asyncpg.Pool,
) -> None:
    sizes = [300 * KIB] * 10 + [3 * BUDGET // 2] + [300 * KIB] * 5
    workspace = await KeyStore(pool).ensure_workspace(f"win-{new_id()[:6]}")
    batch = await JobStore(pool).create(
        NewJob(new_id(), workspace, "win", "gpt-4o-mini", 0, len(sizes), None, None, None),
        ((f"c-{i}", messages(i, size)) for i, size in enumerate(sizes)),
    )
    published = Published(batch.id)
    config = DispatchConfig("dispatcher-bytes", 1024, 4, 1000, lease_s=30, window_bytes=BUDGET)
    dispatcher = Dispatcher(
        DispatchStore(pool), published.publish, published.announce, lambda _: True, config
    )
    await dispatcher.claim()
    # 1,024 rows of room, but only three 300 KiB rows fit 1 MiB.
    assert published.rows() == [0, 1, 2]

    done: set[int] = set()
    peaks: list[int] = []
    while len(done) < len(sizes):
        pending = [i for i in published.rows() if i not in done]
        assert pending, f"nothing in flight and nothing released after {sorted(done)}"
        await OutcomeStore(pool).record([RowOutcome(batch.id, pending[0], "ok", None, 1)])
        done.add(pending[0])
        await dispatcher.renew()
        flying = published.in_flight(done)
        peaks.append(flying)
        lone_big_row = [i for i in published.rows() if i not in done] == [10]
        assert flying <= BUDGET or lone_big_row, (sorted(done), flying)

    assert sorted(published.rows()) == list(range(len(sizes)))
    assert len(published.rows()) == len(sizes)  # each row released once
    upto = await pool.fetchval("SELECT dispatched_upto FROM batches WHERE id = $1", batch.id)
    assert upto == len(sizes)
    assert max(peaks) > BUDGET  # the row bigger than the window went out, alone
