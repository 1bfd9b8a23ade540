"""The Anthropic-compatible surface in-process on the real ledger, driven by the official
SDK and by raw HTTP checked against the SDK's types: create, retrieve, list in both
directions, cancel, results, delete, errors in Anthropic's shape, workspace isolation.

No row-worker runs here: outcomes are recorded as the aggregator would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

import aiohttp
import anthropic
import asyncpg
import pytest
from aiohttp.test_utils import TestServer
from anthropic import AsyncAnthropic

from relay_batches.bus.client import Bus
from relay_batches.ids import new_id
from relay_batches.ledger.jobs import JobStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.messages import RowOutcome
from relay_batches.router.aliases import AliasTable
from relay_batches.services.relay_cli import admin
from tests.helpers.anthropic_sdk import RawAnthropic, error_of, params, sdk_client, strict_batch
from tests.helpers.api import start_api
from tests.helpers.support import ApiClient, Isolation


@dataclass
class User:
    """One workspace's SDK client, raw client and native client."""

    sdk: AsyncAnthropic
    raw: RawAnthropic
    native: ApiClient


async def new_user(
    iso: Isolation, server: TestServer, http: aiohttp.ClientSession, name: str
) -> User:
    key = (await admin.create_key(iso.database_url, name)).key
    url = str(server.make_url("")).rstrip("/")
    return User(sdk_client(url, key), RawAnthropic(url, key, http), ApiClient(url, key, http))


@pytest.fixture
async def alice(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession
) -> AsyncIterator[User]:
    user = await new_user(iso, api_server, http, f"anthropic-a-{new_id()[:8]}")
    yield user
    await user.sdk.close()


@pytest.fixture
async def bob(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession
) -> AsyncIterator[User]:
    user = await new_user(iso, api_server, http, f"anthropic-b-{new_id()[:8]}")
    yield user
    await user.sdk.close()


def two_requests() -> list[dict[str, object]]:
    return [
        {"custom_id": "first", "params": params("hello")},
        {"custom_id": "second", "params": params("world", system="Be brief.")},
    ]


async def run_to_end(pool: asyncpg.Pool, job_id: str, outcomes: list[RowOutcome]) -> None:
    """Mark the job running and record ``outcomes``, as dispatcher and aggregator would."""
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", job_id)
    await OutcomeStore(pool).record(outcomes)


