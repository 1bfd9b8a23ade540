"""Shared rate limits with every service its own OS process: three row-workers of 16
slots against a simulator enforcing 600 requests a minute per calendar second, routes
saying ``rpm = 600``. A 120-row job takes at least the time the limit asks and meets few
429s (a share of the calls: how near the limit it runs is the bench's to measure, not a
check for a loaded machine); the workers' ``/metrics`` show the grants, their use and
the waits; then the leader is killed (``kill -9``) in the middle of a job: another
takes over, the job completes, and the limit still holds (no second issuer)."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.processes import System, signed_in, system_fixture
from tests.helpers.support import ApiClient, rows, wait_until

WORKERS = ("row-worker", "row-worker#2", "row-worker#3")
THROTTLED_SHARE = 0.05  # of the calls, at most
TAKE_OVER_S = 10.0  # a new leader within


limited = system_fixture(
    "ratelimit",
    workers=3,
    sim_env={"RELAY_SIM_RPM": "600"},
    limits={"rpm": 600},
    RELAY_BATCH_CONCURRENCY="16",
    RELAY_DISPATCH_WINDOW="256",
)


@pytest.fixture(scope="module")
async def api(limited: System, http: aiohttp.ClientSession) -> ApiClient:
    """A client of this module's API."""
    return await signed_in(limited, http, "ratelimit")


async def sim_stats(http: aiohttp.ClientSession, system: System) -> dict[str, int]:
    async with http.get(f"{system.sim_url}/stats") as response:
        return dict(await response.json())


async def metrics(http: aiohttp.ClientSession, system: System, worker: str) -> dict[str, float]:
    """``name{deployment=sim}`` (and the unlabelled leader gauge) of one worker."""
    port = system.processes[worker].health_port()
    assert port is not None
    async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith(("relay_ratelimit", "relay_upstream_throttled"))
        and sample.labels.get("deployment", "sim") == "sim"
        and "le" not in sample.labels
    }


async def totals(http: aiohttp.ClientSession, system: System) -> dict[str, float]:
    summed: dict[str, float] = {}
    for worker in WORKERS:
        if system.processes[worker].alive():
            for name, value in (await metrics(http, system, worker)).items():
                summed[name] = summed.get(name, 0.0) + value
    return summed


async def test_a_job_holds_the_shared_limit(
    api: ApiClient, limited: System, http: aiohttp.ClientSession
) -> None:
    before = await sim_stats(http, limited)
    started = time.monotonic()
    timeline: list[tuple[float, int]] = []

    async def watch() -> None:
        while True:
            calls = (await sim_stats(http, limited))["calls"] - before["calls"]
            timeline.append((time.monotonic() - started, calls))
            await asyncio.sleep(0.1)

    watcher = asyncio.ensure_future(watch())
    created = await api.submit({"model": "gpt-4o-mini", "requests": rows(120, "limited {i}")})
    batch = await api.wait_status(created["id"], {"completed"}, timeout=90)
    elapsed = time.monotonic() - started
    watcher.cancel()
    after = await sim_stats(http, limited)
    first = next((t for t, c in timeline if c > 0), 0.0)
    last = next((t for t, c in timeline if c >= after["calls"] - before["calls"]), elapsed)
    calls = after["calls"] - before["calls"]
    throttled = after["throttled"] - before["throttled"]
    print(
        f"\ne2e: 120 rows in {elapsed:.2f} s = {120 / elapsed:.2f} rows/s; calls from "
        f"{first:.2f} s to {last:.2f} s = {calls / (last - first):.2f} calls/s; "
        f"calls {calls}, throttled {throttled}"
    )
    assert (batch["completed"], batch["failed"]) == (120, 0)
    assert throttled <= THROTTLED_SHARE * calls
    assert calls == 120 + throttled
    assert elapsed >= 11.0
    seen = await totals(http, limited)
    assert seen["relay_ratelimit_leader"] == 1.0
    assert seen["relay_ratelimit_used_requests_total"] == calls
    assert seen["relay_ratelimit_granted_requests_total"] >= calls
    assert seen["relay_ratelimit_wait_seconds_count"] == calls
    assert seen["relay_ratelimit_wait_seconds_sum"] > 0


async def test_a_canceled_job_leaves_no_row_waiting(
    api: ApiClient, limited: System, http: aiohttp.ClientSession
) -> None:
    before = await sim_stats(http, limited)
    created = await api.submit({"model": "gpt-4o-mini", "requests": rows(300, "cancel {i}")})

    async def flowing() -> bool:
        return (await sim_stats(http, limited))["calls"] >= before["calls"] + 10

    await wait_until(flowing, 30, "rows flowing")
    status, _ = await api.request("POST", f"/v1/batches/{created['id']}/cancel")
    assert status == 200
    batch = await api.wait_status(created["id"], {"canceled"}, timeout=30)

    async def none_in_flight() -> bool:
        for worker in WORKERS:
            port = limited.processes[worker].health_port()
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
            if "\nrelay_rows_in_flight 0.0\n" not in text:
                return False
        return True

    # 48 rows were waiting for budget in the three workers: the cancel takes them all out.
    await wait_until(none_in_flight, 5, "no row in flight or waiting")
    calls = (await sim_stats(http, limited))["calls"] - before["calls"]
    assert batch["completed"] < 300
    assert calls < 300


async def test_the_leader_killed_mid_job_is_replaced(
    api: ApiClient, limited: System, http: aiohttp.ClientSession
) -> None:
    leaders = [w for w in WORKERS if (await metrics(http, limited, w))["relay_ratelimit_leader"]]
    assert len(leaders) == 1
    before = await sim_stats(http, limited)
    created = await api.submit({"model": "gpt-4o-mini", "requests": rows(100, "failover {i}")})

    async def flowing() -> bool:
        return (await sim_stats(http, limited))["calls"] >= before["calls"] + 20

    await wait_until(flowing, 30, "rows flowing")
    killed = limited.processes[leaders[0]]
    killed.signal(signal.SIGKILL)
    killed.wait(10)
    killed_at = time.monotonic()

    async def new_leader() -> bool:
        live = [w for w in WORKERS if limited.processes[w].alive()]
        flags = [(await metrics(http, limited, w))["relay_ratelimit_leader"] for w in live]
        return sum(flags) == 1

    await wait_until(new_leader, TAKE_OVER_S, "another leader", every=0.05)
    took_over = time.monotonic() - killed_at
    batch = await api.wait_status(created["id"], {"completed"}, timeout=120)
    after = await sim_stats(http, limited)
    throttled = after["throttled"] - before["throttled"]
    print(f"\ne2e failover: new leader after {took_over:.2f} s; throttled {throttled}")
    calls = after["calls"] - before["calls"]
    assert (batch["completed"], batch["failed"]) == (100, 0)
    assert took_over <= TAKE_OVER_S
    assert throttled <= THROTTLED_SHARE * calls
    killed.start()  # the teardown stops every worker, each must exit 0
    await killed.wait_ready(http)
