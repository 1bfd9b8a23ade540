"""The start gate: a row-worker's slots, given to the slices it holds best rank first.

A worker holds a few slices (its prefetch) and runs ``concurrency`` rows at once. Which
held slice's next row takes a slot that frees decides how long a row waits at a worker:
in arrival order, a slice of a priority-100 job or of a new tenant, raised to a higher
broker level by the dispatcher (``dispatcher/sharing.py``) so it overtakes queued rows
in the broker, would still wait behind every row of the slices delivered before it. So
a slice joins the gate with a rank, ``(-level, arrival)``: a free slot goes to the
waiting slice of the highest broker level, and among equals to the one that came first
(slices of one level start one after another, so the first ends and is acked while the
next still runs, and the broker sends more).

A slice stays in the gate until it has started every row it will start
(:meth:`StartGate.leave`), so the slot that frees while it creates a row's task is
still its own (credited to it, taken without waiting at its next :meth:`acquire`),
not handed to a slice behind it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class Turn:
    """One slice's place in the gate: its rank and the slots granted to it not yet taken."""

    __slots__ = ("gone", "granted", "overtaken", "rank", "waiter")

    def __init__(self, rank: tuple[int, int]) -> None:
        self.rank = rank
        self.granted = 0
        self.waiter: asyncio.Future[None] | None = None
        self.gone = False
        self.overtaken = False  # told to give way while it waited (see StartGate.overtake)

    @property
    def level(self) -> int:
        """The broker level of its slice."""
        return -self.rank[0]


class StartGate:
    """``concurrency`` slots; a slot that frees goes to the best-ranked slice in the gate."""

    def __init__(self, concurrency: int) -> None:
        self._free = concurrency
        self._turns: list[tuple[tuple[int, int], Turn]] = []  # a heap; gone turns linger
        self._arrivals = itertools.count()

    def join(self, level: int) -> Turn:
        """A slice published at broker ``level`` waits for slots from now on."""
        turn = Turn((-level, next(self._arrivals)))
        heapq.heappush(self._turns, (turn.rank, turn))
        return turn

    def leave(self, turn: Turn) -> None:
        """``turn``'s slice starts no more rows: the slots granted to it go on."""
        turn.gone = True
        granted, turn.granted = turn.granted, 0
        for _ in range(granted):
            self.release()

    def take(self, turn: Turn) -> bool:
        """Take a slot without waiting if one is ``turn``'s now: granted to it, or free
        with no better slice in the gate (the common case, that needs no coroutine);
        False, holding nothing, otherwise (then :meth:`acquire` waits for one)."""
        if turn.granted:
            turn.granted -= 1
            turn.overtaken = False
            return True
        if self._free and self._best() is turn:
            self._free -= 1
            return True
        return False

    async def acquire(self, turn: Turn) -> bool:
        """Wait until ``turn`` holds a slot (True): one granted to it, or a free one when
        no better slice is in the gate (a free slot goes to a better one first: it is
        between two rows, or about to leave and pass the slot on). False, holding no
        slot, if :meth:`overtake` told it to give way while it waited."""
        while not turn.granted:
            if self._free:
                self._free -= 1
                if self._best() is turn:
                    return True
                self._grant_best()
                continue
            turn.waiter = asyncio.get_running_loop().create_future()
            try:
                await turn.waiter
            finally:
                turn.waiter = None
            if turn.overtaken and not turn.granted:
                turn.overtaken = False
                return False
        turn.overtaken = False
        turn.granted -= 1
        return True

    def overtake(self, level: int) -> int:
        """Rows of ``level`` are queued in the broker: every slice below it that waits
        for a slot stops waiting (its :meth:`acquire` says False), to hand its rows not
        started back. Returns how many were told."""
        told = 0
        for _, turn in self._turns:
            waiter = turn.waiter
            if turn.gone or turn.level >= level or waiter is None or waiter.done():
                continue
            turn.overtaken = True
            waiter.set_result(None)
            told += 1
        return told

    def release(self) -> None:
        """A slot frees: it is granted to the best slice in the gate (which takes it at
        its next :meth:`acquire`, at once if it waits), or stays free."""
        if self._best() is None:
            self._free += 1
        else:
            self._grant_best()

    def _grant_best(self) -> None:
        """Grant one slot to the best slice in the gate, waking it if it waits."""
        best = self._best()
        assert best is not None
        best.granted += 1
        if best.waiter is not None and not best.waiter.done():
            best.waiter.set_result(None)

    @property
    def free(self) -> int:
        """Slots neither running a row nor granted to a slice."""
        return self._free

    def _best(self) -> Turn | None:
        """The best-ranked slice still in the gate."""
        while self._turns and self._turns[0][1].gone:
            heapq.heappop(self._turns)
        return self._turns[0][1] if self._turns else None
