"""Lanes end to end, every service its own process, the simulator playing the provider's
batch API, its flex tier and realtime (alias ``sim-lanes``, tests/helpers/processes.
lanes_routes: batch and flex at half the realtime price, the batch expected in 10 s).

- A window the batch lane fits (with its insurance): every row answered in the batch
  lane, at half the all-realtime cost, before the deadline.
- The provider's batch stalled: its rows move to flex (then realtime) after 1.5 times
  the expected turnaround without progress; every row answered once at the simulator,
  before the deadline, the cost reported per lane.
- A window too short for the batch lane: flex first, realtime for what flex refuses.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from tests.helpers.lanes import lanes_of, realtime_cost
from tests.helpers.processes import System, signed_in, sim_answers, sim_stats, system_fixture

ROWS = 200
pytestmark = pytest.mark.timeout(300)

lanes_system = system_fixture(
    "lanes",
    sim_env={"RELAY_SIM_BATCH_DELAY_S": "2"},
    RELAY_OFFLOAD_INTERVAL_S="0.2",
    RELAY_OFFLOAD_MARGIN="1s",
)
stalled_system = system_fixture(
    "lanes-stalled",
    sim_env={"RELAY_SIM_BATCH_STALL": "1", "RELAY_SIM_FLEX_REFUSAL": "0.25"},
    RELAY_OFFLOAD_INTERVAL_S="0.2",
    RELAY_OFFLOAD_MARGIN="1s",
)


def rows(tag: str) -> list[dict[str, Any]]:
    return [
        {"custom_id": f"r-{i}", "messages": [{"role": "user", "content": f"{tag} row {i}"}]}
        for i in range(ROWS)
    ]


async def run(system: System, http: aiohttp.ClientSession, tag: str, window: str) -> dict[str, Any]:
    api = await signed_in(system, http, f"lanes-{tag}")
    created = await api.submit(
        {"model": "sim-lanes", "requests": rows(tag), "completion_window": window}
    )
    batch = await api.wait_status(created["id"], {"completed", "failed", "expired"}, timeout=240)
    assert batch["status"] == "completed", batch
    assert batch["completed"] == ROWS
    found = await lanes_of(system.iso.database_url, created["id"])
    job = found["job"]
    assert job["completed_at"] < job["expires_at"]
    assert sum(found["rows"].values()) == ROWS
    assert job["cost_usd"] == pytest.approx(
        job["cost_batch_usd"] + job["cost_flex_usd"] + job["cost_realtime_usd"]
    )
    print(f"{tag}: plan {job['lane_plan']}; rows {found['rows']}; cost {job['cost_usd']:.4f}")
    return found


async def test_a_window_the_batch_lane_fits_runs_there_at_half_the_price(
    lanes_system: System, http: aiohttp.ClientSession
) -> None:
    found = await run(lanes_system, http, "fits", "120s")
    job = found["job"]
    assert found["rows"] == {"batch": ROWS}
    assert '"lane": "batch"' in job["lane_plan"]
    assert job["rows_batch"] == ROWS
    assert job["cost_usd"] == pytest.approx(realtime_cost(job) / 2)


async def test_a_stalled_provider_batch_moves_its_rows_and_none_is_paid_twice(
    stalled_system: System, http: aiohttp.ClientSession
) -> None:
    before = await sim_answers(http, stalled_system)
    started = time.monotonic()
    found = await run(stalled_system, http, "stalled", "120s")
    job = found["job"]
    assert '"lane": "batch"' in job["lane_plan"]  # planned in the batch lane
    assert found["moved"] == {"stalled"}
    assert set(found["rows"]) <= {"flex", "realtime"}
    assert job["rows_flex"] + job["rows_realtime"] == ROWS
    assert job["rows_batch"] == 0 and job["cost_batch_usd"] == 0
    assert job["cost_flex_usd"] > 0 and job["cost_realtime_usd"] > 0
    after = await sim_answers(http, stalled_system)
    assert after["answers"] - before["answers"] == ROWS  # type: ignore[operator]
    assert after["extra_answers"] == before["extra_answers"]
    # Moved after 15 s without progress (1.5 × the 10 s expected), well before 120 s.
    assert time.monotonic() - started < 100


async def test_a_window_too_short_for_the_batch_lane_goes_flex_then_realtime(
    stalled_system: System, http: aiohttp.ClientSession
) -> None:
    before = await sim_stats(http, stalled_system)
    found = await run(stalled_system, http, "short", "15s")
    job = found["job"]
    # Planned in flex (its refusals are not foreseen: they go realtime as they come).
    assert '"lane": "batch"' not in job["lane_plan"]
    assert '"steps": [{"lane": "flex"' in job["lane_plan"]
    after = await sim_stats(http, stalled_system)
    assert after["batches_created"] == before["batches_created"]
    refused = after["flex_refused"] - before["flex_refused"]
    assert refused == pytest.approx(ROWS * 0.25, abs=2)
    assert found["rows"] == {"flex": ROWS - refused, "realtime": refused}
