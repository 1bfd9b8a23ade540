"""Running the rows of one slice: bounded concurrency, cancel, outcome per row.

No aio-pika or asyncpg here: tests drive :class:`RowRunner` with a fake router and a
fake outcome sink.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from relay_batches.dialects.endpoints import CHAT
from relay_batches.errors import HandBack
from relay_batches.messages import DecodedSlice, RowOutcome, RowRequest, SliceMessage
from relay_batches.metrics import (
    DELIVERIES_LOST,
    ROWS_DROPPED,
    ROWS_IN_FLIGHT,
    ROWS_OVERTAKEN,
    ROWS_PROCESSED,
)
from relay_batches.outcome import to_outcome
from relay_batches.router.aliases import Price
from relay_batches.router.types import RowResult
from relay_batches.services.row_worker.controls import Halt, JobControls
from relay_batches.services.row_worker.holdings import Holdings
from relay_batches.services.row_worker.start_gate import StartGate, Turn
from relay_batches.services.row_worker.traced import RowSpans

log = logging.getLogger("relay.row_worker")
ROWS_WITH_CONTENT = ROWS_PROCESSED.labels("content")
ROWS_WITH_ERROR = ROWS_PROCESSED.labels("error")

CANCELED_MEMORY = 10_000


class Router(Protocol):
    """What the runner needs of the model router."""

    async def complete(
        self,
        alias: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        workspace: str = "",
        endpoint: str = CHAT,
    ) -> RowResult:
        """Run one row through its alias, over connections of ``workspace``'s own (a row
        of another ``endpoint`` than chat: its body as ``params``)."""


OutcomeSink = Callable[[RowOutcome], Awaitable[None]]
Flush = Callable[[str], None]  # send a job's outcomes gathered so far without waiting
HandOver = Callable[[SliceMessage], Awaitable[None]]  # publish rows not started, confirmed


# Rows calling a model in this process, read when /metrics is scraped (a gauge moved per
# row would take a lock twice a row on the hot path).
_in_flight = 0


def _rows_in_flight() -> float:
    return _in_flight


ROWS_IN_FLIGHT.set_function(_rows_in_flight)


class _RowStart:
    """Whether a row's task ran its first step: one cancelled before (a cancel arriving
    right after its slice created it) never runs its body, so its slot is given back by
    its done callback instead of its ``finally``."""

    __slots__ = ("began",)

    def __init__(self) -> None:
        self.began = False


class _SlotOutcome:
    """What became of a row's wait for a slot (see ``RowRunner._slot_after_wait``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_START = _SlotOutcome("start")  # a slot is held: the row starts
_SKIP = _SlotOutcome("skip")  # its job was canceled: the next row is looked at
_STOP = _SlotOutcome("stop")  # no more rows of the slice start here
_Slot = _SlotOutcome | Halt


class _SliceProgress:
    """Rows of one slice started and still without an outcome; :meth:`finish_one` says
    whether the outcome being made is the slice's last (every row started, none left)."""

    def __init__(self) -> None:
        self.open = 0
        self.starting = True

    def finish_one(self) -> bool:
        self.open -= 1
        return self.open == 0 and not self.starting


class CanceledJobs:
    """Jobs known to be canceled (bounded memory: the oldest are forgotten)."""

    def __init__(self, capacity: int = CANCELED_MEMORY) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def add(self, batch_id: str) -> None:
        """Remember ``batch_id`` as canceled."""
        self._ids[batch_id] = None
        self._ids.move_to_end(batch_id)
        while len(self._ids) > self._capacity:
            self._ids.popitem(last=False)

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._ids


