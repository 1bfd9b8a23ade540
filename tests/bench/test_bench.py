"""Benchmarks (``make bench``): the pipeline against the upstream's own limits.

Every figure is the median of :data:`RUNS` runs, with min and max, measured on this
machine with all services, Postgres and RabbitMQ sharing it. The Markdown table is
printed at the end and the figures are written to ``bench-report.json``.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.bench.harness import (
    MIB,
    RUNS,
    Bench,
    CpuMeter,
    Figure,
    RssSampler,
    bench_system,
    busy_share,
    ideal_client,
    machine_ticks,
    other_busy_share,
    process_cpu_s,
    repeat,
    rss_mib,
    tree_cpu_s,
)
from tests.helpers.support import rows

PIPELINE_ROWS = 20_000
LATENCY_MS = 200
SCALING_ROWS_PER_WORKER = 1_600
BIG_OUTPUT_ROWS = 256


async def test_ingest_rows_per_second(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    async with bench_system(output_dir, "ingest", http, RELAY_DISPATCH_WINDOW="1") as bench:
        api_pid = bench.system.processes["ingest-api"].pid
        for n in (10_000, 100_000):
            body = orjson.dumps({"model": "gpt-4o-mini", "requests": rows(n)})
            figure, cpu, busy = Figure(), Figure(), Figure()
            peak = 0.0
            for _ in range(RUNS):
                with RssSampler({"ingest-api": api_pid}) as sampler:
                    ticks, cpu0 = machine_ticks(), process_cpu_s(api_pid)
                    started = time.perf_counter()
                    await bench.post(body)
                    figure.samples.append(n / (time.perf_counter() - started))
                    cpu.samples.append((process_cpu_s(api_pid) - cpu0) / n * 1e6)
                    busy.samples.append(busy_share(ticks, machine_ticks()))
                peak = max(peak, sampler.peaks["ingest-api"])
            report.update(figure.keys(f"ingest_rows_per_s_{n}"))
            # The ingest-api's CPU per row, and how busy the whole machine was meanwhile.
            report.update(cpu.keys(f"ingest_api_cpu_us_per_row_{n}"))
            report.update(busy.keys(f"ingest_machine_busy_share_{n}"))
            report[f"ingest_peak_rss_mib_{n}"] = round(peak, 1)
            if n == 100_000:
                report.update(figure.keys("ingest_rows_per_s"))


@dataclass
class ZeroLatency:
    """The zero-latency figures of one shape: rows/s of both clients, and what the pipeline
    runs cost (machine busy share, CPU per row), measured around the pipeline runs only."""

    pipeline: Figure = field(default_factory=Figure)
    ideal: Figure = field(default_factory=Figure)
    busy: Figure = field(default_factory=Figure)
    other_busy: Figure = field(default_factory=Figure)
    cpu_us_per_row: Figure = field(default_factory=Figure)
    # The same per service kind (row-worker: every worker together), and the simulator's
    # own, which is no part of the figure: its work per row is the same whatever Relay
    # does, so it is the control that tells contention from code (a tree whose figures
    # all rose with the simulator's ran on a busier machine, not slower code).
    cpu_us_by_service: dict[str, Figure] = field(default_factory=dict)
    sim_cpu_us_per_row: Figure = field(default_factory=Figure)


def _cpu_by_service(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far per service kind (``row-worker#2`` counts as ``row-worker``)."""
    seconds: dict[str, float] = {}
    for name, pid in pids.items():
        kind = name.split("#")[0]
        seconds[kind] = seconds.get(kind, 0.0) + tree_cpu_s(pid)
    return seconds


