"""Workspace isolation, list pagination and cancel, over real HTTP against the ingest-api.

No dispatcher runs here, so every submitted batch stays ``queued`` (or ``scheduled``).
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from relay_batches.ids import new_id
from relay_batches.services.relay_cli import admin
from tests.helpers.support import ApiClient, Isolation, rows

MODEL = "gpt-4o-mini"
TIMESTAMP_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
BATCH_ROUTES = [
    pytest.param("GET", "", id="get"),
    pytest.param("GET", "/results", id="results"),
    pytest.param("GET", "/dead_letter", id="dead-letter"),
    pytest.param("POST", "/cancel", id="cancel"),
]


async def new_client(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession, workspace: str
) -> ApiClient:
    """A client with a new key of ``workspace`` (created if missing)."""
    created = await admin.create_key(iso.database_url, workspace)
    return ApiClient(str(api_server.make_url("")).rstrip("/"), created.key, http)


@pytest.fixture
async def fresh(iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession) -> ApiClient:
    """A client of a workspace of its own, empty at the start of the test."""
    return await new_client(iso, api_server, http, f"workspace-{new_id()[:12]}")


async def submit(client: ApiClient, name: str, **fields: Any) -> dict[str, Any]:
    """Submit a small valid batch called ``name``."""
    return await client.submit({"model": MODEL, "name": name, "requests": rows(2), **fields})


async def list_all(client: ApiClient, query: str = "") -> list[dict[str, Any]]:
    """Every batch the client can list (following pages), newest first."""
    found: list[dict[str, Any]] = []
    after = ""
    while True:
        status, page = await client.request("GET", f"/v1/batches?limit=100{query}{after}")
        assert status == 200, page
        found.extend(page["data"])
        if not page["has_more"]:
            return found
        after = f"&after={found[-1]['id']}"


# --- isolation between workspaces ----------------------------------------------------


@pytest.mark.parametrize(("method", "suffix"), BATCH_ROUTES)
async def test_other_workspace_gets_404_exactly_like_a_missing_id(
    client_a: ApiClient, client_b: ApiClient, method: str, suffix: str
) -> None:
    batch = await submit(client_a, "owned by A")
    missing = new_id()

    status, data = await client_b.request(method, f"/v1/batches/{batch['id']}{suffix}")
    missing_status, missing_data = await client_b.request(method, f"/v1/batches/{missing}{suffix}")

    assert (status, missing_status) == (404, 404), (data, missing_data)
    assert data == {
        "error": {
            **missing_data["error"],
            "message": missing_data["error"]["message"].replace(missing, batch["id"]),
        }
    }
    assert data["error"]["type"] == "not_found_error"
    assert data["error"]["param"] == "id"
    # Whatever B tried, A's batch is untouched.
    assert await client_a.get(batch["id"]) == batch


@pytest.mark.parametrize(("method", "suffix"), BATCH_ROUTES)
async def test_owner_workspace_reaches_its_batch(
    client_a: ApiClient, method: str, suffix: str
) -> None:
    batch = await submit(client_a, "owned by A")
    status, data = await client_a.request(method, f"/v1/batches/{batch['id']}{suffix}")
    assert status == 200, data
    assert data["id"] == batch["id"]


async def test_other_workspace_list_never_shows_the_batch(
    client_a: ApiClient, client_b: ApiClient
) -> None:
    batch = await submit(client_a, "listed only for A")
    await submit(client_b, "B's own")

    b_ids = {b["id"] for b in await list_all(client_b)}
    assert batch["id"] not in b_ids
    assert batch["id"] not in {b["id"] for b in await list_all(client_b, "&status=queued")}
    assert batch["id"] in {b["id"] for b in await list_all(client_a)}
    assert not b_ids & {b["id"] for b in await list_all(client_a)}


async def test_other_workspace_cannot_page_from_the_batch(
    client_a: ApiClient, client_b: ApiClient
) -> None:
    await submit(client_b, "B's own")
    batch = await submit(client_a, "A's cursor")
    status, data = await client_b.request("GET", f"/v1/batches?after={batch['id']}")
    missing_status, missing_data = await client_b.request("GET", f"/v1/batches?after={new_id()}")
    assert (status, missing_status) == (200, 200)
    assert data == missing_data


async def test_any_key_of_the_workspace_reads_and_cancels(
    iso: Isolation,
    api_server: TestServer,
    http: aiohttp.ClientSession,
    client_a: ApiClient,
) -> None:
    batch = await submit(client_a, "shared within A")
    second_key = await new_client(iso, api_server, http, "workspace-a")
    assert second_key.key != client_a.key

    assert await second_key.get(batch["id"]) == batch
    assert batch["id"] in {b["id"] for b in await list_all(second_key)}
    status, canceled = await second_key.request("POST", f"/v1/batches/{batch['id']}/cancel")
    assert status == 200, canceled
    assert (await client_a.get(batch["id"]))["status"] == "canceled"


# --- list pagination -----------------------------------------------------------------


async def test_list_pages_newest_first_with_has_more(fresh: ApiClient) -> None:
    created = [await submit(fresh, f"page-{i}") for i in range(5)]
    newest_first = [b["id"] for b in reversed(created)]

    seen: list[str] = []
    pages: list[tuple[int, bool]] = []
    after = ""
    while True:
        status, page = await fresh.request("GET", f"/v1/batches?limit=2{after}")
        assert status == 200, page
        assert page["object"] == "list"
        seen.extend(b["id"] for b in page["data"])
        pages.append((len(page["data"]), page["has_more"]))
        if not page["has_more"]:
            break
        after = f"&after={page['data'][-1]['id']}"

    assert pages == [(2, True), (2, True), (1, False)]
    assert seen == newest_first


async def test_list_page_objects_are_full_batches(fresh: ApiClient) -> None:
    first = await submit(fresh, "first")
    second = await submit(fresh, "second")
    status, page = await fresh.request("GET", "/v1/batches")
    assert status == 200, page
    assert page == {"object": "list", "data": [second, first], "has_more": False}


@pytest.mark.parametrize(("limit", "has_more"), [(4, True), (5, False), (6, False)])
async def test_has_more_at_the_exact_page_boundary(
    fresh: ApiClient, limit: int, has_more: bool
) -> None:
    for i in range(5):
        await submit(fresh, f"b-{i}")
    status, page = await fresh.request("GET", f"/v1/batches?limit={limit}")
    assert status == 200, page
    assert len(page["data"]) == min(limit, 5)
    assert page["has_more"] is has_more


async def test_empty_workspace_lists_nothing(fresh: ApiClient) -> None:
    status, page = await fresh.request("GET", "/v1/batches")
    assert (status, page) == (200, {"object": "list", "data": [], "has_more": False})


async def test_list_filters_by_status(fresh: ApiClient) -> None:
    queued = [await submit(fresh, f"q-{i}") for i in range(4)]
    canceled = await submit(fresh, "to cancel")
    status, _ = await fresh.request("POST", f"/v1/batches/{canceled['id']}/cancel")
    assert status == 200
    scheduled = await submit(fresh, "every hour", cron="0 * * * *")

    queued_ids = [b["id"] for b in reversed(queued)]
    assert [b["id"] for b in await list_all(fresh, "&status=queued")] == queued_ids
    assert [b["id"] for b in await list_all(fresh, "&status=canceled")] == [canceled["id"]]
    assert [b["id"] for b in await list_all(fresh, "&status=scheduled")] == [scheduled["id"]]
    assert await list_all(fresh, "&status=running") == []
    assert len(await list_all(fresh)) == 6

    # The filter and the cursor combine: page through the queued ones two at a time.
    status, first = await fresh.request("GET", "/v1/batches?status=queued&limit=2")
    assert status == 200, first
    assert ([b["id"] for b in first["data"]], first["has_more"]) == (queued_ids[:2], True)
    status, second = await fresh.request(
        "GET", f"/v1/batches?status=queued&limit=2&after={queued_ids[1]}"
    )
    assert status == 200, second
    assert ([b["id"] for b in second["data"]], second["has_more"]) == (queued_ids[2:], False)


# --- cancel --------------------------------------------------------------------------


async def test_cancel_queued_batch_then_cancel_again_is_409(client_a: ApiClient) -> None:
    batch = await submit(client_a, "to cancel")
    assert batch["status"] == "queued"

    status, canceled = await client_a.request("POST", f"/v1/batches/{batch['id']}/cancel")
    assert status == 200, canceled
    assert canceled["id"] == batch["id"]
    assert canceled["object"] == "batch"
    assert canceled["status"] == "canceled"
    assert TIMESTAMP_RE.match(canceled["completed_at"]), canceled
    assert canceled["completed_at"] >= batch["created_at"]
    assert (canceled["total"], canceled["completed"], canceled["failed"]) == (2, 0, 0)
    assert await client_a.get(batch["id"]) == canceled

    status, again = await client_a.request("POST", f"/v1/batches/{batch['id']}/cancel")
    assert status == 409, again
    assert set(again["error"]) == {"type", "message", "param"}
    assert again["error"]["type"] == "conflict_error"
    assert again["error"]["param"] == "id"
    assert "canceled" in again["error"]["message"]
    assert await client_a.get(batch["id"]) == canceled


async def test_cancel_scheduled_template_stops_its_ticks(client_a: ApiClient) -> None:
    template = await submit(client_a, "hourly", cron="0 * * * *")
    assert template["status"] == "scheduled"
    assert template["next_run_at"] is not None

    status, canceled = await client_a.request("POST", f"/v1/batches/{template['id']}/cancel")
    assert status == 200, canceled
    assert canceled["status"] == "canceled"
    assert canceled["next_run_at"] is None
    assert TIMESTAMP_RE.match(canceled["completed_at"]), canceled


async def test_canceled_batch_has_final_empty_results(client_a: ApiClient) -> None:
    batch = await submit(client_a, "canceled before any row ran")
    status, _ = await client_a.request("POST", f"/v1/batches/{batch['id']}/cancel")
    assert status == 200

    assert await client_a.results(batch["id"]) == {
        "id": batch["id"],
        "status": "canceled",
        "data": [],
    }
    status, dead = await client_a.request("GET", f"/v1/batches/{batch['id']}/dead_letter")
    assert (status, dead) == (200, {"id": batch["id"], "data": []})


async def test_results_of_a_queued_batch_are_empty(client_a: ApiClient) -> None:
    batch = await submit(client_a, "still queued")
    assert await client_a.results(batch["id"]) == {
        "id": batch["id"],
        "status": "queued",
        "data": [],
    }