class RowRunner:
    """Runs the rows of slices with at most ``concurrency`` upstream calls in flight."""

    def __init__(
        self,
        router: Router,
        sink: OutcomeSink,
        concurrency: int,
        holdings: Holdings | None = None,
        clock: Callable[[], float] = time.time,
        prices: Mapping[str, Price] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        flush: Flush | None = None,
        hand_over: HandOver | None = None,
        controls: JobControls | None = None,
        references: Mapping[str, Price] | None = None,
        spans: RowSpans | None = None,
    ) -> None:
        self._router = router
        self._spans = spans  # each row's span in a traced job's trace (None: tracing off)
        self.controls = controls  # pauses and budget stops (see .controls)
        self._clock = clock
        self._prices: Mapping[str, Price] = prices or {}
        # Each deployment's realtime reference price (the saving against all-realtime).
        self._references: Mapping[str, Price] = references or {}
        self._monotonic = monotonic
        self._sink = sink
        self._flush = flush
        self._hand_over = hand_over
        # The slots, given to the held slices best broker level first, and among equals
        # one slice after another: interleaved, the slices a worker holds would all end
        # together and leave every slot idle until the broker sends more (no slice comes
        # until one is acked); in order, the first is done and acked while the next runs.
        self._slots = StartGate(concurrency)
        self._holdings = holdings if holdings is not None else Holdings("row-worker", 1.0)
        self.canceled = CanceledJobs()
        self._running: dict[str, set[asyncio.Task[None]]] = {}
        self._stopping = False

    def stop_starting(self) -> None:
        """The service is stopping: a slice that has not started a row yet is handed back
        to the broker untouched (no paid call is begun that the grace period might cut
        off); a slice that has started finishes the rows it started and hands the rest
        over, published as a slice of their own (confirmed) before it is acked, so the
        stop waits for the rows already started, not a whole slice, and the rest run
        once, elsewhere (twice only if this worker dies between the hand-over and the
        ack; never counted twice). Without a hand-over, or if publishing it fails (it is
        tried once), the slice starts its other rows too."""
        self._stopping = True

    def cancel_job(self, batch_id: str) -> int:
        """Mark a job canceled and abort its in-flight calls; return how many were aborted."""
        self.canceled.add(batch_id)
        tasks = self._running.pop(batch_id, set())
        for task in tasks:
            task.cancel()
        log.info("job_canceled", extra={"batch_id": batch_id, "aborted": len(tasks)})
        return len(tasks)

    async def handle_slice(
        self, job_slice: DecodedSlice, live: Callable[[], bool] = lambda: True
    ) -> int:
        """Run every row of ``job_slice``; return once each has a confirmed outcome (or was
        dropped).

        Returns the number of rows that got an outcome. The slice's rows count as held
        by this worker (its heartbeat says so) until then. Once ``live()`` is False (its
        delivery's channel closed: the broker gives the slice to another worker) no
        further row starts; those started finish.
        """
        token = self._holdings.take(job_slice)
        try:
            return await self._run_slice(job_slice, live)
        finally:
            self._holdings.leave(token)

    async def _run_slice(self, job_slice: DecodedSlice, live: Callable[[], bool]) -> int:
        started: list[asyncio.Task[None]] = []
        progress = _SliceProgress()
        hand_over = self._hand_over  # tried at most once per slice
        halted: tuple[int, Halt] | None = None  # from where, and why, the rest is set aside
        turn = self._slots.join(job_slice.level)
        loop = asyncio.get_running_loop()
        try:
            for position, (index, request) in enumerate(job_slice.rows):
                if self._dropped(job_slice):  # without waiting for a slot
                    continue
                if (halt := self._halt(job_slice)) is not None:
                    halted = (position, halt)
                    break
                slot = self._slot_at_once(turn, job_slice, live)
                if slot is None:
                    slot = await self._slot_after_wait(turn, job_slice, position, live)
                if slot is _SKIP:
                    continue
                if slot is not _START:
                    halted = (position, slot) if isinstance(slot, Halt) else None
                    break
                if self._stopping and not started:
                    self._slots.release()
                    raise HandBack(f"stopping: slice of {job_slice.batch_id} not started")
                if self._stopping and hand_over is not None:
                    handed = await self._handed_over(hand_over, job_slice, position)
                    hand_over = None
                    if handed:
                        self._slots.release()
                        break
                started.append(self._start_row(loop, job_slice, index, request, progress))
        finally:
            self._slots.leave(turn)
        progress.starting = False
        if started and progress.open == 0:
            self._flush_soon(job_slice.batch_id)
        return await self._finish(job_slice, started, halted)

    async def _finish(
        self,
        job_slice: DecodedSlice,
        started: list[asyncio.Task[None]],
        halted: tuple[int, Halt] | None,
    ) -> int:
        """Wait for the rows ``started`` of ``job_slice``, then set the rows a ``halted``
        kept from starting aside; return how many rows got an outcome."""
        results = await asyncio.gather(*started, return_exceptions=True)
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            raise failures[0]
        if halted is not None and self.controls is not None:
            position, halt = halted
            rest = [i for i, _ in job_slice.rows[position:]]
            await self.controls.set_aside(job_slice, rest, halt)
        return sum(1 for r in results if r is None)

    def _start_row(
        self,
        loop: asyncio.AbstractEventLoop,
        job_slice: DecodedSlice,
        index: int,
        request: RowRequest,
        progress: _SliceProgress,
    ) -> asyncio.Task[None]:
        """Start row ``index`` of ``job_slice`` on the slot just taken (``loop`` is the
        running loop, looked up once a slice)."""
        start = _RowStart()
        row = loop.create_task(
            self._run_row(job_slice, index, request, progress, start),
            name=f"row-{job_slice.batch_id}-{index}",
        )
        progress.open += 1
        self._running.setdefault(job_slice.batch_id, set()).add(row)
        row.add_done_callback(functools.partial(self._forget, job_slice.batch_id, start))
        return row

    def overtaken_below(self, level: int) -> int:
        """Rows of ``level`` are queued in the broker (a ``job.overtaking``): the slices
        held here below it that wait for a slot hand their rows not started back, so the
        broker can deliver the higher ones at once (without a hand-over, nothing
        changes). Returns how many slices were told."""
        if self._hand_over is None:
            return 0
        return self._slots.overtake(level)

    def _slot_at_once(
        self, turn: Turn, job_slice: DecodedSlice, live: Callable[[], bool]
    ) -> _Slot | None:
        """The row's slot without waiting, if ``turn`` may take one now (nothing checked
        before can have changed then): _START, or _STOP if its delivery is lost (its rows
        are the broker's again: another worker runs them); None if it must wait."""
        if not self._slots.take(turn):
            return None
        if live():
            return _START
        self._slots.release()
        self._delivery_lost(job_slice)
        return _STOP

    async def _slot_after_wait(
        self, turn: Turn, job_slice: DecodedSlice, position: int, live: Callable[[], bool]
    ) -> _Slot:
        """Wait for the row's slot, then check again what may have changed meanwhile:
        _START (the slot held); else, holding none, _SKIP (its job canceled), _STOP
        (overtaken: the rows not started went back to the broker; or its delivery lost),
        or the :class:`Halt` (its job paused or budget-stopped)."""
        if not await self._slot_or_handed_back(turn, job_slice, position):
            return _STOP
        if self._dropped(job_slice):
            self._slots.release()
            return _SKIP
        lost, halt = self._may_not_start(job_slice, live)
        if lost or halt is not None:
            self._slots.release()
            return _STOP if halt is None else halt
        return _START

    async def _slot_or_handed_back(
        self, turn: Turn, job_slice: DecodedSlice, position: int
    ) -> bool:
        """True once ``turn`` holds a slot; False once the slice's rows from
        ``position`` on were handed back to the broker, overtaken (a failed hand-back
        waits for a slot again)."""
        while not await self._slots.acquire(turn):
            if self._hand_over is None:
                continue
            if await self._handed_over(self._hand_over, job_slice, position):
                ROWS_OVERTAKEN.inc(len(job_slice.rows) - position)
                return False
        return True

    def _may_not_start(
        self, job_slice: DecodedSlice, live: Callable[[], bool]
    ) -> tuple[bool, Halt | None]:
        """``(lost, halt)``: whether the slice's delivery is lost (its channel closed: the
        broker gives its rows to another worker), else why its next row may not start."""
        if not live():
            self._delivery_lost(job_slice)
            return True, None
        return False, self._halt(job_slice)

    def _delivery_lost(self, job_slice: DecodedSlice) -> None:
        """Count and log a slice whose delivery's channel closed before all its rows started."""
        DELIVERIES_LOST.inc()
        log.warning("delivery_lost", extra={"batch_id": job_slice.batch_id})

    def _halt(self, job_slice: DecodedSlice) -> Halt | None:
        """Why the slice's next row may not start (its job paused or budget-stopped)."""
        return None if self.controls is None else self.controls.halt(job_slice)

    async def _handed_over(
        self, hand_over: HandOver, job_slice: DecodedSlice, position: int
    ) -> bool:
        """Whether the rows of ``job_slice`` from ``position`` on went back to the broker."""
        rest = job_slice.rows[position:]
        try:
            await hand_over(job_slice.with_rows(rest))
        except Exception as exc:  # the slice runs on: its rows are not lost either way
            log.warning(
                "hand_over_failed", extra={"batch_id": job_slice.batch_id, "error": repr(exc)}
            )
            return False
        log.info("rows_handed_over", extra={"batch_id": job_slice.batch_id, "rows": len(rest)})
        return True

    def _dropped(self, job_slice: DecodedSlice) -> bool:
        """Whether the slice's next row is dropped (its job canceled or past its deadline)."""
        if job_slice.batch_id in self.canceled or self._past_deadline(job_slice):
            ROWS_DROPPED.inc()
            return True
        return False

    def _past_deadline(self, job_slice: DecodedSlice) -> bool:
        """Whether the slice's job is past its completion window: its rows left are never
        started (the ledger records no outcome past the deadline; the job ends expired)."""
        return 0.0 < job_slice.expires_at <= self._clock()

    def _forget(self, batch_id: str, start: _RowStart, task: asyncio.Task[None]) -> None:
        if not start.began:  # cancelled before its first step: its slot goes back
            self._slots.release()
        tasks = self._running.get(batch_id)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self._running[batch_id]

    def _flush_soon(self, batch_id: str) -> None:
        """Once the outcome being added is queued (the sink's first step runs before the
        loop's next turn), send the job's outcomes: the slice's last one need not wait
        out the message's linger before the slice can be acked."""
        if self._flush is not None:
            asyncio.get_running_loop().call_soon(self._flush, batch_id)

    async def _run_row(
        self,
        job_slice: DecodedSlice,
        index: int,
        request: RowRequest,
        progress: _SliceProgress,
        start: _RowStart,
    ) -> None:
        global _in_flight
        # From here on the ``finally`` below gives the slot back (no await before it).
        start.began = True
        _in_flight += 1
        started = self._monotonic()
        try:
            result = await self._traced(job_slice, index, request)
        finally:
            _in_flight -= 1
            self._slots.release()
        latency_ms = round((self._monotonic() - started) * 1000)
        deployment = result.deployment
        price = None if deployment is None else self._prices.get(deployment)
        reference = None if deployment is None else self._references.get(deployment)
        outcome = to_outcome(job_slice.batch_id, index, result, latency_ms, price, reference)
        (ROWS_WITH_CONTENT if outcome.error is None else ROWS_WITH_ERROR).inc()
        if progress.finish_one():
            self._flush_soon(job_slice.batch_id)
        await self._sink(outcome)

    def _traced(
        self, job_slice: DecodedSlice, index: int, request: RowRequest
    ) -> Awaitable[RowResult]:
        """The row's call, in a span of its job's trace when tracing is on."""
        call = self._call(job_slice, index, request)
        if self._spans is None:
            return call
        alias = request.model or job_slice.model
        return self._spans.traced(call, job_slice.batch_id, index, alias, request.endpoint or CHAT)

    async def _call(self, job_slice: DecodedSlice, index: int, request: RowRequest) -> RowResult:
        alias = request.model or job_slice.model
        try:
            if request.endpoint is not None:  # its body is whole: no job params
                return await self._router.complete(
                    alias, (), request.params or {}, job_slice.tenant, request.endpoint
                )
            params = (
                job_slice.params if not request.params else {**job_slice.params, **request.params}
            )
            return await self._router.complete(alias, request.messages, params, job_slice.tenant)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception(
                "row_failed_unexpectedly", extra={"batch_id": job_slice.batch_id, "row": index}
            )
            return RowResult(None, f"internal_error: {exc.__class__.__name__}", 1, None)
