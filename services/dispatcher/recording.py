"""Whether the aggregator is behind on the results queues, judged per queue, as pure
functions over what the broker and the ledger report.

Each results shard is taken by one aggregator at a time (single active consumer), so one
aggregator that lost the ledger but keeps its broker connection holds its shards while
the others record theirs: a global reading (the newest outcome recorded of any running
job) would show the aggregators as keeping up. So every queue is judged on its own: a
shard is behind when nobody consumes it, or when outcomes wait on it while the newest
outcome recorded of the running jobs it carries is older than the limit (a shard with
outcomes waiting whose running jobs have none recorded yet counts as silent since the
dispatcher started). The unsharded queue has competing consumers and carries any job's
outcomes: its silence is the newest over every running job.

What a queue behind holds back is only the jobs whose outcomes it may carry: a shard's
own jobs, or every job for the unsharded queue (:func:`held_back`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from relay_batches.bus.topology import results_shard

UNSHARDED = -1  # the unsharded results queue among the queue indexes below


@dataclass(frozen=True)
class ResultsQueues:
    """``(ready messages, consumers)`` of the unsharded results queue and of each results
    shard, in shard order."""

    unsharded: tuple[int, int]
    shards: tuple[tuple[int, int], ...]

    def _each(self) -> list[tuple[int, tuple[int, int]]]:
        return [(UNSHARDED, self.unsharded), *enumerate(self.shards)]

    @property
    def ready(self) -> int:
        """Messages ready on every results queue together."""
        return sum(ready for _, (ready, _) in self._each())

    def unconsumed(self) -> list[int]:
        """The queues nobody consumes (``UNSHARDED`` or a shard index)."""
        return [queue for queue, (_, consumers) in self._each() if consumers == 0]

    def waiting(self) -> list[int]:
        """The queues with messages ready."""
        return [queue for queue, (ready, _) in self._each() if ready > 0]

    def silent(self, silences: Mapping[str, float], uptime: float, limit: float) -> list[int]:
        """The queues with messages ready whose silence exceeds ``limit`` seconds.

        ``silences`` maps each running job that has an outcome recorded to the seconds
        since its latest one; a queue's silence is the least over the jobs it carries
        (every job for the unsharded queue), ``uptime`` for a queue none of whose
        running jobs has one, and never more than ``uptime`` (no evidence yet is no
        evidence against the aggregator)."""
        newest: dict[int, float] = {}
        count = len(self.shards)
        for batch_id, seconds in silences.items():
            for queue in (UNSHARDED, results_shard(batch_id, count) if count else UNSHARDED):
                newest[queue] = min(seconds, newest.get(queue, seconds))
        return [queue for queue in self.waiting() if min(newest.get(queue, uptime), uptime) > limit]


def held_back(job_ids: Iterable[str], behind: Collection[int], count: int) -> set[str]:
    """The jobs of ``job_ids`` whose outcomes may wait on a queue in ``behind`` (queue
    indexes of ``count`` shards): every one while the unsharded queue is behind, else
    those mapped to a shard that is."""
    if UNSHARDED in behind:
        return set(job_ids)
    if not behind or count <= 0:
        return set()
    return {job_id for job_id in job_ids if results_shard(job_id, count) in behind}
