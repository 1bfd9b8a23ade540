"""The dispatcher's row reads on a ledger whose row tables were never analyzed.

Without statistics every range of ``batch_rows`` or ``row_results`` looks a few dozen
rows long, and an anti-join between them was planned as a nested loop over a
materialized range (quadratic in the rows in flight) or as a hash of every outcome of
the job. The reads must plan the same on any ledger: each row table read on its primary
key bounded by ``row_index``, never joined to the other, in a custom plan and in the
generic plan a prepared statement switches to. A database of its own (autovacuum off on
the row tables, so nothing is analyzed under the test) holds one job of 200,000 rows,
100,000 of them with an outcome.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import orjson
import pytest

from relay_batches.ids import new_id
from relay_batches.ledger import dispatch, result_pages
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.pool import create_pool
from tests.helpers.support import Isolation, create_isolation, drop_isolation

ROWS = 200_000
DONE = 100_000  # rows 0..DONE-1 have an outcome
LATE = (DONE + 10, DONE + 20)  # and these two, out of order
RELEASED = DONE + 1_000
PREFIX, SUFFIX = '[{"role":"user","content":"', '"}]'
OWNER = "dispatcher-unanalyzed"
ROW_TABLES = {"batch_rows", "row_results"}
# Nodes that pair or pile up rows of a row table with others: none may read one.
JOINING = {"Nested Loop", "Hash Join", "Merge Join", "Hash", "Materialize"}


def size(index: int) -> int:
    """The stored length of row ``index``'s request."""
    return len(PREFIX) + 40 + index % 7 + len(SUFFIX)


@pytest.fixture(scope="module")
async def ledger() -> AsyncIterator[tuple[asyncpg.Pool, str]]:
    """A pool on a fresh ledger holding one running job, and that job's id."""
    iso: Isolation = await create_isolation("stats")
    job = new_id()
    conn = await asyncpg.connect(iso.database_url)
    try:
        # The statements below never end on the old query shapes: fail instead.
        await conn.execute(f'ALTER DATABASE "{iso.database}" SET statement_timeout = 20000')
        for table in sorted(ROW_TABLES):
            await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        workspace = new_id()
        await conn.execute("INSERT INTO workspaces (id, name) VALUES ($1, $1)", workspace)
        await conn.execute(
            "INSERT INTO batches (id, workspace_id, name, model, status, total, rows_batch_id,"
            " dispatched_upto, lease_owner, started_at, last_progress_at)"
            " VALUES ($1, $2, 'big', 'm', 'running', $3, $1, $4, $5, now() - interval '1 h',"
            " now() - interval '1 h')",
            job,
            workspace,
            ROWS,
            RELEASED,
            OWNER,
        )
        await conn.execute(
            "INSERT INTO batch_rows (batch_id, row_index, custom_id, request)"
            " SELECT $1, i, 'c-' || i, $2 || repeat('x', 40 + i % 7) || $3"
            " FROM generate_series(0, $4 - 1) AS i",
            job,
            PREFIX,
            SUFFIX,
            ROWS,
        )
        await conn.execute(
            "INSERT INTO row_results (batch_id, row_index, content, attempts)"
            " SELECT $1, i, 'ok', 1 FROM generate_series(0, $2 - 1) AS i"
            " UNION ALL SELECT $1, unnest($3::int[]), 'ok', 1",
            job,
            DONE,
            list(LATE),
        )
        analyzed = await conn.fetchval(
            "SELECT count(*) FROM pg_stats WHERE tablename = ANY($1::text[])", list(ROW_TABLES)
        )
        assert analyzed == 0
    finally:
        await conn.close()
    pool = await create_pool(iso.database_url, max_size=2)
    try:
        yield pool, job
    finally:
        await pool.close()
        await drop_isolation(iso)


def _nodes(node: dict[str, Any], parent: str = "") -> Iterator[tuple[dict[str, Any], str]]:
    """Every node of a JSON plan with the type of the node above it."""
    yield node, parent
    for child in node.get("Plans", []):
        yield from _nodes(child, node["Node Type"])


def _row_table_reads(plan: dict[str, Any], joined: bool = False) -> list[str]:
    """What is wrong with how ``plan`` reads the row tables (nothing: an empty list);
    ``joined``: a row table may be read under a join, bounded all the same."""
    wrong = []
    for node, parent in _nodes(plan):
        kind = node["Node Type"]
        index = node.get("Index Name", "")
        table = node.get("Relation Name") or index.removesuffix("_pkey")
        if table not in ROW_TABLES:
            continue
        if kind == "Bitmap Heap Scan":
            continue  # its Bitmap Index Scan child is judged
        if kind not in ("Index Scan", "Index Only Scan", "Bitmap Index Scan"):
            wrong.append(f"{kind} on {table}")
        elif "row_index" not in node.get("Index Cond", ""):
            wrong.append(f"{kind} on {table} not bounded by row_index: {node.get('Index Cond')}")
        if parent in JOINING and not joined:
            wrong.append(f"{table} read under a {parent}")
    return wrong


