"""A job's rows without an outcome, in query shapes whose cost does not depend on statistics.

A ``NOT EXISTS`` over ``row_results`` becomes an anti-join, and the planner picks its
method from estimates. Where the statistics know nothing of the running job (a new
ledger never analyzed; a big old one that autoanalyze reaches only after a tenth of it
changed; or simply outcomes recorded past the highest row index the last ``ANALYZE``
saw) a range of the job's outcomes looks a row long, and the anti-join becomes a nested
loop over a materialized range: quadratic in the range (6-7 s a call at ~10,000 rows,
minutes at 100,000). Two shapes that cannot go wrong:

:func:`without_outcome` is a set difference without a join: the range of the rows and
the same range of ``row_results``, each read on its primary key, grouped by row index;
a row is unfinished when its group holds no outcome. Whatever the estimates, each side
reads only its range and the grouping (hashed or sorted) is linear in it: the shape for
ranges that may be long (the rows in flight, stall recovery's unfinished rows).

:func:`no_outcome` is a scalar subquery, which Postgres never turns into a join: one
probe of ``row_results``' primary key per row that reaches it. The shape for a walk that
stops at its first hit and for rows picked by index.

The release's own reads (``fetch_rows``, the rows to come of the byte window) keep their
anti-join: they read rows at and past ``dispatched_upto``, which have no outcome, so
whatever the plan its inner side is empty.
"""

from __future__ import annotations


def without_outcome(rows: str, job: str, low: str, high: str) -> str:
    """SQL of the rows of ``rows`` (a query of ``(row_index, value)``, ``value`` never
    NULL, every index in ``low <= index < high``) that job ``job`` has no outcome for,
    as ``(row_index, value)``, in no order (``job``, ``low``, ``high``: SQL expressions)."""
    return (
        f"SELECT u.row_index, max(u.value) AS value FROM ({rows}"
        " UNION ALL SELECT o.row_index, NULL FROM row_results o"
        f" WHERE o.batch_id = {job} AND o.row_index >= {low} AND o.row_index < {high})"
        " AS u (row_index, value) GROUP BY u.row_index HAVING count(u.value) = count(*)"
    )


def no_outcome(job: str, row: str) -> str:
    """SQL that is true when row ``row`` of job ``job`` (SQL expressions, e.g. ``b.id``
    and ``r.row_index``) has no outcome in ``row_results``: one primary-key probe."""
    return (
        "(SELECT o.row_index FROM row_results o"
        f" WHERE o.batch_id = {job} AND o.row_index = {row}) IS NULL"
    )
