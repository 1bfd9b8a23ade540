"""What this row-worker holds: the rows it took from the broker and has not finished,
and how far it has seen each dispatcher's slices delivered (its delivery marks).

A slice is held from the moment the worker starts on it until every one of its rows has
a confirmed outcome (or was dropped). The worker reports its holdings as a heartbeat
(``worker.holding``), with how many rows it runs at once (its concurrency, by which
dispatchers size their windows); dispatchers re-send a stalled job's rows only when no live worker
holds them, so a row that is merely slow is never paid for twice. Memory is bounded by
the prefetch: a worker holds at most that many slices.
"""

from __future__ import annotations

import itertools

from relay_batches.messages import DecodedSlice, HeldRows, HoldingReport

HEARTBEAT_TTL_FACTOR = 3


class Holdings:
    """The slices in progress on this worker and the delivery marks since the last report."""

    def __init__(self, worker: str, heartbeat_s: float, concurrency: int = 0) -> None:
        self._worker = worker
        self._concurrency = concurrency
        self._ttl_s = heartbeat_s * HEARTBEAT_TTL_FACTOR
        self._tokens = itertools.count()
        self._held: dict[int, tuple[str, tuple[int, ...]]] = {}
        # (dispatcher, level) -> latest sent_at: bounded by the dispatchers publishing
        # during one heartbeat period times the broker levels, and emptied each report.
        self._marks: dict[tuple[str, int], float] = {}

    def take(self, task: DecodedSlice) -> int:
        """Hold ``task``'s rows; return the token that :meth:`leave` lets go of."""
        token = next(self._tokens)
        self._held[token] = (task.batch_id, tuple(index for index, _ in task.rows))
        key = (task.owner, task.level)
        if task.sent_at > self._marks.get(key, float("-inf")):
            self._marks[key] = task.sent_at
        return token

    def leave(self, token: int) -> None:
        """The slice of ``token`` is finished (its outcomes are confirmed, or dropped)."""
        self._held.pop(token, None)

    def report(self) -> HoldingReport:
        """The heartbeat to publish now; the delivery marks start afresh."""
        by_job: dict[str, list[int]] = {}
        for batch_id, rows in self._held.values():
            by_job.setdefault(batch_id, []).extend(rows)
        marks, self._marks = self._marks, {}
        return HoldingReport(
            self._worker,
            self._ttl_s,
            tuple(HeldRows(b, tuple(sorted(r))) for b, r in sorted(by_job.items())),
            tuple((owner, level, at) for (owner, level), at in sorted(marks.items())),
            self._concurrency,
        )