async def _zero_latency(
    output_dir: Path, http: aiohttp.ClientSession, workers: int, per_worker: int
) -> ZeroLatency:
    """Pipeline and ideal-client rows/s, side by side, at the same total concurrency."""
    total = workers * per_worker
    tag = f"zero{workers}x{per_worker}"
    async with bench_system(
        output_dir, tag, http, workers=workers, concurrency=per_worker
    ) as bench:
        await bench.run_batch(1_000)  # warm-up: connections, caches
        meter = await CpuMeter.for_bench(bench)
        figures = ZeroLatency()
        sim, own = bench.system.processes["upstream-sim"].pid, os.getpid()
        pids = bench.pids()
        for _ in range(RUNS):
            ticks, cpu = machine_ticks(), meter.seconds()
            by_service, sim_cpu = _cpu_by_service(pids), tree_cpu_s(sim)
            rest = sim_cpu + process_cpu_s(own)
            _, seconds = await bench.run_batch(PIPELINE_ROWS)
            used = meter.seconds() - cpu
            after = machine_ticks()
            rest = tree_cpu_s(sim) + process_cpu_s(own) - rest
            figures.cpu_us_per_row.samples.append(used / PIPELINE_ROWS * 1e6)
            figures.sim_cpu_us_per_row.samples.append(
                (tree_cpu_s(sim) - sim_cpu) / PIPELINE_ROWS * 1e6
            )
            for kind, spent in _cpu_by_service(pids).items():
                figure = figures.cpu_us_by_service.setdefault(kind, Figure())
                figure.samples.append((spent - by_service[kind]) / PIPELINE_ROWS * 1e6)
            figures.busy.samples.append(busy_share(ticks, after))
            figures.other_busy.samples.append(other_busy_share(ticks, after, used + rest))
            figures.pipeline.samples.append(PIPELINE_ROWS / seconds)
            seconds = await ideal_client(bench.system.sim_url, PIPELINE_ROWS, total)
            figures.ideal.samples.append(PIPELINE_ROWS / seconds)
    return figures


