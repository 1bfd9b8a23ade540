"""The statistics keeper: Relay analyzes the ledger tables it makes stale itself.

A bulk upload stores a million rows in ``batch_rows`` at once, and a running job adds
thousands of outcomes a second to ``row_results``. Autoanalyze reads a table again only
after ``autovacuum_analyze_threshold`` + ``autovacuum_analyze_scale_factor`` x its rows
changed (50 + 10 % by default: a million-row job on a ledger of ten million runs to its
end on statistics taken before it existed), and not at all where autovacuum is off. The
planner then takes every range of the job for a few rows. The dispatcher's own reads do
not depend on statistics (:mod:`relay_batches.ledger.unfinished`); the rest of the
ledger's readers (result pages, job statistics, retention's scans, claims) plan better
with them.

:meth:`StatisticsKeeper.refresh`, run by the dispatcher every
``RELAY_STATISTICS_SECONDS``, reads ``pg_stat_user_tables`` for :data:`KEPT_TABLES` and
runs ``ANALYZE`` on each one that holds rows and was never analyzed, or whose rows
changed since its last analyze (``n_mod_since_analyze``) reach
``max(ANALYZE_AFTER_ROWS, ANALYZE_AFTER_FRACTION x its rows)``; migration 0027 sets the
same bound for autovacuum on the row tables, so where autovacuum runs it usually gets
there first. An ``ANALYZE`` samples a bounded number of rows (30,000 at the default
statistics target), so its time hardly grows with the table: 0.2–3.6 s each on this
two-core machine in the million-row benchmark (docs/performance.md), on a new ledger and
on one of ten million rows alike. One dispatcher at a time
(an advisory lock, tried, never waited for), within a statement
timeout, never waiting for a lock (an autovacuum analyzing the table already is left
to it), on one pool connection held by its own periodic task for the pass (a release
never waits for the analyze, only the pool has one connection fewer meanwhile).
"""

from __future__ import annotations

import logging
import time

import asyncpg

from relay_batches.ledger.pool import translated

log = logging.getLogger("relay.statistics")

KEPT_TABLES = ("batch_rows", "row_results", "batches")
ANALYZE_AFTER_ROWS = 50_000
ANALYZE_AFTER_FRACTION = 0.02
# pg_try_advisory_lock key of the keeper (any constant no other lock uses).
LOCK_KEY = 0x5265_6C61_7953_7461  # "RelaySta"
STATEMENT_TIMEOUT_MS = 20_000  # below the pool's command timeout (30 s)
LOCK_TIMEOUT_MS = 1_000

# $1 tables, $2 rows, $3 fraction: the kept tables due for an ANALYZE, most changed first.
_DUE = (
    "SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
    " WHERE s.schemaname = current_schema() AND s.relname = ANY($1::text[])"
    " AND ((s.last_analyze IS NULL AND s.last_autoanalyze IS NULL"
    "       AND s.n_live_tup + s.n_mod_since_analyze > 0)"
    "  OR s.n_mod_since_analyze >= GREATEST($2, $3 * GREATEST(c.reltuples, s.n_live_tup)))"
    " ORDER BY s.n_mod_since_analyze DESC"
)


class StatisticsKeeper:
    """Analyzes the kept tables that changed enough since their last analyze."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        tables: tuple[str, ...] = KEPT_TABLES,
        after_rows: int = ANALYZE_AFTER_ROWS,
        after_fraction: float = ANALYZE_AFTER_FRACTION,
    ) -> None:
        self._pool = pool
        self._tables = tables
        self._after_rows = after_rows
        self._after_fraction = after_fraction

    async def refresh(self) -> list[str]:
        """One pass: ``ANALYZE`` each kept table that is due, under the keeper's advisory
        lock; the tables analyzed (none when another process holds the lock). A table
        whose lock is not granted within ``LOCK_TIMEOUT_MS`` (an autovacuum or another
        analyze at work on it) is left for the next pass."""
        started = time.monotonic()
        analyzed: list[str] = []
        async with translated(), self._pool.acquire() as conn:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY):
                return []
            try:
                await conn.execute(
                    f"SET statement_timeout = {STATEMENT_TIMEOUT_MS};"
                    f" SET lock_timeout = {LOCK_TIMEOUT_MS}"
                )
                due = await conn.fetch(
                    _DUE, list(self._tables), self._after_rows, self._after_fraction
                )
                for (table,) in due:
                    try:
                        await conn.execute(f"ANALYZE {table}")
                    except asyncpg.LockNotAvailableError:
                        continue
                    analyzed.append(table)
            finally:
                await conn.execute(
                    "RESET statement_timeout; RESET lock_timeout;"
                    f" SELECT pg_advisory_unlock({LOCK_KEY})"
                )
        if analyzed:
            log.info(
                "tables_analyzed",
                extra={"tables": analyzed, "seconds": round(time.monotonic() - started, 3)},
            )
        return analyzed
