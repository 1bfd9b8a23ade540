"""A job's rows without an outcome, in query shapes whose plans do not depend on statistics.

A ``NOT EXISTS`` over ``row_results`` becomes an anti-join, and the planner picks its
method from estimates. On a ledger whose row tables were never analyzed (autovacuum off,
or a big ``batch_rows`` that autoanalyze reaches only after a tenth of it changed) every
range looks a few dozen rows long: the dispatcher's byte window was planned as a nested
loop over a materialized range of outcomes (quadratic: 11.5 s at 11,000 rows in flight,
over a minute at 300,000), and reads by index as a hash of every outcome of the job.

:func:`unfinished_in` is a set difference without a join: the range of ``batch_rows``
and the same range of ``row_results``, each read on its own primary key, grouped by row
index; a row is unfinished when its group has no outcome. Whatever the estimates, each
side reads only its range and the grouping (sorted or hashed) is linear in it, so the
cost follows the range and never the table, nor the job's other rows: the shape for
ranges that may be long (the rows in flight, stall recovery's reads).
:func:`no_outcome` is a scalar subquery, which Postgres never turns into a join or a
hashed subplan: one probe of ``row_results``' primary key per row that reaches it. The
shape for a few slices' rows read with their text (a release), for a walk that stops at
its first hit, and for rows picked by index.
"""

from __future__ import annotations


def unfinished_in(value: str, low: str, high: str) -> str:
    """SQL of the rows ``low <= row_index < high`` of job ``$1`` (its input stored under
    batch ``$2``) that have no outcome, as ``(row_index, value)``, in no order; ``value``
    is an expression over ``batch_rows r`` that is never NULL (e.g. ``octet_length(r.request)``)."""
    return without_outcome(
        f"SELECT r.row_index, {value} FROM batch_rows r"
        f" WHERE r.batch_id = $2 AND r.row_index >= {low} AND r.row_index < {high}",
        low,
        high,
    )


def without_outcome(rows: str, low: str, high: str) -> str:
    """SQL of the rows of ``rows`` (a query of ``(row_index, value)``, ``value`` never
    NULL, every index in ``low <= index < high``) that job ``$1`` has no outcome for,
    as ``(row_index, value)``, in no order."""
    return (
        f"SELECT u.row_index, max(u.value) AS value FROM ({rows}"
        " UNION ALL SELECT o.row_index, NULL FROM row_results o"
        f" WHERE o.batch_id = $1 AND o.row_index >= {low} AND o.row_index < {high})"
        " AS u (row_index, value) GROUP BY u.row_index HAVING count(u.value) = count(*)"
    )


def no_outcome(job: str, row: str) -> str:
    """SQL that is true when row ``row`` of job ``job`` (SQL expressions, e.g. ``b.id``
    and ``r.row_index``) has no outcome in ``row_results``."""
    return (
        "(SELECT o.row_index FROM row_results o"
        f" WHERE o.batch_id = {job} AND o.row_index = {row}) IS NULL"
    )