async def test_pipeline_against_the_ideal_client_at_zero_latency(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    # The headline: 2 row-workers x 16 (total concurrency 32), so the workers can use both
    # cores; 1 x 32 is reported beside it. Each run of the pipeline is followed by a run
    # of the ideal client at the same total concurrency against the same simulator.
    for workers, per_worker, suffix in ((2, 16, ""), (1, 32, "_1x32")):
        figures = await _zero_latency(output_dir, http, workers, per_worker)
        pipeline, ideal = figures.pipeline, figures.ideal
        report.update(pipeline.keys(f"pipeline_rows_per_s{suffix}"))
        report.update(ideal.keys(f"ideal_rows_per_s{suffix}"))
        ratios = Figure([p / i for p, i in zip(pipeline.samples, ideal.samples, strict=True)])
        report.update(ratios.keys(f"pipeline_to_ideal_ratio{suffix}"))
        # What the pipeline runs cost: the whole machine's busy share, and the CPU of every
        # Relay process plus Postgres' and RabbitMQ's trees (not the simulator) per row.
        report.update(figures.busy.keys(f"pipeline_machine_busy{suffix}"))
        # What of that was not ours (other programs sharing the machine meanwhile).
        report.update(figures.other_busy.keys(f"pipeline_other_busy{suffix}"))
        report.update(figures.cpu_us_per_row.keys(f"pipeline_cpu_us_per_row{suffix}"))
        report.update(figures.sim_cpu_us_per_row.keys(f"pipeline_sim_cpu_us_per_row{suffix}"))
        for kind, figure in figures.cpu_us_by_service.items():
            report.update(figure.keys(f"pipeline_cpu_us_per_row_{kind.replace('-', '_')}{suffix}"))


async def _rows_per_s_at_latency(
    output_dir: Path, http: aiohttp.ClientSession, workers: int, rows_n: int
) -> Figure:
    async with bench_system(
        output_dir, f"lat{workers}", http, workers=workers, concurrency=32, latency_ms=LATENCY_MS
    ) as bench:
        await bench.run_batch(64 * workers)

        async def once() -> float:
            _, total = await bench.run_batch(rows_n)
            return rows_n / total

        return await repeat(RUNS, once)


async def test_littles_law_efficiency_and_worker_scaling(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    by_workers: dict[int, Figure] = {}
    for workers in (1, 2, 4):
        by_workers[workers] = await _rows_per_s_at_latency(
            output_dir, http, workers, SCALING_ROWS_PER_WORKER * workers
        )
        report.update(by_workers[workers].keys(f"rows_per_s_{workers}x32_at_200ms"))
    for workers in (1, 4):
        limit = workers * 32 / (LATENCY_MS / 1000)
        efficiency = Figure([s / limit for s in by_workers[workers].samples])
        report.update(efficiency.keys(f"littles_law_efficiency_{workers}x32"))
    one = by_workers[1].median
    for workers in (2, 4):
        speedup = Figure([s / one for s in by_workers[workers].samples])
        report.update(speedup.keys(f"scaling_1_to_{workers}"))


async def test_results_streaming_and_memory_on_a_100k_job(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    n = 100_000
    async with bench_system(output_dir, "big", http, concurrency=32) as bench:
        with RssSampler(bench.pids()) as sampler:
            body = orjson.dumps({"model": "gpt-4o-mini", "requests": rows(n)})
            created = await bench.post(body)
            await bench.wait_completed(created["id"], n)
        report["service_peak_rss_mib"] = {k: round(v, 1) for k, v in sampler.peaks.items()}
        report["max_service_rss_mib"] = round(max(sampler.peaks.values()), 1)

        api_pid = bench.system.processes["ingest-api"].pid
        for accept, key in (("application/json", "json"), ("application/x-ndjson", "ndjson")):
            figure = Figure()
            with RssSampler({"ingest-api": api_pid}) as stream_sampler:
                for _ in range(RUNS):
                    started = time.perf_counter()
                    size = 0
                    async with http.get(
                        f"{bench.api.base_url}/v1/batches/{created['id']}/results",
                        headers={"Authorization": f"Bearer {bench.api.key}", "Accept": accept},
                    ) as response:
                        async for chunk in response.content.iter_chunked(MIB):
                            size += len(chunk)
                    figure.samples.append(n / (time.perf_counter() - started))
            report.update(figure.keys(f"results_rows_per_s_{key}"))
            report[f"results_{key}_ingest_rss_mib"] = round(stream_sampler.peaks["ingest-api"], 1)
            report[f"results_{key}_bytes"] = size
            if key == "json":
                report.update(figure.keys("results_rows_per_s"))


async def _read_results(bench: Bench, batch_id: str, accept: str) -> tuple[int, int]:
    """Stream a job's results without keeping them; return (bytes, newlines)."""
    size = lines = 0
    async with bench.http.get(
        f"{bench.api.base_url}/v1/batches/{batch_id}/results",
        headers={"Authorization": f"Bearer {bench.api.key}", "Accept": accept},
    ) as response:
        assert response.status == 200
        async for chunk in response.content.iter_chunked(MIB):
            size += len(chunk)
            lines += chunk.count(b"\n")
    return size, lines


async def test_results_memory_with_1mib_outputs_and_four_readers(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    """ingest-api's peak RSS (VmHWM) while four clients (two JSON, two ndjson) stream the
    results of a job of 1 MiB outputs: pages bounded by rows only (before, as if
    ``RELAY_RESULTS_PAGE_BYTES`` were unlimited) and by the default byte budget (after),
    each on a freshly started ingest-api of the same system."""
    n = BIG_OUTPUT_ROWS
    async with bench_system(output_dir, "bigout", http, concurrency=8) as bench:
        template = "row {i} [sim:reply-bytes=" + str(MIB) + "]"
        created = await bench.post(
            orjson.dumps({"model": "gpt-4o-mini", "requests": rows(n, template)})
        )
        await bench.wait_completed(created["id"], n)
        api = bench.system.processes["ingest-api"]
        accepts = ["application/json", "application/x-ndjson"] * 2
        for phase, page_bytes in (("before", str(2**62)), ("after", "")):
            api.stop()
            api.env["RELAY_RESULTS_PAGE_BYTES"] = page_bytes
            api.start()
            await api.wait_ready(http)
            read = await asyncio.gather(*(_read_results(bench, created["id"], a) for a in accepts))
            assert all(size > n * MIB for size, _ in read), read
            assert [lines for _, lines in read][1::2] == [n, n]
            peak = round(rss_mib(api.pid, "VmHWM"), 1)
            report[f"results_peak_rss_mib_1mib_rows_{phase}"] = peak
        report["results_peak_rss_mib_1mib_rows"] = report["results_peak_rss_mib_1mib_rows_after"]


def test_print_the_table(report: dict[str, Any]) -> None:
    lines = [
        "| figure | median | min | max |",
        "|---|---|---|---|",
    ]
    for key in sorted(report):
        if key.endswith(("_min", "_max")) or not isinstance(report[key], int | float):
            continue
        lo, hi = report.get(f"{key}_min", ""), report.get(f"{key}_max", "")
        lines.append(f"| {key} | {report[key]} | {lo} | {hi} |")
    for key in sorted(report):
        if isinstance(report[key], dict):
            lines.append(f"| {key} | {report[key]} | | |")
    print("\n" + "\n".join(lines))
