"""Results and dead-letter pages are bounded in bytes as well as rows, on the real ledger,
and the streamed API still answers every row once, in order."""

from __future__ import annotations

from typing import Any

import aiohttp
import asyncpg
import orjson

from relay_batches.bus.client import Bus
from relay_batches.ids import new_id
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.messages import RowOutcome
from relay_batches.model import Job
from relay_batches.router.aliases import AliasTable
from tests.helpers.api import start_api
from tests.helpers.support import ApiClient

KIB = 1024
# Row i's text: big rows among small ones, one far above the page budget.
SIZES = [10 * KIB, 10 * KIB, 30 * KIB, 100 * KIB, 1 * KIB, 1 * KIB, 25 * KIB, 5 * KIB, 40 * KIB]
BUDGET = 32 * KIB


async def finished_job(pool: asyncpg.Pool, workspace: str, sizes: list[int]) -> Job:
    """A completed job whose row ``i`` has ``sizes[i]`` bytes of text; odd rows failed onto
    the dead-letter list."""
    job = await JobStore(pool).create(
        NewJob(new_id(), workspace, "pages", "gpt-4o-mini", 0, len(sizes), None, None, None),
        ((f"c-{i}", '[{"role":"user","content":"x"}]') for i in range(len(sizes))),
    )
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", job.id)
    await OutcomeStore(pool).record(
        [
            RowOutcome(job.id, i, chr(97 + i) * size, None, attempts=1)
            if i % 2 == 0
            else RowOutcome(job.id, i, None, chr(97 + i) * size, attempts=2, dead_letter=True)
            for i, size in enumerate(sizes)
        ]
    )
    found = await JobStore(pool).get(workspace, job.id)
    assert found is not None and found.status == "completed"
    return found


def text_bytes(custom_id: str, text: str | None) -> int:
    """What a page's byte budget counts for one row."""
    return len(custom_id) + len((text or "").encode())


def assert_bounded(pages: list[list[int]], sizes: dict[int, int], rows: int, budget: int) -> None:
    """Every page is within ``rows`` and ``budget`` unless it is one row alone."""
    for page in pages:
        assert len(page) <= rows
        assert len(page) == 1 or sum(sizes[i] for i in page) <= budget, page


async def test_result_pages_are_cut_by_bytes_and_keep_every_row(pool: asyncpg.Pool) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"pages-{new_id()[:6]}")
    job = await finished_job(pool, workspace, SIZES)
    store = JobStore(pool, page_bytes=BUDGET)

    pages = [page async for page in store.result_pages(job)]
    seen = [row.row_index for page in pages for row in page]
    assert seen == list(range(len(SIZES)))
    sizes = {
        row.row_index: text_bytes(row.custom_id, row.content or row.error)
        for page in pages
        for row in page
    }
    index_pages = [[row.row_index for row in page] for page in pages]
    assert_bounded(index_pages, sizes, 5000, BUDGET)
    assert index_pages == [[0, 1], [2], [3], [4, 5, 6], [7], [8]]
    big = next(row for page in pages for row in page if row.row_index == 3)
    assert big.error == "d" * 100 * KIB  # the oversized row went out alone and whole

    by_rows = [[r.row_index for r in page] async for page in store.result_pages(job, page_rows=2)]
    assert_bounded(by_rows, sizes, 2, BUDGET)
    assert [i for page in by_rows for i in page] == list(range(len(SIZES)))


async def test_result_pages_of_one_outcome_are_cut_by_bytes_and_keep_its_rows(
    pool: asyncpg.Pool,
) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"pages-{new_id()[:6]}")
    job = await finished_job(pool, workspace, SIZES)
    store = JobStore(pool, page_bytes=BUDGET)
    failed = [page async for page in store.result_pages(job, outcome="error")]
    assert [[row.row_index for row in page] for page in failed] == [[1], [3], [5, 7]]
    assert all(row.content is None and row.error for page in failed for row in page)
    by_rows = [
        [row.row_index for row in page]
        async for page in store.result_pages(job, page_rows=1, outcome="content")
    ]
    assert by_rows == [[0], [2], [4], [6], [8]]
    detailed = [
        row.row_index
        async for page in store.detailed_result_pages(job, outcome="error")
        for row in page
    ]
    assert detailed == [1, 3, 5, 7]


async def test_dead_letter_pages_are_cut_by_bytes(pool: asyncpg.Pool) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"pages-{new_id()[:6]}")
    job = await finished_job(pool, workspace, SIZES)
    pages = [page async for page in JobStore(pool).dead_letter_pages(job, page_bytes=BUDGET)]
    index_pages = [[row.row_index for row in page] for page in pages]
    assert index_pages == [[1], [3], [5, 7]]
    sizes = {row.row_index: text_bytes(row.custom_id, row.error) for p in pages for row in p}
    assert_bounded(index_pages, sizes, 5000, BUDGET)
    assert [row.attempts for page in pages for row in page] == [2, 2, 2, 2]


