"""What "no workspace starves another" means, checked against the ledger's finish times.

A small workspace that queued behind a long queue of another is served fairly when its
last job finished while most of the long queue was still unfinished: under first-come
slots it would finish only after the whole queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg


@dataclass(frozen=True)
class JobTimes:
    """When a job was submitted and when it reached its terminal state (None: not yet)."""

    created_at: datetime
    completed_at: datetime | None


async def job_times(database_url: str, batch_ids: Sequence[str]) -> dict[str, JobTimes]:
    """Submission and finish times of the batches, straight from the ledger."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        found = await conn.fetch(
            "SELECT id, created_at, completed_at FROM batches WHERE id = ANY($1)",
            list(batch_ids),
        )
    finally:
        await conn.close()
    times = {row["id"]: JobTimes(row["created_at"], row["completed_at"]) for row in found}
    assert set(times) == set(batch_ids), "a batch is missing from the ledger"
    return times


def finish_times(finished: Mapping[str, datetime | None]) -> dict[str, datetime]:
    """Every job's finish time; fail if a job has not finished."""
    done = {job: at for job, at in finished.items() if at is not None}
    assert len(done) == len(finished), f"unfinished jobs: {set(finished) - set(done)}"
    return done


def finish_order(finished: Mapping[str, datetime | None]) -> list[str]:
    """The jobs in the order they finished (ties by id, so the order is stable)."""
    done = finish_times(finished)
    return sorted(done, key=lambda job: (done[job], job))


def unfinished_when_done(
    finished: Mapping[str, datetime | None], small: Sequence[str], large: Sequence[str]
) -> int:
    """How many of the ``large`` jobs finished after the last of the ``small`` ones (one
    finished at the same instant counts as finished)."""
    done = finish_times({job: finished[job] for job in (*small, *large)})
    last_small = max(done[job] for job in small)
    return sum(1 for job in large if done[job] > last_small)


def assert_served_fairly(
    finished: Mapping[str, datetime | None], small: Sequence[str], large: Sequence[str]
) -> int:
    """Fail unless more than half of ``large`` finished after every job of ``small``;
    return how many did."""
    waiting = unfinished_when_done(finished, small, large)
    assert waiting > len(large) // 2, (
        f"the small workspace finished when only {waiting} of the other's "
        f"{len(large)} jobs were unfinished: {finish_order(finished)}"
    )
    return waiting
