"""A workspace's jobs a page at a time, newest first, from a cursor in either direction.

``after``: the page of jobs created just before the cursor job (older, further down the
list); ``before``: the page just after it (newer, up the list), still newest first. A
cursor that names no job of the workspace gives an empty page, as the native list does.
"""

from __future__ import annotations

import asyncpg

from relay_batches.ledger.pool import translated
from relay_batches.model import Job

_CURSOR = "(SELECT a.created_at, a.id FROM batches a WHERE a.id = $2 AND a.workspace_id = $1)"
# $1 workspace, $2 cursor id (NULL: from the newest), $3 rows to read.
_OLDER = (
    "SELECT b.* FROM batches b WHERE b.workspace_id = $1"
    f" AND ($2::text IS NULL OR (b.created_at, b.id) < {_CURSOR})"
    " ORDER BY b.created_at DESC, b.id DESC LIMIT $3"
)
_NEWER = (
    "SELECT b.* FROM batches b WHERE b.workspace_id = $1"
    f" AND (b.created_at, b.id) > {_CURSOR}"
    " ORDER BY b.created_at, b.id LIMIT $3"
)


class JobWindow:
    """Cursor pages over ``batches`` (the ``batches_workspace_list`` index serves both)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def older(
        self, workspace_id: str, limit: int, after: str | None
    ) -> tuple[list[Job], bool]:
        """Up to ``limit`` jobs created before ``after`` (None: the newest), newest first,
        and whether older ones remain."""
        async with translated():
            records = await self._pool.fetch(_OLDER, workspace_id, after, limit + 1)
        return [Job.from_record(r) for r in records[:limit]], len(records) > limit

    async def newer(self, workspace_id: str, limit: int, before: str) -> tuple[list[Job], bool]:
        """Up to ``limit`` jobs created just after ``before``, newest first, and whether
        newer ones remain."""
        async with translated():
            records = await self._pool.fetch(_NEWER, workspace_id, before, limit + 1)
        page = [Job.from_record(r) for r in records[:limit]]
        page.reverse()
        return page, len(records) > limit
