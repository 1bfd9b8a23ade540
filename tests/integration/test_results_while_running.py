"""Partial results, row details and a job's stats on the real ledger and the real API:
what a user sees of a job while it runs and after."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
from aiohttp.test_utils import TestServer

from relay_batches.ids import new_id
from relay_batches.ledger.job_stats import (
    INTERVALS_S,
    LATENCY_BOUNDS_MS,
    MAX_INTERVALS,
    JobStatsStore,
    interval_for,
)
from relay_batches.ledger.jobs import DETAIL_BYTES, JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.messages import RowOutcome
from relay_batches.model import Job
from relay_batches.services.ingest_api.openapi import load_document
from tests.helpers.openapi_ops import component_validator
from tests.helpers.support import ApiClient

DOC = load_document()

T0 = datetime(2026, 11, 3, 10, 0, 0, tzinfo=UTC)


async def running_job(pool: asyncpg.Pool, workspace: str, total: int) -> Job:
    """A running job of ``total`` rows ``c-0``… with no outcome yet."""
    job = await JobStore(pool).create(
        NewJob(new_id(), workspace, "running", "gpt-4o-mini", 0, total, None, None, None),
        ((f"c-{i}", '[{"role":"user","content":"x"}]') for i in range(total)),
    )
    record = await pool.fetchrow(
        "UPDATE batches SET status = 'running', started_at = $2 WHERE id = $1 RETURNING *",
        job.id,
        T0,
    )
    return Job.from_record(record)


async def workspace_of(pool: asyncpg.Pool, client: ApiClient) -> str:
    """The workspace of ``client``'s key."""
    workspace = await KeyStore(pool).workspace_for_key(client.key)
    assert workspace is not None
    return workspace


async def ndjson(http: aiohttp.ClientSession, client: ApiClient, path: str) -> list[Any]:
    """GET ``path`` as ndjson; one decoded object per line."""
    headers = {"Authorization": f"Bearer {client.key}", "Accept": "application/x-ndjson"}
    async with http.get(client.base_url + path, headers=headers) as response:
        assert response.status == 200
        return [orjson.loads(line) for line in (await response.read()).splitlines()]


async def test_partial_results_show_the_rows_finished_so_far_with_their_details(
    pool: asyncpg.Pool, client_a: ApiClient, http: aiohttp.ClientSession
) -> None:
    job = await running_job(pool, await workspace_of(pool, client_a), 4)
    await OutcomeStore(pool).record(
        [
            RowOutcome(
                job.id, 0, "zero", None, 1, False, "sim-a", 7, 3,
                finish_reason="stop", latency_ms=42, cost_usd=0.0000123,
            ),
            RowOutcome(
                job.id, 2, None, "upstream_error: sim: 503", 4, True, "sim-b", latency_ms=900
            ),
        ]
    )  # fmt: skip
    path = f"/v1/batches/{job.id}/results"

    assert await client_a.results(job.id) == {"id": job.id, "status": "running", "data": []}
    status, partial = await client_a.request("GET", path + "?partial=true")
    plain_rows = [
        {"custom_id": "c-0", "content": "zero"},
        {"custom_id": "c-2", "error": "upstream_error: sim: 503"},
    ]
    assert (status, partial) == (
        200,
        {"id": job.id, "status": "running", "partial": True, "data": plain_rows},
    )
    assert await ndjson(http, client_a, path + "?partial=true") == plain_rows
    status, unpartial = await client_a.request("GET", path + "?partial=false")
    assert (status, unpartial) == (200, {"id": job.id, "status": "running", "data": []})

    detailed = [
        {
            "custom_id": "c-0",
            "content": "zero",
            "usage": {"prompt_tokens": 7, "completion_tokens": 3},
            "attempts": 1,
            "deployment": "sim-a",
            "latency_ms": 42,
            "finish_reason": "stop",
            "cost_usd": 0.0000123,
        },
        {
            "custom_id": "c-2",
            "error": "upstream_error: sim: 503",
            "usage": {"prompt_tokens": 0, "completion_tokens": 0},
            "attempts": 4,
            "deployment": "sim-b",
            "latency_ms": 900,
            "finish_reason": None,
        },
    ]
    status, body = await client_a.request("GET", path + "?partial=true&include=details")
    assert (status, body["data"]) == (200, detailed)
    assert await ndjson(http, client_a, path + "?include=details&partial=true") == detailed
    status, dead = await client_a.request(
        "GET", f"/v1/batches/{job.id}/dead_letter?include=details"
    )
    assert (status, dead) == (200, {"id": job.id, "data": [detailed[1]]})
    component_validator(DOC, "Results").validate(partial)
    component_validator(DOC, "Results").validate(body)
    component_validator(DOC, "DeadLetters").validate(dead)

    status, failed = await client_a.request("GET", path + "?partial=true&outcome=error")
    assert (status, failed["data"]) == (200, [plain_rows[1]])
    status, succeeded = await client_a.request(
        "GET", path + "?partial=true&outcome=content&include=details"
    )
    assert (status, succeeded["data"]) == (200, [detailed[0]])
    assert await ndjson(http, client_a, path + "?outcome=error&partial=true") == [plain_rows[1]]
    component_validator(DOC, "Results").validate(failed)


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("partial=yes", "partial"),
        ("partial=True", "partial"),
        ("partial=", "partial"),
        ("include=usage", "include"),
        ("partial=true&include=", "include"),
        ("partial=true&partial=bogus", "partial"),
        ("partial=true&partial=true", "partial"),
        ("include=details&include=details", "include"),
        ("outcome=failed", "outcome"),
        ("outcome=", "outcome"),
        ("outcome=error&outcome=content", "outcome"),
    ],
)
async def test_a_bad_partial_include_or_outcome_is_a_400_naming_it(
    pool: asyncpg.Pool, client_a: ApiClient, query: str, param: str
) -> None:
    job = await running_job(pool, await workspace_of(pool, client_a), 1)
    status, body = await client_a.request("GET", f"/v1/batches/{job.id}/results?{query}")
    assert status == 400
    assert (body["error"]["type"], body["error"]["param"]) == ("invalid_request_error", param)
    if param == "include":
        status, body = await client_a.request("GET", f"/v1/batches/{job.id}/dead_letter?{query}")
        assert (status, body["error"]["param"]) == (400, "include")


