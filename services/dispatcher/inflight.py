"""Rows in flight, as the row-workers report them: which rows a live worker holds, how
many rows the live fleet runs at once, how many dispatchers feed it, and how far the
broker has delivered the slices this dispatcher published.

Every row-worker publishes a heartbeat (``worker.holding``) listing the rows it holds
and, per publishing dispatcher and broker level, the ``sent_at`` stamp of the
latest-published slice it took since its previous heartbeat. A worker whose heartbeat
is older than its ``ttl_s`` holds nothing (killed, or cut off: the broker gives its
unacked slices to another worker).

The delivery marks tell a row that is queued from one that is lost. The broker hands
out a higher broker level before a lower one and, within a level, first in first out;
so once a slice published at ``t1`` on level ``L`` was delivered, every slice published
before ``t1`` on level ``L`` or above has been delivered too. A dispatcher judges only
the rows it published itself, and only by the marks of slices it stamped itself: every
comparison is between two readings of its own clock, however far other hosts' clocks
are off (the rows of one job are only ever published by its current owner; after a
takeover the new owner's :class:`SendLog` starts at its adoption). A row of such a slice
that nobody holds and that has no outcome is lost. Memory is bounded: one entry per live
worker (its holdings are bounded by its prefetch), one mark per broker level and one
entry per live dispatcher.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from relay_batches.bus.topology import rows_prefetch
from relay_batches.messages import HoldingReport

SEND_LOG_SPANS = 64


@dataclass(frozen=True)
class _Worker:
    expires_at: float
    held: dict[str, frozenset[int]]
    concurrency: int = 0


class InFlight:
    """The latest heartbeat of every row-worker, and the delivery marks per broker level
    of the slices dispatcher ``owner`` published."""

    def __init__(self, owner: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._owner = owner
        self._clock = clock
        self._workers: dict[str, _Worker] = {}
        self._marks: dict[int, float] = {}
        # Every dispatcher whose slices a live worker took lately, until when it counts.
        self._dispatchers: dict[str, float] = {}

    async def on_report(self, report: HoldingReport) -> None:
        """Take a worker's heartbeat (it replaces the worker's previous one)."""
        now = self._clock()
        self._workers[report.worker] = _Worker(
            now + report.ttl_s,
            {h.batch_id: frozenset(h.rows) for h in report.held},
            report.concurrency,
        )
        for owner, level, sent_at in report.marks:
            if owner == self._owner:
                self._marks[level] = max(self._marks.get(level, sent_at), sent_at)
            if owner:  # a worker from before owners names none
                self._dispatchers[owner] = now + report.ttl_s
        for worker in [w for w, seen in self._workers.items() if seen.expires_at < now]:
            del self._workers[worker]
        for owner in [o for o, until in self._dispatchers.items() if until < now]:
            del self._dispatchers[owner]

    def held(self, batch_id: str) -> frozenset[int]:
        """Rows of ``batch_id`` held by a worker whose heartbeat is still valid."""
        now = self._clock()
        rows: set[int] = set()
        for worker in self._workers.values():
            if worker.expires_at >= now:
                rows |= worker.held.get(batch_id, frozenset())
        return frozenset(rows)

    def concurrency(self) -> int:
        """Rows the live row-workers run at once, together."""
        now = self._clock()
        return sum(w.concurrency for w in self._workers.values() if w.expires_at >= now)

    def concurrencies(self) -> tuple[int, ...]:
        """The concurrency of each live row-worker that reports one."""
        now = self._clock()
        return tuple(
            w.concurrency for w in self._workers.values() if w.expires_at >= now and w.concurrency
        )

    def fed_concurrency(self, slice_rows: int) -> int:
        """What the windows are sized by: each live worker's concurrency, or half the
        rows its prefetch of slices holds when that is more. A window of twice the
        concurrency alone would give fewer workers than the fleet a whole slice once
        slices are longer than a worker's concurrency (with 64-row slices and 8 slots,
        only a quarter of the workers)."""
        now = self._clock()
        return sum(
            max(w.concurrency, rows_prefetch(w.concurrency, slice_rows) * slice_rows // 2)
            for w in self._workers.values()
            if w.expires_at >= now and w.concurrency > 0
        )

    def dispatchers(self) -> int:
        """Live dispatchers sharing the fleet: the distinct owners named in the marks of
        heartbeats still valid, this one always among them (so at least 1)."""
        now = self._clock()
        live = {o for o, until in self._dispatchers.items() if until >= now}
        return len(live | {self._owner})

    def delivered_after(self, level: int, sent_at: float) -> bool:
        """Whether a slice we published after ``sent_at`` (our clock) on broker level
        ``level`` or below was delivered: then a slice we published on ``level`` at
        ``sent_at`` left the queue too."""
        return any(mark > sent_at for lvl, mark in self._marks.items() if lvl <= level)


@dataclass
class SendLog:
    """When, and on which broker level, a job's rows were last published, by span (the
    latest spans only).

    Rows outside every remembered span were published at ``floor`` or before (a span
    that is forgotten raises it; a job adopted from another dispatcher starts at its
    adoption), on level 0 as far as we know: a later stamp can only make a row look
    younger, and a lower level can only ask for stronger evidence that it left the
    queue (a level-0 slice delivered after it), so neither ever makes a queued row
    look lost.
    """

    floor: float
    spans: deque[tuple[int, int, float, int]] = field(default_factory=deque)

    def record(self, start: int, end: int, sent_at: float, level: int = 0) -> None:
        """Rows ``start <= index < end`` went out at ``sent_at`` on broker level ``level``."""
        self.spans.append((start, end, sent_at, level))
        while len(self.spans) > SEND_LOG_SPANS:
            self.floor = max(self.floor, self.spans.popleft()[2])

    def sent(self, index: int) -> tuple[int, float]:
        """``(broker level, when)`` row ``index`` was last published (at the latest)."""
        for start, end, stamp, level in reversed(self.spans):
            if start <= index < end:
                return level, stamp
        return 0, self.floor
