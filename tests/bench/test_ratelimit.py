"""Shared rate limits against a simulator that enforces them (``make bench``; issue 16).

Three row-workers x 16 (``RELAY_BATCH_CONCURRENCY=16``) run one job of :data:`ROWS` rows
against the simulator enforcing a limit per calendar second (``RELAY_SIM_RPM`` /
``RELAY_SIM_TPM``: 429 with ``Retry-After: 1`` above it), with the same limit on the
deployment in the routes file (``rpm`` / ``tpm``), so Relay is told what the upstream
enforces. Each of :data:`RUNS` runs zeroes the simulator's counters (``POST /reset``),
submits the job and waits until it ends; the figures (median, min, max):

- ``<prefix>_efficiency``: rows completed per second, from submit to the job's end,
  divided by the limit in rows/s (600 rpm: 10 rows/s); ``<prefix>_steady_efficiency`` the
  same over the steady part only: the simulator's ``ok`` counter sampled every second,
  the first and last second left out;
- ``<prefix>_429_share``: the simulator's ``throttled`` / ``calls`` (the target is at most
  0.01), with ``<prefix>_failed_rows`` (rows that ran out of retries);
- ``<prefix>_job_seconds`` (submit to the job's end; 45 s when every row waits its turn);
- ``<prefix>_busy_share`` (the whole machine, other programs included) and
  ``<prefix>_cpu_ms_per_row`` (every Relay process, the simulator not counted, per row
  completed).

``ratelimit_*`` binds on requests (600 rpm). ``ratelimit_tpm_*`` binds on tokens: every
row is :data:`TOKENS_PER_ROW` tokens as the simulator counts them (its message's
``ceil(len / 4)`` prompt tokens plus the job's ``params.max_tokens``), the simulator
allows :data:`TPM` tokens per minute and far more requests than that, and the routes
carry only ``tpm``: the limit is ``TPM / 60 / TOKENS_PER_ROW`` = 10 rows/s. Each reply is
padded (``[sim:reply-bytes=N]``) to exactly ``max_tokens`` completion tokens, so the
reply's usage equals the estimate made before the call: the limiter's correction by
usage neither refunds nor charges anything, and the figure measures the pacing alone.
``ratelimit_load_1m`` is the machine's load average when the benchmark started: other
programs on the two cores make the machine figures noisier (the limit figures less so).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.bench.harness import (
    RUNS,
    Bench,
    Figure,
    bench_system,
    busy_share,
    machine_ticks,
    process_cpu_s,
)

ROWS = 450  # 45 s at 10 rows/s
WORKERS = 3
CONCURRENCY = 16
RPM = 600
TPM = 60_000  # 1,000 tokens a second: 10 rows of TOKENS_PER_ROW
MAX_TOKENS = 92
RPM_PROMPT = "row {i:05d}"
TPM_PROMPT = "row {i:05d} [sim:reply-bytes=" + str(4 * MAX_TOKENS) + "]"  # 92 tokens back
TOKENS_PER_ROW = -(-len(TPM_PROMPT.format(i=0)) // 4) + MAX_TOKENS  # 8 + 92 = 100
FINISHED = {"completed", "failed", "canceled", "expired"}


@dataclass(frozen=True)
class Run:
    """One job's figures."""

    seconds: float
    rows_per_s: float
    steady_rows_per_s: float
    throttled_share: float
    failed_rows: int
    busy_share: float
    cpu_ms_per_row: float


async def _sim(http: aiohttp.ClientSession, bench: Bench, method: str, path: str) -> Any:
    async with http.request(method, f"{bench.system.sim_url}{path}") as response:
        assert response.status == 200, await response.text()
        return await response.json()


@contextlib.asynccontextmanager
async def _sampled(
    http: aiohttp.ClientSession, bench: Bench
) -> AsyncIterator[list[tuple[float, int]]]:
    """``(time, ok calls)`` of the simulator every second while the block runs."""
    samples: list[tuple[float, int]] = []

    async def sample() -> None:
        while True:
            stats = await _sim(http, bench, "GET", "/stats")
            samples.append((time.perf_counter(), int(stats["ok"])))
            await asyncio.sleep(1.0)

    task = asyncio.get_running_loop().create_task(sample(), name="sim-sampler")
    try:
        yield samples
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _steady(samples: list[tuple[float, int]]) -> float:
    """Calls answered 200 per second between the second sample and the last but one."""
    assert len(samples) >= 4, samples
    (t0, ok0), (t1, ok1) = samples[1], samples[-2]
    return (ok1 - ok0) / (t1 - t0)


async def _wait_ended(bench: Bench, batch_id: str) -> dict[str, Any]:
    while True:
        batch = await bench.api.get(batch_id)
        if batch["status"] in FINISHED:
            return batch
        await asyncio.sleep(0.1)


