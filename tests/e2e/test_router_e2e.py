"""The router through the whole pipeline: attempts, dead letters, usage, params, and a
flaky upstream that the retries absorb."""

from __future__ import annotations

import aiohttp
import pytest

from tests.helpers.processes import System, signed_in, system_fixture
from tests.helpers.support import ApiClient, rows


async def test_attempts_dead_letters_failures_and_usage(api: ApiClient) -> None:
    requests = [
        {"custom_id": "ok", "messages": [{"role": "user", "content": "fine"}]},
        {"custom_id": "flaky", "messages": [{"role": "user", "content": "x [sim:fail-first=2]"}]},
        {"custom_id": "down", "messages": [{"role": "user", "content": "x [sim:status=503]"}]},
        {"custom_id": "bad", "messages": [{"role": "user", "content": "x [sim:status=400]"}]},
    ]
    created = await api.submit(
        {"model": "gpt-4o-mini", "requests": requests, "params": {"temperature": 0.2}}
    )
    batch = await api.wait_status(created["id"], {"completed"}, timeout=60)
    assert (batch["completed"], batch["failed"], batch["dead_letter"]) == (2, 2, 1)
    assert batch["params"] == {"temperature": 0.2}
    assert batch["usage"]["prompt_tokens"] > 0
    assert batch["usage"]["completion_tokens"] > 0

    data = {row["custom_id"]: row for row in (await api.results(created["id"]))["data"]}
    assert data["ok"] == {"custom_id": "ok", "content": "echo: fine"}
    assert data["flaky"] == {"custom_id": "flaky", "content": "echo: x [sim:fail-first=2]"}
    assert data["down"]["error"].startswith("upstream_error: sim: HTTP 503")
    assert data["bad"]["error"].startswith("upstream_error: sim: HTTP 400")

    status, dead = await api.request("GET", f"/v1/batches/{created['id']}/dead_letter")
    assert status == 200
    assert dead["id"] == created["id"]
    assert [(d["custom_id"], d["attempts"]) for d in dead["data"]] == [("down", 4)]
    assert dead["data"][0]["error"] == data["down"]["error"]


# A second system whose simulator answers 503 to 30% of all calls at random.
flaky_system = system_fixture(
    "flaky",
    sim_env={"RELAY_SIM_ERROR_RATE": "0.3"},
    max_retries=12,
    RELAY_BATCH_CONCURRENCY="16",
    RELAY_RETRY_BASE_MS="5",
    RELAY_RETRY_CAP_S="0.2",
)


@pytest.fixture(scope="module")
async def flaky_api(flaky_system: System, http: aiohttp.ClientSession) -> ApiClient:
    """A client of the flaky system."""
    return await signed_in(flaky_system, http, "flaky")


async def test_a_thousand_rows_survive_a_30_percent_error_rate(flaky_api: ApiClient) -> None:
    created = await flaky_api.submit({"model": "gpt-4o-mini", "requests": rows(1000)})
    batch = await flaky_api.wait_status(created["id"], {"completed"}, timeout=180)
    assert (batch["completed"], batch["failed"], batch["dead_letter"]) == (1000, 0, 0)
    results = await flaky_api.results(created["id"])
    assert results["data"] == [
        {"custom_id": f"r-{i}", "content": f"echo: row {i}"} for i in range(1000)
    ]
