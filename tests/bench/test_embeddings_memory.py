"""Memory bounded in bytes for large answers (issue 28, item 3): an embeddings job of
``RELAY_BENCH_EMBED_ROWS`` rows (default 50,000), each answered with
``RELAY_BENCH_EMBED_DIMENSIONS`` floats (default 1,536: about 1 GB of JSON output in
all), run end to end with every service's RSS sampled throughout:

1. an OpenAI batch input file of that many ``/v1/embeddings`` lines uploaded and a batch
   created from it (``embed_ingest_rows_per_s``, from the upload's start to the batch);
2. the batch run to completion against the simulator at zero latency
   (``embed_run_rows_per_s``);
3. its output file downloaded through the OpenAI surface, every line's body an
   embedding of the asked dimensions (``embed_output_rows_per_s``, ``embed_output_mib``);
4. the native results streamed as ndjson (``embed_results_rows_per_s``).

``embed_run_cpu_ms_per_row`` is each process's CPU per row while the batch runs (the
simulator's included: it makes every vector).

``embed_peak_rss_mib`` is each Relay service's peak over all of it; each must stay
under 300 MiB. Not part of ``make test`` (``make bench``).
"""

from __future__ import annotations

import asyncio
import io
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.bench.harness import MIB, Bench, RssSampler, bench_system, process_cpu_s

ROWS = int(os.environ.get("RELAY_BENCH_EMBED_ROWS", "50000"))
DIMENSIONS = int(os.environ.get("RELAY_BENCH_EMBED_DIMENSIONS", "1536"))
WORKERS = int(os.environ.get("RELAY_BENCH_EMBED_WORKERS", "2"))
BOUND_MIB = 300
LONG = aiohttp.ClientTimeout(total=7200)


def input_file(rows: int) -> bytes:
    """``rows`` OpenAI batch lines asking for an embedding of a short passage each."""
    return b"".join(
        orjson.dumps(
            {
                "custom_id": f"r-{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {
                    "model": "text-embedding-3-small",
                    "input": f"passage {i}: a short text to index",
                    "dimensions": DIMENSIONS,
                },
            }
        )
        + b"\n"
        for i in range(rows)
    )


async def ingest(bench: Bench, data: bytes) -> dict[str, Any]:
    """Upload the file and create its embeddings batch; the batch."""
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field(
        "file", io.BytesIO(data), filename="embed.jsonl", content_type="application/jsonl"
    )
    headers = {"Authorization": f"Bearer {bench.api.key}"}
    async with bench.http.post(
        f"{bench.api.base_url}/openai/v1/files", data=form, headers=headers, timeout=LONG
    ) as response:
        stored = await response.json()
        assert response.status == 200, stored
    status, batch = await bench.api.request(
        "POST",
        "/openai/v1/batches",
        json={
            "input_file_id": stored["id"],
            "endpoint": "/v1/embeddings",
            "completion_window": "24h",
        },
    )
    assert status == 200, batch
    assert batch["request_counts"]["total"] == ROWS, batch
    answer: dict[str, Any] = batch
    return answer


async def wait_done(bench: Bench, batch_id: str) -> dict[str, Any]:
    """Poll the OpenAI batch until it is completed with every row."""
    while True:
        status, batch = await bench.api.request("GET", f"/openai/v1/batches/{batch_id}")
        assert status == 200, batch
        if batch["status"] == "completed":
            assert batch["request_counts"]["completed"] == ROWS, batch
            answer: dict[str, Any] = batch
            return answer
        assert batch["status"] in {"in_progress", "finalizing"}, batch
        await asyncio.sleep(1.0)


async def stream_lines(bench: Bench, path: str, check: Any, accept: str | None = None) -> int:
    """Stream ``path`` line by line, ``check`` each decoded line; the bytes read."""
    headers = {"Authorization": f"Bearer {bench.api.key}"}
    if accept:
        headers["Accept"] = accept
    size, tail = 0, b""
    async with bench.http.get(
        f"{bench.api.base_url}{path}", headers=headers, timeout=LONG
    ) as response:
        assert response.status == 200, await response.text()
        async for chunk in response.content.iter_chunked(MIB):
            size += len(chunk)
            *lines, tail = (tail + chunk).split(b"\n")
            for line in lines:
                if line.strip():
                    check(orjson.loads(line))
    if tail.strip():
        check(orjson.loads(tail))
    return size


async def test_embeddings_job_of_a_gigabyte_of_answers(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    report["embed_rows"], report["embed_dimensions"] = ROWS, DIMENSIONS
    async with bench_system(
        output_dir, "embed", http, workers=WORKERS, concurrency=32, latency_ms=0
    ) as bench:
        data = input_file(ROWS)
        with RssSampler(bench.pids()) as sampler:
            started = time.perf_counter()
            batch = await ingest(bench, data)
            ingested = time.perf_counter()
            del data
            every = {**bench.pids(), "upstream-sim": bench.system.processes["upstream-sim"].pid}
            cpu_before = {name: process_cpu_s(pid) for name, pid in every.items()}
            done = await wait_done(bench, batch["id"])
            finished = time.perf_counter()
            cpu = {name: process_cpu_s(pid) - cpu_before[name] for name, pid in every.items()}

            seen: set[str] = set()

            def output_line(line: dict[str, Any]) -> None:
                body = line["response"]["body"]
                assert len(body["data"][0]["embedding"]) == DIMENSIONS
                seen.add(line["custom_id"])

            output_size = await stream_lines(
                bench, f"/openai/v1/files/{done['output_file_id']}/content", output_line
            )
            downloaded = time.perf_counter()
            assert len(seen) == ROWS

            results: set[str] = set()

            def result_row(row: dict[str, Any]) -> None:
                if "custom_id" in row:
                    assert len(row["response"]["data"][0]["embedding"]) == DIMENSIONS
                    results.add(row["custom_id"])

            hex_id = batch["id"].removeprefix("batch_")
            results_size = await stream_lines(
                bench, f"/v1/batches/{hex_id}/results", result_row, "application/x-ndjson"
            )
            streamed = time.perf_counter()
            assert len(results) == ROWS

    peaks = {name: round(peak, 1) for name, peak in sampler.peaks.items()}
    report["embed_ingest_rows_per_s"] = round(ROWS / (ingested - started))
    report["embed_run_rows_per_s"] = round(ROWS / (finished - ingested))
    report["embed_output_rows_per_s"] = round(ROWS / (downloaded - finished))
    report["embed_output_mib"] = round(output_size / MIB, 1)
    report["embed_results_rows_per_s"] = round(ROWS / (streamed - downloaded))
    report["embed_results_mib"] = round(results_size / MIB, 1)
    report["embed_peak_rss_mib"] = peaks
    report["embed_run_cpu_ms_per_row"] = {k: round(1000 * v / ROWS, 3) for k, v in cpu.items()}
    print(f"\nembeddings ({ROWS} x {DIMENSIONS}): {report}")
    assert max(peaks.values()) <= BOUND_MIB, peaks