async def test_detail_pages_count_the_details_in_their_bytes(pool: asyncpg.Pool) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"details-{new_id()[:6]}")
    job = await running_job(pool, workspace, 6)
    await OutcomeStore(pool).record(
        [
            RowOutcome(job.id, i, "x" * 100, None, 1, deployment="d" * 40, finish_reason="stop")
            for i in range(6)
        ]
    )
    # A plain row counts 3 + 100 bytes, a detailed one 40 + 4 + DETAIL_BYTES more.
    budget = 2 * (103 + 44 + DETAIL_BYTES) + 10  # six plain rows fit, three detailed do not
    store = JobStore(pool, page_bytes=budget)
    plain = [[r.row_index for r in page] async for page in store.result_pages(job)]
    pages = [page async for page in store.detailed_result_pages(job)]
    assert plain == [[0, 1, 2, 3, 4, 5]]
    assert [[r.row_index for r in page] for page in pages] == [[0, 1], [2, 3], [4, 5]]
    first = pages[0][0].details
    assert first is not None
    assert (first.deployment, first.finish_reason, first.attempts) == ("d" * 40, "stop", 1)


async def record_at(
    pool: asyncpg.Pool, job: Job, outcomes: list[tuple[float, bool, int | None]]
) -> None:
    """Record one outcome per ``(seconds after T0, succeeded, latency_ms)``, then date each
    as that moment."""
    await OutcomeStore(pool).record(
        [
            RowOutcome(job.id, i, "ok" if ok else None, None if ok else "boom", 1, latency_ms=ms)
            for i, (_, ok, ms) in enumerate(outcomes)
        ]
    )
    await pool.execute(
        "UPDATE row_results o SET created_at = $2::timestamptz + make_interval(secs => t.s)"
        " FROM unnest($3::float8[]) WITH ORDINALITY AS t(s, n)"
        " WHERE o.batch_id = $1 AND o.row_index = t.n - 1",
        job.id,
        T0,
        [at for at, _, _ in outcomes],
    )


