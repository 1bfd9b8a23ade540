"""Benchmark of dispatcher CPU per row with one and with three dispatchers.

The same job (``RELAY_BENCH_DISPATCH_ROWS`` rows, default 200,000, submitted in batches
of at most ``RELAY_MAX_ROWS``) runs on a whole system with one dispatcher, then on a
fresh one with three. One dispatcher owns a job at a time, and its progress events go to
that dispatcher only (``job.progress.<owner>``), so the others only take worker
heartbeats and make their reconcile passes: the CPU seconds all dispatcher processes
spend per row (``/proc/<pid>/stat``) must stay flat, not grow with the dispatchers (when
every dispatcher took every progress event, it grew with them).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.bench.harness import Bench, bench_system, busy_share, machine_ticks, process_cpu_s
from tests.helpers.support import rows

ROWS = int(os.environ.get("RELAY_BENCH_DISPATCH_ROWS", "200000"))
PER_BATCH = 100_000  # RELAY_MAX_ROWS' default
FLAT = 1.3  # three dispatchers may spend at most this much more CPU per row than one


async def _start_more_dispatchers(bench: Bench, extra: int) -> None:
    for n in range(2, 2 + extra):
        proc = bench.system.add(f"dispatcher#{n}")
        proc.start()
        await proc.wait_ready(bench.http)


def _dispatcher_cpu_s(bench: Bench) -> float:
    return sum(
        process_cpu_s(proc.pid)
        for name, proc in bench.system.processes.items()
        if name.split("#")[0] == "dispatcher"
    )


async def _run(output_dir: Path, http: aiohttp.ClientSession, dispatchers: int) -> dict[str, float]:
    """Dispatcher CPU per row, machine busy share and rows/s of the job with
    ``dispatchers`` dispatchers."""
    async with bench_system(
        output_dir,
        f"dispatch{dispatchers}",
        http,
        workers=2,
        concurrency=32,
        RELAY_RECONCILE_SECONDS="2",
    ) as bench:
        await _start_more_dispatchers(bench, dispatchers - 1)
        sizes = [min(PER_BATCH, ROWS - at) for at in range(0, ROWS, PER_BATCH)]
        bodies = [
            orjson.dumps({"model": "gpt-4o-mini", "requests": rows(n, "row {i}")}) for n in sizes
        ]
        cpu_before, ticks_before = _dispatcher_cpu_s(bench), machine_ticks()
        started = time.perf_counter()
        created = [await bench.post(body) for body in bodies]
        await asyncio.gather(
            *(bench.wait_completed(batch["id"], n) for batch, n in zip(created, sizes, strict=True))
        )
        elapsed = time.perf_counter() - started
        cpu = _dispatcher_cpu_s(bench) - cpu_before
        busy = busy_share(ticks_before, machine_ticks())
    return {
        "cpu_ms_per_row": round(1000 * cpu / ROWS, 4),
        "busy_share": round(busy, 3),
        "rows_per_s": round(ROWS / elapsed, 1),
    }


async def test_dispatcher_cpu_per_row_stays_flat_from_one_to_three_dispatchers(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    one = await _run(output_dir, http, 1)
    three = await _run(output_dir, http, 3)
    report["dispatcher_scaling_rows"] = ROWS
    for name, figures in (("1", one), ("3", three)):
        for key, value in figures.items():
            report[f"dispatcher_{key}_{name}_dispatchers"] = value
    print(f"dispatcher scaling, {ROWS} rows: 1 dispatcher {one}, 3 dispatchers {three}")
    assert three["cpu_ms_per_row"] <= FLAT * one["cpu_ms_per_row"], (one, three)
