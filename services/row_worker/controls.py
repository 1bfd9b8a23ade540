"""Controls that act on the rows a row-worker holds and has not started: a pause and a
budget stop (a cancel and an expiry drop rows in :mod:`.core`).

A slice carries its job's pause count at its release. ``job.paused`` tells every worker
the job's new count: from then on the rows it has not started of that job's slices
released before the pause (a lower count) are **handed back**: published, confirmed, to
the job's results shard as returned rows, which the aggregator records in the ledger
(``returned_rows``) and the job's dispatcher releases again first once the job is
resumed and claimed. Slices released after the resume carry the new count and run, so
no resume event is needed and a worker that missed the pause simply runs its rows. A
slice the offloader forwards (count ``UNPAUSED``) is never handed back: no dispatcher
would release its rows again.
``job.budget_stopped`` (the aggregator recorded the cost that reached the job's
budget) makes the rows not started of any slice of that job **withheld**: each gets
the error outcome :data:`~relay_batches.model.BUDGET_HELD_ERROR` (0 attempts), so the
overshoot of a budget is the rows started when it was reached.

Either way the slice is acked only after that message is confirmed; if it is not, the
slice goes back to the broker and is handled again (recording both is idempotent).
Memory is bounded: the oldest jobs are forgotten past :data:`CONTROL_MEMORY`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from enum import StrEnum
from typing import Any

from relay_batches.bus.topology import results_shard
from relay_batches.messages import DecodedSlice, OutcomesMessage, RowOutcome
from relay_batches.metrics import ROWS_DROPPED
from relay_batches.model import BUDGET_HELD_ERROR

log = logging.getLogger("relay.row_worker")

CONTROL_MEMORY = 10_000
Publish = Callable[[int, bytes], Awaitable[None]]  # (results shard, body), confirmed


class Halt(StrEnum):
    """Why the rows a worker has not started of a slice do not start."""

    PAUSED = "paused"  # handed back, to run after the resume
    BUDGET = "budget"  # withheld: each gets the budget error outcome


class JobControls:
    """The pauses and budget stops this worker was told of, and the hand-back of the
    rows they keep from starting."""

    def __init__(self, publish: Publish, shards: int, capacity: int = CONTROL_MEMORY) -> None:
        self._publish = publish
        self._shards = shards
        self._capacity = capacity
        self._pauses: OrderedDict[str, int] = OrderedDict()
        self._stopped: OrderedDict[str, None] = OrderedDict()

    def pause(self, batch_id: str, pauses: int) -> None:
        """The job was paused for the ``pauses``-th time."""
        self._pauses[batch_id] = max(pauses, self._pauses.get(batch_id, 0))
        _remember(self._pauses, batch_id, self._capacity)

    def budget_stop(self, batch_id: str) -> None:
        """The job's recorded cost reached its budget."""
        self._stopped[batch_id] = None
        _remember(self._stopped, batch_id, self._capacity)

    def halt(self, job_slice: DecodedSlice) -> Halt | None:
        """Why the slice's next row may not start, or None."""
        if job_slice.batch_id in self._stopped:
            return Halt.BUDGET
        if 0 <= job_slice.pauses < self._pauses.get(job_slice.batch_id, 0):
            return Halt.PAUSED
        return None

    async def set_aside(self, job_slice: DecodedSlice, rows: Sequence[int], halt: Halt) -> None:
        """Hand back (paused) or withhold (budget) the slice's ``rows`` not started, in
        one confirmed message to the job's results shard."""
        if not rows:
            return
        batch_id = job_slice.batch_id
        if halt is Halt.PAUSED:
            returned = tuple((batch_id, index, job_slice.pauses) for index in rows)
            message = OutcomesMessage((), returned)
        else:
            message = OutcomesMessage(
                tuple(RowOutcome(batch_id, index, None, BUDGET_HELD_ERROR, 0) for index in rows)
            )
        await self._publish(results_shard(batch_id, self._shards), message.encode())
        ROWS_DROPPED.inc(len(rows))
        log.info(
            "rows_handed_back" if halt is Halt.PAUSED else "rows_withheld",
            extra={"batch_id": batch_id, "rows": len(rows)},
        )


def _remember(ids: OrderedDict[str, Any], batch_id: str, capacity: int) -> None:
    ids.move_to_end(batch_id)
    while len(ids) > capacity:
        ids.popitem(last=False)