async def test_stats_count_rows_per_interval_and_bucket_latencies(pool: asyncpg.Pool) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"stats-{new_id()[:6]}")
    job = await running_job(pool, workspace, 9)
    outcomes = [(0.2, True, 5), (0.9, True, 10), (1.5, False, 11), (4.0, True, 25),
                (4.1, True, 240), (4.9, False, 1000), (4.95, True, 70000),
                (3.2, True, None)]  # fmt: skip
    await record_at(pool, job, outcomes)

    stats = (await JobStatsStore(pool).stats(job)).to_api()

    assert stats == {
        "id": job.id,
        "object": "batch.stats",
        "status": "running",
        "started_at": "2026-11-03T10:00:00Z",
        "interval_s": 1,  # 0.2 s to 4.95 s: five 1-second intervals
        "progress": [
            {"start": f"2026-11-03T10:00:0{s}Z", "completed": c, "failed": f}
            for s, (c, f) in enumerate([(2, 0), (0, 1), (0, 0), (1, 0), (3, 1)])
        ],
        "latency": {
            "count": 7,
            "p50_ms": 25,
            "p90_ms": 70000,
            "p99_ms": 70000,
            "max_ms": 70000,
            "buckets": [
                {"le_ms": le, "count": n, "failed": f}
                for le, n, f in zip(
                    (*LATENCY_BOUNDS_MS, None),
                    (2, 2, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1),
                    (0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0),  # the 11 ms and 1000 ms errors
                    strict=True,
                )
            ],
        },
    }
    component_validator(DOC, "BatchStats").validate(stats)
    total = sum(i["completed"] + i["failed"] for i in stats["progress"])
    assert total == len(outcomes)


async def test_stats_of_a_job_without_outcomes_are_empty(pool: asyncpg.Pool) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"stats-{new_id()[:6]}")
    job = await running_job(pool, workspace, 2)
    stats = (await JobStatsStore(pool).stats(job)).to_api()
    assert (stats["interval_s"], stats["progress"]) == (INTERVALS_S[0], [])
    assert stats["latency"] == {
        "count": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None,
        "buckets": [{"le_ms": le, "count": 0, "failed": 0} for le in (*LATENCY_BOUNDS_MS, None)],
    }  # fmt: skip


@pytest.mark.parametrize(
    "span_s", [0.0, 119.0, 119.5, 120.0, 599.0, 601.0, 3 * 3600.0, 7 * 86400.0, 200 * 86400.0]
)
async def test_the_query_picks_the_interval_rule_and_stays_bounded(
    pool: asyncpg.Pool, span_s: float
) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"stats-{new_id()[:6]}")
    job = await running_job(pool, workspace, 3)
    start = 0.4
    await record_at(
        pool, job, [(start, True, 1), (start + span_s / 2, False, 2), (start + span_s, True, 3)]
    )

    stats = await JobStatsStore(pool).stats(job)

    first_s = (T0 + timedelta(seconds=start)).timestamp()
    width = interval_for(first_s, first_s + span_s)
    assert stats.interval_s == width
    expected = math.floor((first_s + span_s) / width) - math.floor(first_s / width) + 1
    assert len(stats.progress) == expected <= MAX_INTERVALS
    assert sum(i.completed for i in stats.progress) == 2
    assert sum(i.failed for i in stats.progress) == 1
    steps = {
        (b.start - a.start).total_seconds()
        for a, b in zip(stats.progress, stats.progress[1:], strict=False)
    }
    assert steps <= {float(width)}


async def test_the_stats_route_answers_for_the_callers_batches_only(
    pool: asyncpg.Pool, api_server: TestServer, client_a: ApiClient, client_b: ApiClient
) -> None:
    job = await running_job(pool, await workspace_of(pool, client_a), 2)
    await record_at(pool, job, [(0.5, True, 30), (1.5, False, None)])
    status, stats = await client_a.request("GET", f"/v1/batches/{job.id}/stats")
    assert status == 200
    assert (stats["object"], stats["interval_s"], stats["latency"]["count"]) == (
        "batch.stats",
        1,
        1,
    )
    assert stats["progress"] == [
        {"start": "2026-11-03T10:00:00Z", "completed": 1, "failed": 0},
        {"start": "2026-11-03T10:00:01Z", "completed": 0, "failed": 1},
    ]
    component_validator(DOC, "BatchStats").validate(stats)
    status, body = await client_b.request("GET", f"/v1/batches/{job.id}/stats")
    assert (status, body["error"]["param"]) == (404, "id")
