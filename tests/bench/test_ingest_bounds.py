"""Benchmarks of ingest-api under 100 MiB bodies: peak memory and event-loop latency.

Each figure is measured on a real ingest-api process: its peak RSS is the kernel's
high-water mark (``VmHWM`` in ``/proc/<pid>/status``, reset before each submit through
``clear_refs``), and ``/healthz`` is polled every 50 ms while the submit runs; its worst
answer time is the loop's worst stall as a liveness probe would see it.
"""

from __future__ import annotations

import asyncio
import io
import os
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from relay_batches.services.relay_cli import admin
from tests.bench.harness import MIB, Bench, bench_system, upload_jsonl

POLL_S = 0.05
TARGET_MIB = 100
JSON_ROWS = int(os.environ.get("RELAY_BENCH_JSON_ROWS", "1000000"))


def vm_hwm_mib(pid: int) -> float:
    """The peak RSS of ``pid`` since its last reset, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def reset_hwm(pid: int) -> None:
    """Reset the peak RSS of ``pid`` to its current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def many_small_messages() -> bytes:
    """~100 MiB: 100,000 rows of 30 short messages (the review's 1,229 MiB shape)."""
    messages = [{"role": "user", "content": f"m{j:02}x"} for j in range(30)]
    requests = [{"custom_id": f"r-{i}", "messages": messages} for i in range(100_000)]
    return orjson.dumps({"model": "gpt-4o-mini", "requests": requests})


def few_large_messages() -> bytes:
    """~100 MiB: 100 rows of one ~1 MB message."""
    content = "x" * (1024 * 1024 - 64)
    requests = [{"messages": [{"role": "user", "content": content}]} for _ in range(100)]
    return orjson.dumps({"model": "gpt-4o-mini", "requests": requests})


def jsonl_file(first: str = "m00x") -> bytes:
    """~100 MiB upload file: 100,000 lines of 30 short messages (the first one's first
    content ``first``)."""
    messages = [{"role": "user", "content": f"m{j:02}x"} for j in range(30)]
    line = orjson.dumps({"messages": messages})
    head = orjson.dumps({"messages": [{"role": "user", "content": first}, *messages[1:]]})
    return b"\n".join([head, *(line for _ in range(99_999))]) + b"\n"


def jsonl_file_with_an_emoji() -> bytes:
    """The same file with one emoji: a str holding it takes 4 bytes per character."""
    return jsonl_file("m\U0001f600")


async def worst_healthz(http: aiohttp.ClientSession, url: str, done: asyncio.Event) -> float:
    """Poll ``url``/healthz every 50 ms until ``done``; the slowest answer, in seconds."""
    worst = 0.0
    while not done.is_set():
        started = time.perf_counter()
        async with http.get(f"{url}/healthz") as response:
            await response.read()
            assert response.status == 200
        worst = max(worst, time.perf_counter() - started)
        await asyncio.sleep(POLL_S)
    return worst


async def post_until_created(bench: Bench, body: bytes, key: str | None = None) -> int:
    """POST ``body`` (as ``key``'s workspace, else the bench's), retrying after
    ``Retry-After`` on 503; the number of 503s."""
    refused = 0
    while True:
        async with bench.http.post(
            f"{bench.api.base_url}/v1/batches",
            data=io.BytesIO(body),
            headers={
                "Authorization": f"Bearer {key or bench.api.key}",
                "Content-Type": "application/json",
            },
        ) as response:
            await response.read()
            if response.status != 503:
                assert response.status == 201, response.status
                return refused
            refused += 1
            await asyncio.sleep(float(response.headers["Retry-After"]))


async def upload(bench: Bench, data: bytes) -> None:
    """Upload ``data`` as one .jsonl file; insist on 201."""
    await upload_jsonl(bench, data, "big.jsonl")


async def measured(bench: Bench, work: Awaitable[Any]) -> tuple[float, float, Any]:
    """(peak RSS MiB, worst /healthz seconds, result) of ``work`` on ingest-api."""
    pid = bench.system.processes["ingest-api"].pid
    reset_hwm(pid)
    done = asyncio.Event()
    poller = asyncio.create_task(worst_healthz(bench.http, bench.api.base_url, done))
    try:
        result = await work
    finally:
        done.set()
        worst = await poller
    return vm_hwm_mib(pid), worst, result


