"""A million-row job end to end: upload, run, results, with every service's memory.

``RELAY_BENCH_MILLION_ROWS`` rows (default 1,000,000), each a full chat request of about
200 bytes:

1. an OpenAI batch input file of that many lines uploaded to ``POST /openai/v1/files``
   and a batch created from it (then canceled): ``million_openai_ingest_rows_per_s``
   and ingest-api's peak RSS;
2. the same rows as a native ``.jsonl`` on ``POST /v1/batches/upload``: one job,
   ``million_upload_rows_per_s``, ingest-api's peak RSS (``VmHWM``) and its worst
   ``/healthz`` answer meanwhile;
3. that job run to completion against the upstream simulator at zero latency:
   ``million_run_rows_per_s`` (from the upload's ``201``), every service's peak RSS, the
   machine's busy share and the CPU milliseconds per row of the Relay services and the
   simulator;
4. its results streamed back as ndjson: ``million_results_rows_per_s``, ingest-api's
   peak RSS, and every row has exactly one outcome.

The bounds of issue 15 are asserted: ingest-api ≤ 300 MiB while it ingests and its
``/healthz`` answered within 1 s meanwhile, every service ≤ 250 MiB while the job runs.

The run's curve (issue 27): rows/s in each 30-second window from the upload's ``201``,
over the first 8 minutes or up to the job's end (``million_run_curve_rows_per_s``),
every window at least 1,000 rows/s, on a new database where nothing was analyzed by
hand (this Postgres runs without autovacuum: only Relay's statistics keeper analyzes),
and again (:func:`test_million_row_job_on_a_ledger_of_ten_million_rows`) on a ledger
that already holds ``RELAY_BENCH_PRIOR_ROWS`` rows (default 10,000,000) of earlier
finished jobs, each with its outcome, stored set-based before the upload
(``million_prior_fill_s``). Not part of ``make test`` (``make bench``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson

from relay_batches.ids import new_id
from tests.bench.harness import (
    MIB,
    Bench,
    RssSampler,
    bench_system,
    busy_share,
    create_openai_batch,
    machine_ticks,
    openai_chat_file,
    process_cpu_s,
    upload_jsonl,
)
from tests.bench.test_ingest_bounds import measured
from tests.bench.test_openai_ingest import upload as upload_openai_file

ROWS = int(os.environ.get("RELAY_BENCH_MILLION_ROWS", "1000000"))
WORKERS = int(os.environ.get("RELAY_BENCH_MILLION_WORKERS", "2"))
INGEST_BOUND_MIB = 300
HEALTHZ_BOUND_S = 1.0  # a liveness probe times out at 2 s
RUN_BOUND_MIB = 250
PAD = "p" * 120  # a realistic prompt: each native line about 200 bytes
# The OpenAI line wraps the same request in its envelope (~80 bytes more): a shorter
# prompt keeps 1,000,000 of them (~260 bytes each) inside the 256 MiB file limit.
OPENAI_PAD = "p" * 90
LONG = aiohttp.ClientTimeout(total=3600)
CURVE_WINDOW_S = 30.0
CURVE_SPAN_S = 480.0  # the first 8 minutes
CURVE_FLOOR_ROWS_PER_S = 1_000
PRIOR_ROWS = int(os.environ.get("RELAY_BENCH_PRIOR_ROWS", "10000000"))
PRIOR_JOB_ROWS = 1_000_000


def native_file(rows: int) -> bytes:
    """A native ``.jsonl`` of ``rows`` requests ``{custom_id, messages, max_tokens}``."""
    return b"".join(
        orjson.dumps(
            {
                "custom_id": f"r-{i}",
                "messages": [{"role": "user", "content": f"row {i} {PAD}"}],
                "max_tokens": 16,
            }
        )
        + b"\n"
        for i in range(rows)
    )


def openai_file(rows: int) -> bytes:
    """An OpenAI batch input file of ``rows`` full ``/v1/chat/completions`` lines."""
    return openai_chat_file(rows, OPENAI_PAD, max_tokens=16)


async def upload_native(bench: Bench, data: bytes) -> dict[str, Any]:
    """``POST /v1/batches/upload`` of one file; insists on 201 with one job."""
    body = await upload_jsonl(bench, data, "million.jsonl", timeout=LONG)
    (created,) = body["data"]
    created_job: dict[str, Any] = created
    return created_job


async def openai_ingest(bench: Bench, report: dict[str, Any]) -> None:
    """Step 1: the OpenAI file and its batch (canceled once created)."""
    data = openai_file(ROWS)
    report["million_openai_file_mib"] = round(len(data) / MIB, 1)
    api_pid = bench.system.processes["ingest-api"].pid
    started = time.perf_counter()

    async def ingest() -> dict[str, Any]:
        stored = await upload_openai_file(bench, data)
        status, batch = await create_openai_batch(bench, stored["id"])
        assert status == 200, batch
        return batch

    with RssSampler({"ingest-api": api_pid}) as sampler:
        peak, worst, batch = await measured(bench, ingest())
    elapsed = time.perf_counter() - started
    assert batch["request_counts"]["total"] == ROWS, batch
    status, _ = await bench.api.request("POST", f"/openai/v1/batches/{batch['id']}/cancel")
    assert status == 200
    report["million_openai_ingest_rows_per_s"] = round(ROWS / elapsed)
    report["million_openai_ingest_peak_rss_mib"] = round(max(peak, sampler.peaks["ingest-api"]), 1)
    report["million_openai_ingest_worst_healthz_s"] = round(worst, 3)


async def run_curve(bench: Bench, batch_id: str, n: int, since: float) -> list[float]:
    """Wait until the job completed with its ``n`` rows, reading its progress every
    half second; the rows/s of each 30 s window from ``since`` (``perf_counter``) over
    the first 8 minutes, the last window cut at the job's end."""
    samples = [(since, 0)]
    while True:
        batch = await bench.api.get(batch_id)
        samples.append((time.perf_counter(), batch["completed"] + batch["failed"]))
        if batch["status"] == "completed":
            assert batch["completed"] == n, batch
            break
        assert batch["status"] in {"queued", "running"}, batch
        await asyncio.sleep(0.5)
    return curve(samples, since)