async def test_results_api_streams_every_row_across_byte_pages(
    pool: asyncpg.Pool, bus: Bus, aliases: AliasTable, client_a: ApiClient
) -> None:
    workspace = await KeyStore(pool).workspace_for_key(client_a.key)
    assert workspace is not None
    job = await finished_job(pool, workspace, SIZES)
    server = await start_api(pool, bus, aliases, JobStore(pool, page_bytes=BUDGET))
    try:
        async with aiohttp.ClientSession() as http:
            client = ApiClient(str(server.make_url("")).rstrip("/"), client_a.key, http)
            document = await client.results(job.id)
            ndjson = await ndjson_lines(http, client, f"/v1/batches/{job.id}/results")
            status, dead = await client.request("GET", f"/v1/batches/{job.id}/dead_letter")
    finally:
        await server.close()
    expected = [
        {"custom_id": f"c-{i}", "content": chr(97 + i) * size}
        if i % 2 == 0
        else {"custom_id": f"c-{i}", "error": chr(97 + i) * size}
        for i, size in enumerate(SIZES)
    ]
    assert document == {"id": job.id, "status": "completed", "data": expected}
    assert ndjson == expected
    assert status == 200
    assert [row["custom_id"] for row in dead["data"]] == ["c-1", "c-3", "c-5", "c-7"]


async def ndjson_lines(http: aiohttp.ClientSession, client: ApiClient, path: str) -> list[Any]:
    """GET ``path`` as ndjson; one decoded object per line."""
    headers = {"Authorization": f"Bearer {client.key}", "Accept": "application/x-ndjson"}
    async with http.get(client.base_url + path, headers=headers) as response:
        assert response.status == 200
        raw = await response.read()
    return [orjson.loads(line) for line in raw.splitlines()]


async def test_results_carry_tool_calls_and_pages_count_their_bytes(
    pool: asyncpg.Pool, bus: Bus, aliases: AliasTable, client_a: ApiClient
) -> None:
    workspace = await KeyStore(pool).workspace_for_key(client_a.key)
    assert workspace is not None
    job = await JobStore(pool).create(
        NewJob(new_id(), workspace, "tools", "gpt-4o-mini", 0, 3, None, None, None),
        ((f"t-{i}", '[{"role":"user","content":"x"}]') for i in range(3)),
    )
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", job.id)
    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}' + " " * 20 * KIB},
        }
    ]
    await OutcomeStore(pool).record(
        [
            RowOutcome(job.id, 0, "", None, 1, tool_calls=orjson.dumps(calls).decode()),
            RowOutcome(job.id, 1, "plain", None, 1, finish_reason="stop"),
            RowOutcome(job.id, 2, None, "upstream_error: x", 1),
        ]
    )
    store = JobStore(pool, page_bytes=16 * KIB)
    finished = await store.get(workspace, job.id)
    assert finished is not None
    pages = [[row.row_index for row in page] async for page in store.result_pages(finished)]
    assert pages == [[0], [1, 2]]  # the tool calls' bytes count towards the budget
    server = await start_api(pool, bus, aliases, store)
    try:
        async with aiohttp.ClientSession() as http:
            client = ApiClient(str(server.make_url("")).rstrip("/"), client_a.key, http)
            document = await client.results(job.id)
            ndjson = await ndjson_lines(http, client, f"/v1/batches/{job.id}/results")
    finally:
        await server.close()
    expected = [
        {"custom_id": "t-0", "content": "", "tool_calls": calls},
        {"custom_id": "t-1", "content": "plain"},
        {"custom_id": "t-2", "error": "upstream_error: x"},
    ]
    assert document == {"id": job.id, "status": "completed", "data": expected}
    assert ndjson == expected


async def test_a_whole_reply_is_stored_and_its_bytes_cut_the_answered_pages(
    pool: asyncpg.Pool,
) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"bodies-{new_id()[:8]}")
    job = await JobStore(pool).create(
        NewJob(new_id(), workspace, "bodies", "gpt-4o-mini", 0, 2, None, None, None),
        ((f"b-{i}", '[{"role":"user","content":"x"}]') for i in range(2)),
    )
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", job.id)
    body = orjson.dumps({"choices": [{"index": i, "pad": "x" * 20 * KIB} for i in range(3)]})
    await OutcomeStore(pool).record(
        [
            RowOutcome(job.id, 0, "a", None, 1, body=body.decode()),
            RowOutcome(job.id, 1, "b", None, 1),
        ]
    )
    store = JobStore(pool, page_bytes=16 * KIB)
    finished = await store.get(workspace, job.id)
    assert finished is not None
    pages = [page async for page in store.answered_pages(finished)]
    assert [[row.row_index for row in page] for page in pages] == [[0], [1]]
    assert [row.body for page in pages for row in page] == [body.decode(), None]
