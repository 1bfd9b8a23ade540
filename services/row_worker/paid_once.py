"""Paying for each row once: a row that has an answer is not sent upstream again.

A slice comes back when its former holder never acked it: the holder died (``kill -9``)
or its channel closed (a broker outage, a dropped connection), and the broker gives the
slice, flagged ``redelivered``, to whoever consumes next. Stall recovery re-sends rows
too (a slice marked ``resent``). Some of those rows were answered already. Before
running such a slice, :class:`PaidOnce` drops the rows that have an outcome:

1. rows this worker still runs under an earlier delivery of theirs (a delivery whose
   channel closed, now redelivered to the same worker) are waited for first;
2. rows this worker answered lately (:class:`AnsweredRows`: confirmed, remembered up to
   a bound, or being published, waited for);
3. after :data:`REDELIVERY_WAIT_S` (so the outcomes another holder confirmed just
   before it died, still on the results queue, get recorded, and one that lost its
   connection can reconnect and publish the answers it kept), rows with an outcome in
   the ledger: one primary-key query for the slice
   (:func:`~relay_batches.ledger.answered.answered_rows`), retried while the ledger is
   away for up to :data:`LEDGER_WAIT_S`, after which the slice runs whole (a row may then
   be paid twice, never counted twice).

And a worker whose delivery's channel closed starts no more of its rows
(:meth:`~relay_batches.services.row_worker.core.RowRunner.handle_slice`'s ``live``): the
broker has put the slice back for another worker. Rows already in flight finish and their
outcomes are published once the broker is back (the publisher retries for
:data:`~relay_batches.services.row_worker.outcomes.PUBLISH_RETRY_FOR_S`).

What is left (the residual window): a row answered and whose outcome is not yet
confirmed by the broker when its worker dies (the outcome's linger, at most
``RELAY_RESULTS_FLUSH_MS``, plus one publish round trip; ``relay_outcome_unconfirmed_seconds``
measures it), or whose call was in flight then, is run again; so is a row still in
flight at another worker that lost its channel, when that call outlasts the outage and
the redelivery wait, or whose outcome reaches the ledger only after the wait.
A slice handed back untouched (a stopping worker's) comes back flagged too: it waits
and asks like any other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from relay_batches.errors import TransientError
from relay_batches.kit.consumer import Delivery
from relay_batches.messages import DecodedSlice, RowOutcome
from relay_batches.metrics import ROWS_ALREADY_ANSWERED

log = logging.getLogger("relay.row_worker")

# Long enough for a former holder that lost its connection to reconnect (clients retry
# every RECONNECT_INTERVAL_S, 2 s), publish the answers it kept and the aggregator to
# record them; a redelivered slice's rows start that much later. RELAY_REDELIVERY_WAIT_S
# (this by default): on a broker cluster the kept answers also wait for a new leader of
# their results queue when the old one's node was lost.
REDELIVERY_WAIT_S = 4.0
LEDGER_WAIT_S = 60.0
LEDGER_RETRY_S = 1.0
ANSWERED_MEMORY = 50_000  # rows (a key each, ~150 bytes): the worker's recent answers

Key = tuple[str, int]
OutcomeSink = Callable[[RowOutcome], Awaitable[None]]
LedgerAnswered = Callable[[str, Sequence[int]], Awaitable[set[int]]]
RunSlice = Callable[[DecodedSlice, Callable[[], bool]], Awaitable[int]]


class AnsweredRows:
    """Rows this worker answered: those whose outcome the broker confirmed (the latest
    ``capacity``) and those whose outcome is being published (with whether it lands)."""

    def __init__(self, capacity: int = ANSWERED_MEMORY) -> None:
        self._capacity = capacity
        self._confirmed: OrderedDict[Key, None] = OrderedDict()
        # Outcomes being published, each with the futures of those waiting to learn
        # whether it lands (made only when one asks: a redelivered slice, seldom).
        self._pending: dict[Key, _Publishing] = {}

    def sink(self, inner: OutcomeSink) -> OutcomeSink:
        """``inner`` (the outcome publisher's ``add``), remembering each outcome."""

        async def add(outcome: RowOutcome) -> None:
            key = (outcome.batch_id, outcome.row_index)
            publishing = _Publishing()
            self._pending[key] = publishing
            confirmed = False
            try:
                await inner(outcome)
                confirmed = True
            finally:
                if self._pending.get(key) is publishing:
                    del self._pending[key]
                if confirmed:
                    self._remember(key)
                publishing.settle(confirmed)

        return add

    def _remember(self, key: Key) -> None:
        self._confirmed[key] = None  # a row is answered once here: no need to move it
        while len(self._confirmed) > self._capacity:
            self._confirmed.popitem(last=False)

    async def answered(self, batch_id: str, indexes: Sequence[int]) -> set[int]:
        """Those of ``indexes`` this worker answered; one whose outcome is being
        published counts once the broker confirmed it (it is waited for)."""
        found: set[int] = set()
        waits: dict[int, asyncio.Future[bool]] = {}
        for index in indexes:
            key = (batch_id, index)
            if key in self._confirmed:
                found.add(index)
            elif (publishing := self._pending.get(key)) is not None:
                waits[index] = publishing.landed()
        if waits:
            landed_all = await asyncio.gather(*(asyncio.shield(f) for f in waits.values()))
            found.update(index for index, ok in zip(waits, landed_all, strict=True) if ok)
        return found


class _Publishing:
    """One outcome being published, and the futures told whether it landed."""

    __slots__ = ("waiters",)

    def __init__(self) -> None:
        self.waiters: list[asyncio.Future[bool]] | None = None

    def landed(self) -> asyncio.Future[bool]:
        """A future set to whether the outcome landed, once its publish ends."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self.waiters is None:
            self.waiters = []
        self.waiters.append(future)
        return future

    def settle(self, confirmed: bool) -> None:
        """The publish ended: tell the waiters whether it landed."""
        for future in self.waiters or ():
            if not future.done():
                future.set_result(confirmed)


class PaidOnce:
    """The row-worker's handler of ``rows`` deliveries: a redelivered or re-sent slice
    loses the rows that have an outcome, and a slice stops starting rows once its
    delivery's channel closed (``run`` is the runner's ``handle_slice``)."""

    def __init__(
        self,
        run: RunSlice,
        answered: AnsweredRows,
        ledger: LedgerAnswered | None = None,
        *,
        wait_s: float = REDELIVERY_WAIT_S,
        ledger_wait_s: float = LEDGER_WAIT_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._run = run
        self._answered = answered
        self._ledger = ledger
        self._wait_s = wait_s
        self._ledger_wait_s = ledger_wait_s
        self._sleep = sleep
        self._monotonic = monotonic
        # Rows of the deliveries this worker is running, each with its delivery's end.
        self._running: dict[Key, asyncio.Future[None]] = {}

    async def handle(self, delivery: Delivery[DecodedSlice]) -> int:
        """Run the rows of ``delivery`` that have no outcome; return how many got one."""
        job_slice = delivery.value
        if delivery.redelivered or job_slice.resent:
            job_slice = await self._unanswered(job_slice)
            if not job_slice.rows or not delivery.open():
                return 0
        return await self._running_rows(job_slice, delivery.open)

    async def _running_rows(self, job_slice: DecodedSlice, live: Callable[[], bool]) -> int:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        keys = [(job_slice.batch_id, index) for index, _ in job_slice.rows]
        for key in keys:
            self._running[key] = done
        try:
            return await self._run(job_slice, live)
        finally:
            for key in keys:
                if self._running.get(key) is done:
                    del self._running[key]
            done.set_result(None)

    async def _unanswered(self, job_slice: DecodedSlice) -> DecodedSlice:
        """``job_slice`` without the rows that have an outcome (module doc, steps 1–3)."""
        batch_id = job_slice.batch_id
        indexes = [index for index, _ in job_slice.rows]
        mine = await self._answered_here(batch_id, indexes)
        rest = [index for index in indexes if index not in mine]
        recorded: set[int] = set()
        if rest and self._ledger is not None:
            await self._sleep(self._wait_s)
            recorded = await self._recorded(batch_id, rest)
            # Another delivery of them may have started here meanwhile (a re-sent copy).
            mine |= await self._answered_here(batch_id, [i for i in rest if i not in recorded])
        if not (mine or recorded):
            return job_slice
        ROWS_ALREADY_ANSWERED.labels("worker").inc(len(mine))
        ROWS_ALREADY_ANSWERED.labels("ledger").inc(len(recorded))
        log.info(
            "answered_rows_skipped",
            extra={"batch_id": batch_id, "rows": len(indexes), "worker": len(mine),
                   "ledger": len(recorded)},
        )  # fmt: skip
        skip = mine | recorded
        return replace(job_slice, rows=tuple(row for row in job_slice.rows if row[0] not in skip))

    async def _answered_here(self, batch_id: str, indexes: Sequence[int]) -> set[int]:
        """Those of ``indexes`` this worker answered, once the runs of them it still has
        under other deliveries (one whose channel closed) are over."""
        keys = ((batch_id, index) for index in indexes)
        earlier = {self._running[key] for key in keys if key in self._running}
        if earlier:
            await asyncio.gather(*(asyncio.shield(f) for f in earlier))
        return await self._answered.answered(batch_id, indexes)

    async def _recorded(self, batch_id: str, indexes: Sequence[int]) -> set[int]:
        """Rows of ``indexes`` with an outcome in the ledger; none if it stays away."""
        assert self._ledger is not None
        give_up = self._monotonic() + self._ledger_wait_s
        while True:
            try:
                return await self._ledger(batch_id, indexes)
            except TransientError as exc:
                if self._monotonic() + LEDGER_RETRY_S > give_up:
                    log.warning(
                        "answered_check_failed",
                        extra={"batch_id": batch_id, "rows": len(indexes), "error": str(exc)},
                    )
                    return set()
                await self._sleep(LEDGER_RETRY_S)