def curve(samples: list[tuple[float, int]], since: float) -> list[float]:
    """Rows/s in each window of :data:`CURVE_WINDOW_S` from ``since``, the rows done at
    each window's edges interpolated between the ``(time, rows done)`` samples."""

    def done_at(t: float) -> float:
        for (t0, d0), (t1, d1) in itertools.pairwise(samples):
            if t0 <= t <= t1:
                return d0 + (d1 - d0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
        return float(samples[-1][1])

    end = min(samples[-1][0], since + CURVE_SPAN_S)
    rates = []
    start = since
    while start < end - 1.0:  # a last sliver of under a second says nothing
        stop = min(start + CURVE_WINDOW_S, end)
        rates.append(round((done_at(stop) - done_at(start)) / (stop - start)))
        start = stop
    return rates


async def fill_prior_jobs(database_url: str, rows: int) -> float:
    """Store ``rows`` rows of earlier jobs (finished, a million rows each, every row with
    its outcome) as a bulk upload and the aggregator would, set-based; the seconds."""
    started = time.perf_counter()
    conn = await asyncpg.connect(database_url)
    try:
        workspace = new_id()
        await conn.execute("INSERT INTO workspaces (id, name) VALUES ($1, 'earlier')", workspace)
        for first in range(0, rows, PRIOR_JOB_ROWS):
            job, size = new_id(), min(PRIOR_JOB_ROWS, rows - first)
            await conn.execute(
                "INSERT INTO batches (id, workspace_id, name, model, status, total, completed,"
                " rows_batch_id, dispatched_upto, started_at, completed_at, finished_published)"
                " VALUES ($1, $2, 'earlier', 'gpt-4o-mini', 'completed', $3, $3, $1, $3,"
                " now() - interval '1 day', now() - interval '23 hours', true)",
                job,
                workspace,
                size,
            )
            await conn.execute(
                "INSERT INTO batch_rows (batch_id, row_index, custom_id, request)"
                ' SELECT $1, i, \'r-\' || i, \'[{"role":"user","content":"row \''
                " || i || ' ' || $3::text || '\"}]' FROM generate_series(0, $2 - 1) AS i",
                job,
                size,
                PAD,
            )
            await conn.execute(
                "INSERT INTO row_results (batch_id, row_index, content, attempts, deployment,"
                " prompt_tokens, completion_tokens, finish_reason, model, latency_ms)"
                " SELECT $1, i, 'echo: row ' || i, 1, 'sim', 40, 8, 'stop', 'gpt-4o-mini', 3"
                " FROM generate_series(0, $2 - 1) AS i",
                job,
                size,
            )
    finally:
        await conn.close()
    return time.perf_counter() - started


def report_curve(report: dict[str, Any], key: str, rates: list[float]) -> None:
    """Record a run's curve under ``key`` and print it."""
    report[key] = rates
    print(f"\n{key} (rows/s per {CURVE_WINDOW_S:g} s window): {rates}")


async def count_outcomes(bench: Bench, batch_id: str) -> tuple[int, int]:
    """Stream the job's results as ndjson; (rows with one outcome each, bytes). Insists
    that every row ``r-0`` … appears exactly once."""
    seen = bytearray(ROWS)
    size = 0
    tail = b""
    async with bench.http.get(
        f"{bench.api.base_url}/v1/batches/{batch_id}/results",
        headers={"Authorization": f"Bearer {bench.api.key}", "Accept": "application/x-ndjson"},
        timeout=LONG,
    ) as response:
        assert response.status == 200
        async for chunk in response.content.iter_chunked(MIB):
            size += len(chunk)
            *lines, tail = (tail + chunk).split(b"\n")
            for line in lines:
                _mark(seen, line)
    _mark(seen, tail)
    assert seen.count(1) == ROWS, f"{seen.count(0)} rows without an outcome"
    return ROWS, size


def _mark(seen: bytearray, line: bytes) -> None:
    if not line.strip():
        return
    row = orjson.loads(line)
    if "custom_id" not in row:
        return  # the head line
    assert "content" in row, row
    index = int(row["custom_id"].removeprefix("r-"))
    assert seen[index] == 0, f"{row['custom_id']} has two outcomes"
    seen[index] = 1


async def test_million_row_job(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    report["million_rows"] = ROWS
    async with bench_system(
        output_dir, "million", http, workers=WORKERS, concurrency=32, latency_ms=0
    ) as bench:
        pids = bench.pids()
        api_pid = pids["ingest-api"]
        await openai_ingest(bench, report)

        data = native_file(ROWS)
        report["million_upload_file_mib"] = round(len(data) / MIB, 1)
        with RssSampler({"ingest-api": api_pid}) as upload_sampler:
            started = time.perf_counter()
            peak, worst, created = await measured(bench, upload_native(bench, data))
            uploaded = time.perf_counter()
        del data
        assert created["total"] == ROWS, created
        upload_peak = max(peak, upload_sampler.peaks["ingest-api"])

        every = {**pids, "upstream-sim": bench.system.processes["upstream-sim"].pid}
        cpu_before = {name: process_cpu_s(pid) for name, pid in every.items()}
        ticks_before = machine_ticks()
        with RssSampler(pids) as run_sampler:
            rates = await run_curve(bench, created["id"], ROWS, uploaded)
            finished = time.perf_counter()
        ticks_after = machine_ticks()
        cpu = {name: process_cpu_s(pid) - cpu_before[name] for name, pid in every.items()}

        with RssSampler({"ingest-api": api_pid}) as results_sampler:
            results_started = time.perf_counter()
            rows, size = await count_outcomes(bench, created["id"])
            results_s = time.perf_counter() - results_started

    run_peaks = {k: round(v, 1) for k, v in run_sampler.peaks.items()}
    report["million_upload_rows_per_s"] = round(ROWS / (uploaded - started))
    report["million_upload_peak_rss_mib"] = round(upload_peak, 1)
    report["million_upload_worst_healthz_s"] = round(worst, 3)
    report["million_run_rows_per_s"] = round(ROWS / (finished - uploaded))
    report_curve(report, "million_run_curve_rows_per_s", rates)
    report["million_run_peak_rss_mib"] = run_peaks
    report["million_run_max_service_rss_mib"] = max(run_peaks.values())
    report["million_busy_share"] = round(busy_share(ticks_before, ticks_after), 3)
    report["million_cpu_ms_per_row"] = {k: round(1000 * v / ROWS, 4) for k, v in cpu.items()}
    report["million_cpu_ms_per_row_total"] = round(1000 * sum(cpu.values()) / ROWS, 4)
    report["million_results_rows_per_s"] = round(rows / results_s)
    report["million_results_mib"] = round(size / MIB, 1)
    report["million_results_ingest_rss_mib"] = round(results_sampler.peaks["ingest-api"], 1)
    print(
        f"\nmillion rows ({ROWS}): upload {report['million_upload_rows_per_s']} rows/s at"
        f" {report['million_upload_peak_rss_mib']} MiB, run {report['million_run_rows_per_s']}"
        f" rows/s, peaks {run_peaks}, results {report['million_results_rows_per_s']} rows/s"
    )
    assert report["million_openai_ingest_peak_rss_mib"] <= INGEST_BOUND_MIB, report
    assert upload_peak <= INGEST_BOUND_MIB, upload_peak
    assert max(run_peaks.values()) <= RUN_BOUND_MIB, run_peaks
    worst_healthz = max(worst, report["million_openai_ingest_worst_healthz_s"])
    assert worst_healthz <= HEALTHZ_BOUND_S, worst_healthz
    assert min(rates) >= CURVE_FLOOR_ROWS_PER_S, rates


async def test_million_row_job_on_a_ledger_of_ten_million_rows(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    report["million_prior_rows"] = PRIOR_ROWS
    async with bench_system(
        output_dir, "million_prior", http, workers=WORKERS, concurrency=32, latency_ms=0
    ) as bench:
        report["million_prior_fill_s"] = round(
            await fill_prior_jobs(bench.database_url, PRIOR_ROWS), 1
        )
        data = native_file(ROWS)
        started = time.perf_counter()
        created = await upload_native(bench, data)
        uploaded = time.perf_counter()
        del data
        assert created["total"] == ROWS, created
        rates = await run_curve(bench, created["id"], ROWS, uploaded)
        finished = time.perf_counter()
    report["million_prior_upload_rows_per_s"] = round(ROWS / (uploaded - started))
    report["million_prior_run_rows_per_s"] = round(ROWS / (finished - uploaded))
    report_curve(report, "million_prior_run_curve_rows_per_s", rates)
    print(
        f"prior ledger: {PRIOR_ROWS} rows stored in {report['million_prior_fill_s']} s,"
        f" upload {report['million_prior_upload_rows_per_s']} rows/s,"
        f" run {report['million_prior_run_rows_per_s']} rows/s"
    )
    assert min(rates) >= CURVE_FLOOR_ROWS_PER_S, rates
