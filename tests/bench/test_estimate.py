"""The estimate against what the job then costs, and what prefix grouping does for the
prompt cache (``make bench``), on the simulator.

- Estimate vs actual: one job of ``RELAY_BENCH_ESTIMATE_ROWS`` rows (default 2,000) of
  varied prompt lengths, estimated (``POST /v1/batches/estimate``) then run, on the
  realtime-only alias ``sim-priced``, on ``sim-half`` (a batch and a realtime lane) and
  on ``sim-lanes`` (batch, flex and realtime), whose plans (no deadline) are the
  provider-batch lane. Reported: each estimate, the cost recorded, their ratio and the
  plan chosen; the bound is the issue's 10%.
- Prefix grouping: a job of ``RELAY_BENCH_CACHE_ROWS`` rows (default 2,000) whose rows
  cycle through 40 system prompts, on a simulator whose prompt cache holds 8 prefixes,
  run with ``RELAY_PREFIX_GROUPING`` on and off. Reported: the cache-read share (the
  job's ``usage.cached_tokens`` over its prompt tokens) of each.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.bench.harness import Bench, bench_system

ESTIMATE_ROWS = int(os.environ.get("RELAY_BENCH_ESTIMATE_ROWS", "2000"))
CACHE_ROWS = int(os.environ.get("RELAY_BENCH_CACHE_ROWS", "2000"))
PREFIXES = 40  # distinct system prompts the cache job cycles through
CACHE_ENTRIES = 8  # prefixes the simulated cache holds
TOLERANCE = 0.10
WORDS = "the quick brown fox jumps over a lazy dog while the cat sleeps".split()


def varied_rows(n: int) -> list[dict[str, Any]]:
    """``n`` rows of 10 to 200 words (a fixed pattern, so every run is the same job)."""
    return [
        {
            "custom_id": f"r-{i}",
            "messages": [
                {
                    "role": "user",
                    "content": f"item {i}: "
                    + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(10 + (i * 37) % 191)),
                }
            ],
        }
        for i in range(n)
    ]


def interleaved_rows(n: int) -> list[dict[str, Any]]:
    """``n`` rows whose system prompt is the ``i mod PREFIXES``-th of :data:`PREFIXES`."""
    return [
        {
            "custom_id": f"c-{i}",
            "messages": [
                {"role": "system", "content": f"prompt {i % PREFIXES}: " + "be brief. " * 60},
                {"role": "user", "content": f"question {i}"},
            ],
        }
        for i in range(n)
    ]


async def estimated_then_run(
    bench: Bench, alias: str, requests: list[dict[str, Any]]
) -> dict[str, Any]:
    """Estimate a job, run it, and compare."""
    body = {"model": alias, "requests": requests}
    status, guess = await bench.api.request("POST", "/v1/batches/estimate", json=body)
    assert status == 200, guess
    created = await bench.post(orjson.dumps(body))
    await bench.wait_completed(created["id"], len(requests))
    batch = await bench.api.get(created["id"])
    return {
        "estimated_usd": guess["cost_usd"],
        "actual_usd": batch["cost_usd"],
        "ratio": round(guess["cost_usd"] / batch["cost_usd"], 4),
        "plan": [
            f"{s['lane']} {s['rows']} rows ({s['deployment']})" for s in guess["plan"]["steps"]
        ],
        "completion_basis": guess["completion_basis"],
        "saved_fraction": batch["saving"]["saved_fraction"],
        "rows_per_lane": {lane: spent["rows"] for lane, spent in batch["lanes"].items()},
    }


async def test_estimate_vs_actual_cost_within_ten_percent(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    requests = varied_rows(ESTIMATE_ROWS)
    async with bench_system(
        output_dir,
        "estimate",
        http,
        RELAY_OFFLOAD_INTERVAL_S="0.2",
        RELAY_MAX_ROWS=str(max(ESTIMATE_ROWS, 100_000)),
    ) as bench:
        realtime = await estimated_then_run(bench, "sim-priced", requests)
        planned = await estimated_then_run(bench, "sim-half", requests)
        lanes = await estimated_then_run(bench, "sim-lanes", requests)
    report["estimate_rows"] = ESTIMATE_ROWS
    report["estimate_realtime"] = realtime
    report["estimate_planned"] = planned
    report["estimate_lanes"] = lanes
    print(
        "\nestimate:",
        orjson.dumps({"realtime": realtime, "planned": planned, "lanes": lanes}).decode(),
    )
    assert realtime["plan"] == [f"realtime {ESTIMATE_ROWS} rows (sim-priced)"]
    assert planned["plan"] == [f"batch {ESTIMATE_ROWS} rows (sim-openai-batch)"]
    assert lanes["plan"] == [f"batch {ESTIMATE_ROWS} rows (sim-lanes-batch)"]
    for figures in (realtime, planned, lanes):
        assert abs(figures["ratio"] - 1) <= TOLERANCE, figures


async def cache_share(output_dir: Path, http: aiohttp.ClientSession, grouping: str) -> float:
    """The cache-read share of the interleaved job with prefix grouping ``grouping``."""
    async with bench_system(
        output_dir,
        f"cache-{grouping}",
        http,
        sim_env={"RELAY_SIM_CACHE_PREFIXES": str(CACHE_ENTRIES)},
        RELAY_PREFIX_GROUPING=grouping,
        RELAY_MAX_ROWS=str(max(CACHE_ROWS, 100_000)),
    ) as bench:
        body = {"model": "sim-cached", "requests": interleaved_rows(CACHE_ROWS)}
        created = await bench.post(orjson.dumps(body))
        await bench.wait_completed(created["id"], CACHE_ROWS)
        usage = (await bench.api.get(created["id"]))["usage"]
    return round(usage["cached_tokens"] / usage["prompt_tokens"], 4)


async def test_prefix_grouping_raises_the_cache_read_share(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    grouped = await cache_share(output_dir, http, "on")
    interleaved = await cache_share(output_dir, http, "off")
    report["cache_rows"] = CACHE_ROWS
    report["cache_read_share_grouped"] = grouped
    report["cache_read_share_ungrouped"] = interleaved
    print(f"\ncache-read share: grouped {grouped}, ungrouped {interleaved}")
    assert grouped > interleaved + 0.3