def _joins(plan: dict[str, Any]) -> list[str]:
    """The nodes of ``plan`` that pair or pile up rows (of any table)."""
    return [n["Node Type"] for n, _ in _nodes(plan) if n["Node Type"] in JOINING]


def _reads(job: str) -> dict[str, tuple[str, list[Any]]]:
    """The dispatcher's reads of the job's rows, each with arguments over a large range."""
    return {
        "byte window": (dispatch._BYTE_WINDOW, [job, job, 0, RELEASED, RELEASED + 1024]),
        "release": (dispatch._ROWS, [job, job, DONE - 500, RELEASED]),
        "unfinished": (dispatch._UNFINISHED, [job, 0, RELEASED]),
        "rows at": (
            dispatch._ROWS_AT,
            [job, job, list(range(DONE - 500, RELEASED)), DONE - 500, RELEASED],
        ),
    }


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
async def test_the_row_reads_plan_as_primary_key_ranges_without_statistics(
    ledger: tuple[asyncpg.Pool, str], mode: str
) -> None:
    pool, job = ledger
    async with pool.acquire() as conn:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        try:
            for name, (sql, args) in _reads(job).items():
                plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
                root = orjson.loads(plan)[0]["Plan"]
                assert _row_table_reads(root) == [], name
                assert _joins(root) == [], name
            # Stall recovery's first unfinished row: a walk of probes, only those.
            plan = await conn.fetchval(
                f"EXPLAIN (FORMAT JSON) {dispatch._CLAIM_STALLED}", OWNER, [job], 0.0, "running"
            )
            assert _row_table_reads(orjson.loads(plan)[0]["Plan"]) == []
        finally:
            await conn.execute("RESET plan_cache_mode")


async def test_the_dispatcher_reads_a_large_range_of_an_unanalyzed_ledger_at_once(
    ledger: tuple[asyncpg.Pool, str],
) -> None:
    """A dispatcher that takes the job over reads its whole released range (100,000 rows
    with an outcome, 1,000 without): the old anti-join ran past the 20 s statement
    timeout, the new reads take well under a second each."""
    pool, job = ledger
    store = DispatchStore(pool)
    flying = [i for i in range(DONE, RELEASED) if i not in LATE]
    coming = list(range(RELEASED, RELEASED + 1024))
    for _ in range(7):  # past the five custom plans of a prepared statement
        window = await store.byte_window(job, job, 0, RELEASED, RELEASED + 1024)
        assert window.in_flight == sum(size(i) for i in flying)
        assert window.first_unfinished == DONE
        assert window.next_rows == [(i, size(i)) for i in coming]
        assert await store.unfinished_rows(job, 0, RELEASED) == flying
        rows = await store.fetch_rows(job, job, DONE - 5, DONE + 25)
        assert [i for i, _ in rows] == [i for i in range(DONE, DONE + 25) if i not in LATE]
        assert rows[0][1] == PREFIX + "x" * (40 + DONE % 7) + SUFFIX
        at = await store.fetch_rows_at(job, job, [DONE - 1, LATE[0], LATE[0] + 1, ROWS - 1])
        assert [i for i, _ in at] == [LATE[0] + 1, ROWS - 1]
        assert await store.fetch_rows_at(job, job, []) == []
    stalled = await store.claim_stalled(OWNER, [job], 0.0)
    assert [(s.id, s.first_unfinished) for s in stalled] == [(job, DONE)]


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
async def test_a_results_page_reads_only_its_span_without_statistics(
    ledger: tuple[asyncpg.Pool, str], mode: str
) -> None:
    """A page of results reads its rows again within its span: unbounded, that read was
    planned as a sort of every outcome of the job, for every page."""
    pool, job = ledger
    async with pool.acquire() as conn:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        try:
            for sql in (result_pages._RESULTS_PAGE, result_pages._RESULTS_DETAIL_PAGE):
                for after in (-1, DONE // 2):
                    plan = await conn.fetchval(
                        f"EXPLAIN (FORMAT JSON) {sql}", job, job, after, 1000, 4 << 20
                    )
                    root = orjson.loads(plan)[0]["Plan"]
                    assert _row_table_reads(root, joined=True) == [], (sql, after)
        finally:
            await conn.execute("RESET plan_cache_mode")
