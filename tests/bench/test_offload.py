"""Offload throughput and CPU (``make bench``): one job of ``RELAY_BENCH_OFFLOAD_ROWS``
rows (default 20,000) through the simulated OpenAI Batch API with its processing delay
at 0, against the same job realtime on the same simulator.

Reported: rows/s of each (submit to completed; the offload figure includes the
offloader's one-second linger and its pass interval), the offloader's CPU µs per
offloaded row, and the row-worker's per realtime row (the work offload replaces), with
the dispatcher's and aggregator's per row in both runs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.bench.harness import Bench, bench_system, process_cpu_s
from tests.helpers.support import rows

OFFLOAD_ROWS = int(os.environ.get("RELAY_BENCH_OFFLOAD_ROWS", "20000"))
MEASURED = ("offloader", "row-worker", "dispatcher", "aggregator")


async def timed_job(bench: Bench, alias: str, n: int) -> tuple[float, dict[str, float]]:
    """Run one job of ``n`` rows on ``alias``; (seconds, CPU µs per row by service)."""
    pids = {name: bench.system.processes[name].pid for name in MEASURED}
    cpu0 = {name: process_cpu_s(pid) for name, pid in pids.items()}
    body = orjson.dumps({"model": alias, "requests": rows(n, "bench {i}: fine")})
    started = time.perf_counter()
    created = await bench.post(body)
    await bench.wait_completed(created["id"], n)
    seconds = time.perf_counter() - started
    cpu = {name: (process_cpu_s(pid) - cpu0[name]) / n * 1e6 for name, pid in pids.items()}
    return seconds, {name: round(us, 1) for name, us in cpu.items()}


async def test_offload_rows_per_second_and_cpu_per_row(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    n = OFFLOAD_ROWS
    async with bench_system(
        output_dir,
        "offload",
        http,
        concurrency=32,
        RELAY_OFFLOAD_INTERVAL_S="0.2",
        RELAY_MAX_ROWS=str(max(n, 100_000)),
    ) as bench:
        await timed_job(bench, "sim-half", 200)  # warm-up: connections, prepared statements
        await timed_job(bench, "sim-priced", 200)
        offload_s, offload_cpu = await timed_job(bench, "sim-half", n)
        realtime_s, realtime_cpu = await timed_job(bench, "sim-priced", n)
    report["offload_rows"] = n
    report["offload_rows_per_s"] = round(n / offload_s, 1)
    report["offload_realtime_rows_per_s"] = round(n / realtime_s, 1)
    report["offload_cpu_us_per_row"] = offload_cpu
    report["offload_realtime_cpu_us_per_row"] = realtime_cpu
    report["offload_offloader_vs_row_worker_cpu"] = round(
        offload_cpu["offloader"] / max(realtime_cpu["row-worker"], 0.1), 3
    )
    print("\noffload:", orjson.dumps({k: v for k, v in report.items() if k.startswith("offload")}))
    assert offload_cpu["offloader"] < realtime_cpu["row-worker"]
