"""Lanes at scale (``make bench``): ``RELAY_BENCH_LANES_ROWS`` rows (default 20,000) on
alias ``sim-lanes`` (tests/helpers/processes.lanes_routes: a provider batch and flex at
half the realtime price, the batch expected in 10 s; time scaled: the windows are
minutes, not hours).

1. A window the batch lane fits (30 min): cost ≤ 0.55 × all-realtime, every row answered
   before the deadline.
2. The same with the provider's batch stalled: every row answered before the deadline,
   none paid twice (answers per row at the simulator), cost per lane.
3. A window too short for the batch lane (5 min): flex first, realtime for what flex
   refuses (25% at the simulator).

Each reports the plan Relay chose (``batches.lane_plan``) in bench-report.json.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.bench.harness import Bench, bench_system
from tests.helpers.lanes import lanes_of, realtime_cost
from tests.helpers.processes import sim_answers, sim_stats
from tests.helpers.support import rows

N = int(os.environ.get("RELAY_BENCH_LANES_ROWS", "20000"))
ENV = {"RELAY_OFFLOAD_INTERVAL_S": "0.2", "RELAY_OFFLOAD_MARGIN": "1s", "RELAY_MAX_ROWS": "100000"}


async def lanes_job(bench: Bench, tag: str, window: str) -> dict[str, Any]:
    """Run one job of :data:`N` rows on ``sim-lanes``; its lanes, cost and timing."""
    body = {"model": "sim-lanes", "requests": rows(N, f"{tag} {{i}}"), "completion_window": window}
    started = time.perf_counter()
    created = await bench.post(orjson.dumps(body))
    await bench.wait_completed(created["id"], N)
    seconds = time.perf_counter() - started
    found = await lanes_of(bench.database_url, created["id"])
    job = found["job"]
    assert job["completed_at"] < job["expires_at"], "answered after the deadline"
    figures = {
        "rows": N,
        "window": window,
        "seconds": round(seconds, 1),
        "plan": orjson.loads(job["lane_plan"]),
        "rows_per_lane": found["rows"],
        "cost_usd": round(job["cost_usd"], 4),
        "cost_per_lane_usd": {
            lane: round(job[f"cost_{lane}_usd"], 4) for lane in ("batch", "flex", "realtime")
        },
        "all_realtime_cost_usd": round(realtime_cost(job), 4),
        "ratio_to_all_realtime": round(job["cost_usd"] / realtime_cost(job), 3),
        "late_answers": job["late_answers"],
        "moved": sorted(m for m in found["moved"] if m),
    }
    print(f"\nlanes {tag}:", orjson.dumps(figures).decode())
    return figures


async def test_lanes_batch_window_and_stalled_batch(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    async with bench_system(
        output_dir, "lanes", http, sim_env={"RELAY_SIM_BATCH_DELAY_S": "5"}, **ENV
    ) as bench:
        fits = await lanes_job(bench, "fits", "30m")
    report["lanes_batch_fits"] = fits
    assert fits["plan"]["steps"][0]["lane"] == "batch"
    assert fits["ratio_to_all_realtime"] <= 0.55

    stall = {"RELAY_SIM_BATCH_STALL": "1", "RELAY_SIM_FLEX_REFUSAL": "0.25"}
    async with bench_system(output_dir, "lanes-stalled", http, sim_env=stall, **ENV) as bench:
        before = await sim_answers(http, bench.system)
        stalled = await lanes_job(bench, "stalled", "30m")
        after = await sim_answers(http, bench.system)
        stalled["extra_answers"] = after["extra_answers"]
        stalled["answers"] = int(after["answers"]) - int(before["answers"])  # type: ignore[call-overload]
        sim_before = await sim_stats(http, bench.system)
        short = await lanes_job(bench, "short", "5m")
        sim_after = await sim_stats(http, bench.system)
        short["flex_refused"] = sim_after["flex_refused"] - sim_before["flex_refused"]
        short["batches_created"] = sim_after["batches_created"] - sim_before["batches_created"]
    report["lanes_batch_stalled"] = stalled
    report["lanes_short_window"] = short
    assert stalled["moved"] == ["stalled"]
    assert stalled["extra_answers"] == 0 and stalled["answers"] == N
    assert stalled["rows_per_lane"].get("batch", 0) == 0
    assert short["plan"]["steps"][0]["lane"] == "flex"
    assert short["batches_created"] == 0
    assert short["rows_per_lane"] == {
        "flex": N - short["flex_refused"],
        "realtime": short["flex_refused"],
    }
