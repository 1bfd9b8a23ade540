"""``openai_file_ingest_rows_per_s``: an OpenAI batch input file of 50,000 lines and about
200 MB uploaded to ``POST /openai/v1/files`` (spooled, then stored in the ledger: parts and
parsed rows) and the batch created from it, with the ingest-api's peak RSS while it
happens. Not part of ``make test`` (``make bench``)."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.bench.harness import (
    MIB,
    Bench,
    Figure,
    RssSampler,
    bench_system,
    create_openai_batch,
    openai_chat_file,
)

LINES = 50_000
LINE_BYTES = 4_000  # about 200 MB in all
RUNS = 2


def input_file(lines: int = LINES) -> bytes:
    """An OpenAI batch file of ``lines`` chat requests of about ``LINE_BYTES`` each."""
    return openai_chat_file(lines, "x" * (LINE_BYTES - 160))


async def upload(bench: Bench, data: bytes) -> dict[str, Any]:
    """``POST /openai/v1/files``; insists on 200."""
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", io.BytesIO(data), filename="big.jsonl", content_type="application/jsonl")
    async with bench.http.post(
        f"{bench.api.base_url}/openai/v1/files",
        data=form,
        headers={"Authorization": f"Bearer {bench.api.key}"},
        timeout=aiohttp.ClientTimeout(600),
    ) as response:
        stored: dict[str, Any] = await response.json()
        assert response.status == 200, stored
        return stored


async def test_openai_file_ingest_rows_per_second(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    data = input_file()
    async with bench_system(output_dir, "openai", http, RELAY_DISPATCH_WINDOW="1") as bench:
        api_pid = bench.system.processes["ingest-api"].pid
        figure, peak = Figure(), 0.0
        for _ in range(RUNS):
            with RssSampler({"ingest-api": api_pid}) as sampler:
                started = time.perf_counter()
                stored = await upload(bench, data)
                status, batch = await create_openai_batch(bench, stored["id"])
                figure.samples.append(LINES / (time.perf_counter() - started))
            assert status == 200 and batch["request_counts"]["total"] == LINES, batch
            assert stored["bytes"] == len(data)
            status, _ = await bench.api.request("POST", f"/openai/v1/batches/{batch['id']}/cancel")
            assert status == 200
            peak = max(peak, sampler.peaks["ingest-api"])
    report.update(figure.keys("openai_file_ingest_rows_per_s"))
    report["openai_file_ingest_peak_rss_mib"] = round(peak, 1)
    report["openai_file_ingest_file_mib"] = round(len(data) / MIB, 1)
