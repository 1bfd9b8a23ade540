"""Fair and prompt scheduling end to end: two running slots shared by workspaces, and a
high-priority job that does not wait for its workspace's running low ones.

A system of its own with ``RELAY_MAX_RUNNING_JOBS=2`` (one dispatcher, one row-worker of
8 slots); every upstream call takes 20 ms, so a long job stays long on a busy machine.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.helpers.processes import System, signed_in, system_fixture
from tests.helpers.support import ApiClient, rows, wait_until

DELAY = "[sim:delay-ms=20]"


# Every service as its own process; the dispatcher runs at most two jobs.
slots2 = system_fixture(
    "scheduling",
    RELAY_BATCH_CONCURRENCY="8",
    RELAY_DISPATCH_WINDOW="64",
    RELAY_MAX_RUNNING_JOBS="2",
)


def batch(n: int, priority: int = 0) -> dict[str, Any]:
    """A batch of ``n`` rows that each take 20 ms upstream."""
    return {
        "model": "gpt-4o-mini",
        "priority": priority,
        "requests": rows(n, f"row {{i}} {DELAY}"),
    }


async def cancel_unfinished(api: ApiClient, batch_ids: list[str]) -> None:
    """Cancel what is still running or queued (the next test gets the slots)."""
    for batch_id in batch_ids:
        status, _ = await api.request("POST", f"/v1/batches/{batch_id}/cancel")
        assert status in (200, 409)


async def test_a_small_job_of_another_workspace_finishes_while_most_of_a_long_queue_waits(
    slots2: System, http: aiohttp.ClientSession
) -> None:
    api_a = await signed_in(slots2, http, "sched-a")
    api_b = await signed_in(slots2, http, "sched-b")
    queue_a = [(await api_a.submit(batch(200)))["id"] for _ in range(12)]

    async def a_running() -> bool:
        return all([(await api_a.get(i))["status"] == "running" for i in queue_a[:2]])

    await wait_until(a_running, 30, "A's first two jobs to take both slots")
    small = await api_b.submit(batch(5))
    done = await api_b.wait_status(small["id"], {"completed"}, timeout=120)
    statuses = [(await api_a.get(i))["status"] for i in queue_a]
    assert done["completed"] == 5
    unfinished = sum(1 for s in statuses if s in ("queued", "running"))
    assert unfinished >= 8, f"B finished only once A was almost through: {statuses}"
    await cancel_unfinished(api_a, queue_a)


async def test_a_high_priority_job_runs_at_once_beside_its_workspace_s_running_low_ones(
    slots2: System, http: aiohttp.ClientSession
) -> None:
    api = await signed_in(slots2, http, "sched-prio")
    lows = [(await api.submit(batch(1500, priority=0)))["id"] for _ in range(2)]

    async def lows_running() -> bool:
        found = [await api.get(i) for i in lows]
        return all(b["status"] == "running" and b["completed"] >= 20 for b in found)

    await wait_until(lows_running, 60, "both low-priority jobs to run (the slots full)")
    high = await api.submit(batch(40, priority=100))
    done = await api.wait_status(high["id"], {"completed"}, timeout=60)
    assert done["completed"] == 40
    now = [await api.get(i) for i in lows]
    assert [b["status"] for b in now] == ["running", "running"], "a low job finished first"
    assert all(b["completed"] < 1500 for b in now)
    await cancel_unfinished(api, lows)
    # The low jobs kept their lease while they waited: they finish (canceled) cleanly.
    for batch_id in lows:
        assert (await api.wait_status(batch_id, {"canceled"}, timeout=30))["status"] == "canceled"
