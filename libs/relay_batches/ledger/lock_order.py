"""One lock order for job rows: by id, everywhere a statement locks several of them.

A plain ``UPDATE batches … WHERE id = ANY($ids)`` locks the rows in the order the scan
meets them (physical order for a sequential or bitmap scan), while the aggregator locks
in id order: two such statements on the same jobs can each hold a row the other waits
for, and Postgres aborts one with ``deadlock detected``. Every multi-job update therefore
locks its targets first in a sub-select ``ORDER BY id FOR UPDATE`` and updates by join.
Statements that lock with ``SKIP LOCKED`` never wait, so they cannot close a cycle.
"""

from __future__ import annotations


def update_jobs_in_id_order(where: str, set_clause: str, returning: str = "") -> str:
    """``UPDATE batches b SET <set_clause>`` of the jobs matching ``where`` (a condition
    on ``batches`` without alias), locked in id order before they are changed."""
    statement = (
        f"WITH locked AS (SELECT id FROM batches WHERE {where} ORDER BY id FOR UPDATE)"
        f" UPDATE batches b SET {set_clause} FROM locked WHERE b.id = locked.id"
    )
    return f"{statement} RETURNING {returning}" if returning else statement