async def test_create_answers_an_in_progress_batch_that_is_a_normal_job(alice: User) -> None:
    created = await alice.raw.batch("POST", "", {"requests": two_requests()})

    assert created["id"].startswith("msgbatch_") and len(created["id"]) == 41
    assert created["type"] == "message_batch"
    assert created["processing_status"] == "in_progress"
    assert created["request_counts"] == {
        "processing": 2,
        "succeeded": 0,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    assert (created["ended_at"], created["cancel_initiated_at"], created["results_url"]) == (
        None,
        None,
        None,
    )
    sdk_view = await alice.sdk.messages.batches.retrieve(created["id"])
    # The deadline is set as the job is built, its created_at by the ledger a moment later.
    assert abs(sdk_view.expires_at - sdk_view.created_at - timedelta(hours=24)) < timedelta(
        seconds=1
    )
    native = await alice.native.get(created["id"].removeprefix("msgbatch_"))
    assert (native["status"], native["total"], native["model"]) == ("queued", 2, "gpt-4o-mini")


async def test_the_sdk_creates_and_retrieves_with_a_bearer_key_too(alice: User) -> None:
    batch = await alice.sdk.messages.batches.create(requests=two_requests())  # type: ignore[arg-type]
    status, data = await alice.native.request(
        "GET", f"/anthropic/v1/messages/batches/{batch.id}", headers={"anthropic-beta": "x"}
    )

    assert status == 200
    assert strict_batch(data)["id"] == batch.id
    assert (await alice.sdk.messages.batches.retrieve(batch.id)).processing_status == "in_progress"


async def test_bad_requests_are_refused_in_anthropics_shape_naming_the_field(alice: User) -> None:
    bad = two_requests()
    bad[1]["params"]["messages"][0]["content"] = 7  # type: ignore[index]

    status, data = await alice.raw.call("POST", "", {"requests": bad})

    assert status == 400
    kind, message = error_of(data)
    assert kind == "invalid_request_error"
    assert message.startswith("requests[1].params.messages[0].content: ")
    with pytest.raises(anthropic.BadRequestError) as caught:
        await alice.sdk.messages.batches.create(
            requests=[{"custom_id": "x", "params": params("hi", model="no-such-model")}]  # type: ignore[list-item]
        )
    assert caught.value.status_code == 400
    assert "requests[0].params.model" in caught.value.message
    status, data = await alice.raw.call("POST", "", {"requests": [], "extra": 1})
    assert (status, error_of(data)[0]) == (400, "invalid_request_error")


async def test_an_unknown_or_malformed_id_is_a_404_on_every_endpoint(alice: User) -> None:
    native = (await alice.raw.batch("POST", "", {"requests": two_requests()}))["id"]
    for batch_id in (
        native.removeprefix("msgbatch_"),
        f"batch_{native[9:]}",
        "msgbatch_" + "0" * 32,
    ):
        for method, path in endpoints(batch_id):
            status, data = await alice.raw.call(method, path)
            assert status == 404, (method, path, status)
            assert error_of(data)[0] == "not_found_error"


def endpoints(batch_id: str) -> list[tuple[str, str]]:
    return [
        ("GET", f"/{batch_id}"),
        ("POST", f"/{batch_id}/cancel"),
        ("GET", f"/{batch_id}/results"),
        ("DELETE", f"/{batch_id}"),
    ]


async def test_another_workspace_gets_404_everywhere_and_sees_none_of_it(
    alice: User, bob: User
) -> None:
    batch_id = (await alice.raw.batch("POST", "", {"requests": two_requests()}))["id"]

    for method, path in endpoints(batch_id):
        status, data = await bob.raw.call(method, path)
        assert (status, error_of(data)[0]) == (404, "not_found_error"), (method, path)
    with pytest.raises(anthropic.NotFoundError):
        await bob.sdk.messages.batches.retrieve(batch_id)
    listed = [b.id async for b in bob.sdk.messages.batches.list()]
    assert batch_id not in listed
    status, page = await bob.raw.call("GET", f"?after_id={batch_id}")
    assert (status, page["data"], page["has_more"]) == (200, [], False)
    assert (await alice.sdk.messages.batches.retrieve(batch_id)).processing_status == "in_progress"


async def test_list_pages_newest_first_in_both_directions(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession
) -> None:
    user = await new_user(iso, api_server, http, f"anthropic-list-{new_id()[:8]}")
    ids = [(await user.raw.batch("POST", "", {"requests": two_requests()}))["id"] for _ in range(5)]
    newest_first = ids[::-1]

    assert [b.id async for b in user.sdk.messages.batches.list(limit=2)] == newest_first
    status, first = await user.raw.call("GET", "?limit=2")
    assert status == 200
    for batch in first["data"]:
        strict_batch(batch)
    assert [b["id"] for b in first["data"]] == newest_first[:2]
    assert (first["has_more"], first["first_id"], first["last_id"]) == (
        True,
        newest_first[0],
        newest_first[1],
    )
    _, older = await user.raw.call("GET", f"?limit=2&after_id={first['last_id']}")
    assert [b["id"] for b in older["data"]] == newest_first[2:4]
    _, last = await user.raw.call("GET", f"?limit=2&after_id={older['last_id']}")
    assert ([b["id"] for b in last["data"]], last["has_more"]) == (newest_first[4:], False)
    _, newer = await user.raw.call("GET", f"?limit=2&before_id={newest_first[4]}")
    assert ([b["id"] for b in newer["data"]], newer["has_more"]) == (newest_first[2:4], True)
    _, top = await user.raw.call("GET", f"?limit=2&before_id={newest_first[2]}")
    assert ([b["id"] for b in top["data"]], top["has_more"]) == (newest_first[:2], False)
    backwards = user.sdk.messages.batches.list(limit=1, before_id=newest_first[4])
    assert [b.id async for b in backwards] == newest_first[3::-1]
    for query in (
        "?limit=0",
        "?limit=1001",
        "?limit=x",
        f"?after_id={ids[0]}&before_id={ids[1]}",
        "?after_id=nope",
    ):
        status, data = await user.raw.call("GET", query)
        assert (status, error_of(data)[0]) == (400, "invalid_request_error"), query
    await user.sdk.close()


async def test_cancel_ends_the_batch_and_every_row_is_canceled(alice: User) -> None:
    created = await alice.raw.batch("POST", "", {"requests": two_requests()})
    status, early = await alice.raw.call("GET", f"/{created['id']}/results")
    assert (status, error_of(early)[0]) == (409, "invalid_request_error")

    canceled = await alice.raw.batch("POST", f"/{created['id']}/cancel")

    assert canceled["processing_status"] == "ended"
    assert canceled["cancel_initiated_at"] == canceled["ended_at"] is not None
    assert canceled["request_counts"] == {
        "processing": 0,
        "succeeded": 0,
        "errored": 0,
        "canceled": 2,
        "expired": 0,
    }
    assert canceled["results_url"] == (
        f"{alice.raw.api_url}/anthropic/v1/messages/batches/{created['id']}/results"
    )
    lines = await alice.raw.results(canceled["results_url"])
    assert [(line.custom_id, line.result.type) for line in lines] == [
        ("first", "canceled"),
        ("second", "canceled"),
    ]
    again = await alice.sdk.messages.batches.cancel(created["id"])
    assert again.processing_status == "ended"
    assert (await alice.native.get(created["id"][9:]))["status"] == "canceled"


async def test_results_render_each_outcome_and_the_sdk_reads_them(
    alice: User, pool: asyncpg.Pool
) -> None:
    requests = [{"custom_id": f"r{i}", "params": params(f"q{i}")} for i in range(3)]
    created = await alice.raw.batch("POST", "", {"requests": requests})
    job_id = created["id"][9:]
    calls = '[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\\"a\\":1}"}}]'
    await run_to_end(
        pool,
        job_id,
        [
            RowOutcome(
                job_id,
                0,
                "answer 0",
                None,
                1,
                prompt_tokens=5,
                completion_tokens=2,
                finish_reason="stop",
                model="sim-echo",
            ),
            RowOutcome(job_id, 1, "", None, 1, tool_calls=calls, finish_reason="tool_calls"),
            RowOutcome(job_id, 2, None, "upstream_error: HTTP 429 slow down", 4, True),
        ],
    )

    ended = await alice.raw.batch("GET", f"/{created['id']}")
    assert ended["processing_status"] == "ended"
    assert ended["request_counts"] == {
        "processing": 0,
        "succeeded": 2,
        "errored": 1,
        "canceled": 0,
        "expired": 0,
    }
    lines = await alice.raw.results(ended["results_url"])
    by_id = {line.custom_id: line.result for line in lines}
    assert list(by_id) == ["r0", "r1", "r2"]
    text = by_id["r0"].message  # type: ignore[union-attr]
    assert (text.content[0].text, text.stop_reason, text.model) == (
        "answer 0",
        "end_turn",
        "sim-echo",
    )  # type: ignore[union-attr]
    assert (text.usage.input_tokens, text.usage.output_tokens) == (5, 2)
    tool = by_id["r1"].message  # type: ignore[union-attr]
    assert [(b.type, b.name, b.input) for b in tool.content] == [("tool_use", "f", {"a": 1})]  # type: ignore[union-attr]
    assert tool.stop_reason == "tool_use"
    assert by_id["r2"].error.error.type == "rate_limit_error"  # type: ignore[union-attr]
    streamed = await alice.sdk.messages.batches.results(created["id"])
    assert [line.custom_id async for line in streamed] == ["r0", "r1", "r2"]


async def test_bad_stored_tool_calls_never_break_the_results_stream(
    alice: User, pool: asyncpg.Pool
) -> None:
    """Rows recorded before replies were checked may hold any tool calls: every results
    rendering (Anthropic lines, native results) still streams whole and valid."""
    stored = ["[1]", "not json", '{"id":"call_1"}', '[{"function":"x"}]']
    requests = [{"custom_id": f"r{i}", "params": params(f"q{i}")} for i in range(len(stored))]
    created = await alice.raw.batch("POST", "", {"requests": requests})
    job_id = created["id"][9:]
    outcomes = [
        RowOutcome(job_id, i, "", None, 1, tool_calls=text, finish_reason="tool_calls")
        for i, text in enumerate(stored)
    ]
    await run_to_end(pool, job_id, outcomes)

    ended = await alice.raw.batch("GET", f"/{created['id']}")
    lines = await alice.raw.results(ended["results_url"])
    assert [(line.custom_id, line.result.type) for line in lines] == [
        (f"r{i}", "succeeded") for i in range(len(stored))
    ]
    for line in lines:
        message = line.result.message  # type: ignore[union-attr]
        assert [(b.type, b.text) for b in message.content] == [("text", "")]  # type: ignore[union-attr]
    streamed = await alice.sdk.messages.batches.results(created["id"])
    assert [line.custom_id async for line in streamed] == [f"r{i}" for i in range(len(stored))]
    native = await alice.native.results(job_id)
    assert native["data"] == [{"custom_id": f"r{i}", "content": ""} for i in range(len(stored))]


async def test_delete_only_an_ended_batch_and_then_it_is_gone_everywhere(alice: User) -> None:
    created = await alice.raw.batch("POST", "", {"requests": two_requests()})
    with pytest.raises(anthropic.ConflictError):
        await alice.sdk.messages.batches.delete(created["id"])
    status, data = await alice.raw.call("DELETE", f"/{created['id']}")
    assert (status, error_of(data)[0]) == (409, "invalid_request_error")
    await alice.sdk.messages.batches.cancel(created["id"])

    deleted = await alice.sdk.messages.batches.delete(created["id"])

    assert (deleted.id, deleted.type) == (created["id"], "message_batch_deleted")
    for method, path in endpoints(created["id"]):
        status, data = await alice.raw.call(method, path)
        assert (status, error_of(data)[0]) == (404, "not_found_error"), (method, path)
    status, _ = await alice.native.request("GET", f"/v1/batches/{created['id'][9:]}")
    assert status == 404
    assert created["id"] not in [b.id async for b in alice.sdk.messages.batches.list()]


async def test_an_idempotency_key_replays_the_first_batch(alice: User) -> None:
    body = {"requests": two_requests()}
    headers = {"Idempotency-Key": "anthropic-once"}

    first_status, first = await alice.raw.call("POST", "", body, headers)
    again_status, again = await alice.raw.call("POST", "", body, headers)
    other_status, other = await alice.raw.call(
        "POST", "", {"requests": two_requests()[:1]}, headers
    )

    assert (first_status, again_status) == (200, 200)
    assert strict_batch(again)["id"] == first["id"]
    assert (other_status, error_of(other)[0]) == (409, "invalid_request_error")


async def test_an_expired_batch_shows_its_unrun_rows_expired(
    alice: User, pool: asyncpg.Pool
) -> None:
    created = await alice.raw.batch("POST", "", {"requests": two_requests()})
    job_id = created["id"][9:]
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", job_id)
    await OutcomeStore(pool).record([RowOutcome(job_id, 0, "answer 0", None, 1)])
    # What the expiry reaper does once expires_at has passed.
    await pool.execute(
        "UPDATE batches SET status = 'expired', completed_at = now() WHERE id = $1", job_id
    )

    ended = await alice.raw.batch("GET", f"/{created['id']}")

    assert ended["processing_status"] == "ended"
    assert ended["cancel_initiated_at"] is None
    assert ended["request_counts"] == {
        "processing": 0,
        "succeeded": 1,
        "errored": 0,
        "canceled": 0,
        "expired": 1,
    }
    lines = await alice.raw.results(ended["results_url"])
    assert [(line.custom_id, line.result.type) for line in lines] == [
        ("first", "succeeded"),
        ("second", "expired"),
    ]


async def test_results_url_is_rooted_at_the_public_base_url(
    iso: Isolation, pool: asyncpg.Pool, bus: Bus, aliases: AliasTable, http: aiohttp.ClientSession
) -> None:
    """Behind a TLS-terminating proxy the request's origin is http://; the configured
    public address roots results_url instead, so the SDK never sends its key in clear."""
    server = await start_api(pool, bus, aliases, JobStore(pool), "https://relay.example.com/gw")
    user = await new_user(iso, server, http, f"anthropic-p-{new_id()[:8]}")
    try:
        created = await user.raw.batch("POST", "", {"requests": two_requests()})
        canceled = await user.raw.batch("POST", f"/{created['id']}/cancel")
    finally:
        await user.sdk.close()
        await server.close()
    assert canceled["results_url"] == (
        f"https://relay.example.com/gw/anthropic/v1/messages/batches/{created['id']}/results"
    )