async def test_100_mib_submits_bounded_memory_and_a_responsive_loop(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    async with bench_system(output_dir, "ingest100", http, RELAY_DISPATCH_WINDOW="1") as bench:
        peaks: dict[str, float] = {}
        worst: dict[str, float] = {}
        for name, build in (("many_small", many_small_messages), ("few_large", few_large_messages)):
            body = build()
            assert len(body) <= 100 * MIB, len(body)
            peaks[name], worst[name], _ = await measured(bench, post_until_created(bench, body))
            del body
        for name, build in (("upload", jsonl_file), ("upload_emoji", jsonl_file_with_an_emoji)):
            data = build()
            peaks[name], worst[name], _ = await measured(bench, upload(bench, data))
            del data
        three = many_small_messages()
        # Three workspaces: a workspace holds one large-body slot at a time.
        keys = [(await admin.create_key(bench.database_url, f"bench-{i}")).key for i in range(3)]
        peak3, worst3, refused = await measured(
            bench, asyncio.gather(*(post_until_created(bench, three, key) for key in keys))
        )
    report["ingest_peak_rss_mib_by_shape"] = {k: round(v, 1) for k, v in peaks.items()}
    report["ingest_worst_healthz_s_by_shape"] = {k: round(v, 3) for k, v in worst.items()}
    report["ingest_peak_rss_mib_100mib"] = round(max(peaks["many_small"], peaks["few_large"]), 1)
    report["ingest_upload_peak_rss_mib_100mib"] = round(
        max(peaks["upload"], peaks["upload_emoji"]), 1
    )
    report["ingest_worst_healthz_s"] = round(max(*worst.values(), worst3), 3)
    report["ingest_peak_rss_mib_3x100mib"] = round(peak3, 1)
    report["ingest_3x100mib_503s"] = sum(refused)
    print(
        f"\nbody shapes peak RSS {peaks} MiB; worst /healthz {worst} s; three at once: "
        f"{peak3:.0f} MiB, worst /healthz {worst3:.3f} s, {sum(refused)} 503s"
    )


def million_row_body(rows: int) -> bytes:
    """~100 MiB at 1,000,000 rows: rows of one 35-character message (~100 bytes each: 97 MiB),
    the shape where per-row overhead, not content, dominates the decode."""
    requests = [
        {"custom_id": f"r-{i}", "messages": [{"role": "user", "content": f"q{i:07} " + "x" * 26}]}
        for i in range(rows)
    ]
    return orjson.dumps({"model": "gpt-4o-mini", "requests": requests})


async def test_a_million_row_json_body_peak_rss(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    """One ~100 MiB JSON body of RELAY_BENCH_JSON_ROWS rows (1,000,000 by default), then
    two at once from two workspaces (RELAY_MAX_LARGE_BODIES=2): the figures the ingest
    pod's memory limit (deploy/k8s/base/ingest-api.yaml) is sized by."""
    body = million_row_body(JSON_ROWS)
    assert len(body) <= 100 * MIB, len(body)
    async with bench_system(output_dir, "ingest1m", http, RELAY_DISPATCH_WINDOW="1") as bench:
        pid = bench.system.processes["ingest-api"].pid
        baseline = vm_hwm_mib(pid)
        one, worst_one, _ = await measured(bench, post_until_created(bench, body))
        keys = [(await admin.create_key(bench.database_url, f"bench-1m-{i}")).key for i in range(2)]
        two, worst_two, _ = await measured(
            bench, asyncio.gather(*(post_until_created(bench, body, key) for key in keys))
        )
    report["ingest_json_body_rows"] = JSON_ROWS
    report["ingest_json_body_mib"] = round(len(body) / MIB, 1)
    report["ingest_baseline_rss_mib"] = round(baseline, 1)
    report["ingest_peak_rss_mib_1m_rows"] = round(one, 1)
    report["ingest_peak_rss_mib_2x1m_rows"] = round(two, 1)
    report["ingest_worst_healthz_s_1m_rows"] = round(max(worst_one, worst_two), 3)
    print(
        f"\n{JSON_ROWS} rows, {len(body) / MIB:.1f} MiB: baseline {baseline:.0f} MiB, one"
        f" {one:.0f} MiB, two at once {two:.0f} MiB; worst /healthz"
        f" {max(worst_one, worst_two):.3f} s"
    )