async def _one_run(http: aiohttp.ClientSession, bench: Bench, body: bytes) -> Run:
    await _sim(http, bench, "POST", "/reset")
    pids = bench.pids()
    cpu0 = sum(process_cpu_s(pid) for pid in pids.values())
    ticks0 = machine_ticks()
    async with _sampled(http, bench) as samples:
        started = time.perf_counter()
        created = await bench.post(body)
        batch = await _wait_ended(bench, created["id"])
        seconds = time.perf_counter() - started
    ticks1 = machine_ticks()
    cpu1 = sum(process_cpu_s(pid) for pid in pids.values())
    stats = await _sim(http, bench, "GET", "/stats")
    assert batch["status"] == "completed", batch
    assert batch["completed"] + batch["failed"] == ROWS, batch
    done = int(batch["completed"])
    return Run(
        seconds=seconds,
        rows_per_s=done / seconds,
        steady_rows_per_s=_steady(samples),
        throttled_share=stats["throttled"] / max(stats["calls"], 1),
        failed_rows=int(batch["failed"]),
        busy_share=busy_share(ticks0, ticks1),
        cpu_ms_per_row=(cpu1 - cpu0) / max(done, 1) * 1000,
    )


async def _measure(
    output_dir: Path,
    http: aiohttp.ClientSession,
    tag: str,
    *,
    sim_env: Mapping[str, str],
    limits: Mapping[str, int],
    prompt: str = RPM_PROMPT,
    params: Mapping[str, Any] | None = None,
) -> list[Run]:
    requests = [
        {"custom_id": f"r-{i}", "messages": [{"role": "user", "content": prompt.format(i=i)}]}
        for i in range(ROWS)
    ]
    job: dict[str, Any] = {"model": "gpt-4o-mini", "requests": requests}
    if params:
        job["params"] = dict(params)
    body = orjson.dumps(job)
    async with bench_system(
        output_dir,
        tag,
        http,
        workers=WORKERS,
        concurrency=CONCURRENCY,
        sim_env=sim_env,
        limits=limits,
    ) as bench:
        # Warm-up: connections and prepared statements, within one second's budget.
        warm = {**job, "requests": requests[:5]}
        created = await bench.post(orjson.dumps(warm))
        await _wait_ended(bench, created["id"])
        await asyncio.sleep(1.0)  # the warm-up's window passes
        return [await _one_run(http, bench, body) for _ in range(RUNS)]


def _report(report: dict[str, Any], prefix: str, runs: list[Run], limit_rows_per_s: float) -> None:
    def figure(values: list[float]) -> Figure:
        return Figure(samples=values)

    efficiency = [r.rows_per_s / limit_rows_per_s for r in runs]
    steady = [r.steady_rows_per_s / limit_rows_per_s for r in runs]
    report.update(figure(efficiency).keys(f"{prefix}_efficiency"))
    report.update(figure(steady).keys(f"{prefix}_steady_efficiency"))
    report.update(figure([r.rows_per_s for r in runs]).keys(f"{prefix}_rows_per_s"))
    report.update(figure([r.seconds for r in runs]).keys(f"{prefix}_job_seconds"))
    report.update(figure([r.throttled_share for r in runs]).keys(f"{prefix}_429_share"))
    report.update(figure([float(r.failed_rows) for r in runs]).keys(f"{prefix}_failed_rows"))
    report.update(figure([r.busy_share for r in runs]).keys(f"{prefix}_busy_share"))
    report.update(figure([r.cpu_ms_per_row for r in runs]).keys(f"{prefix}_cpu_ms_per_row"))
    print(f"\n{prefix} runs:", runs)
    print(f"{prefix}:", orjson.dumps({k: v for k, v in report.items() if k.startswith(prefix)}))


async def test_requests_per_minute_hold_without_a_429_storm(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    report["ratelimit_load_1m"] = round(os.getloadavg()[0], 2)
    started = time.perf_counter()
    runs = await _measure(
        output_dir, http, "ratelimit-rpm", sim_env={"RELAY_SIM_RPM": str(RPM)}, limits={"rpm": RPM}
    )
    report["ratelimit_bench_seconds"] = round(time.perf_counter() - started, 1)
    _report(report, "ratelimit", runs, RPM / 60)


async def test_tokens_per_minute_hold_without_a_429_storm(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    report["ratelimit_tpm_load_1m"] = round(os.getloadavg()[0], 2)
    started = time.perf_counter()
    runs = await _measure(
        output_dir,
        http,
        "ratelimit-tpm",
        sim_env={"RELAY_SIM_TPM": str(TPM), "RELAY_SIM_RPM": str(RPM * 100)},
        limits={"tpm": TPM},
        prompt=TPM_PROMPT,
        params={"max_tokens": MAX_TOKENS},
    )
    report["ratelimit_tpm_bench_seconds"] = round(time.perf_counter() - started, 1)
    _report(report, "ratelimit_tpm", runs, TPM / 60 / TOKENS_PER_ROW)
