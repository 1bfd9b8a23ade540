"""The Anthropic Message Batches API end to end, as a user's unchanged code drives it: the
official SDK pointed at Relay (``base_url=…/anthropic``), every service its own process.

Create a batch of mixed models (the OpenAI-compatible ``gpt-4o-mini`` and the Anthropic
``sim-claude`` deployments) with system prompts, content blocks, tools and tool turns →
poll to ``ended`` → results → list → cancel a slow batch → delete; every object checked
strictly against the SDK's own types; another workspace's key gets 404 everywhere.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import pytest
from anthropic import AsyncAnthropic
from anthropic.types.messages import MessageBatch

from relay_batches.services.relay_cli import admin
from tests.helpers.anthropic_sdk import RawAnthropic, error_of, params, sdk_client
from tests.helpers.processes import System
from tests.helpers.support import ApiClient, wait_until

ASK = "Weather in Oslo? [sim:tool-call]"
WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
PIXEL = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
BLOCKS = [
    {"type": "text", "text": "describe "},
    {"type": "image", "source": PIXEL},
    {"type": "text", "text": "these"},
]
TOOL_TURN = [
    {"role": "user", "content": ASK.split(" [")[0]},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
        ],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "snow, -3C"}],
    },
]


def _tools(model: str) -> dict[str, Any]:
    return params(ASK, model, tools=[WEATHER], tool_choice={"type": "auto"})


def _tool_turn(model: str) -> dict[str, Any]:
    return {**params("", model, tools=[WEATHER]), "messages": TOOL_TURN}


REQUESTS: list[dict[str, Any]] = [
    {"custom_id": "gpt-text", "params": params("hello", system="Be brief.")},
    {
        "custom_id": "claude-blocks",
        "params": {
            **params("", "sim-claude", system=[{"type": "text", "text": "Be brief."}]),
            "messages": [{"role": "user", "content": BLOCKS}],
        },
    },
    {"custom_id": "gpt-tools", "params": _tools("gpt-4o-mini")},
    {"custom_id": "claude-tools", "params": _tools("sim-claude")},
    {"custom_id": "gpt-tool-turn", "params": _tool_turn("gpt-4o-mini")},
    {"custom_id": "claude-tool-turn", "params": _tool_turn("sim-claude")},
    {"custom_id": "gpt-refused", "params": params("no [sim:status=400]", stop_sequences=["x"])},
]


@pytest.fixture
async def sdk(system: System, api_key: str) -> AsyncIterator[AsyncAnthropic]:
    client = sdk_client(system.api_url, api_key)
    yield client
    await client.close()


@pytest.fixture
def raw(system: System, api_key: str, http: aiohttp.ClientSession) -> RawAnthropic:
    return RawAnthropic(system.api_url, api_key, http)


async def wait_ended(sdk: AsyncAnthropic, raw: RawAnthropic, batch_id: str) -> dict[str, Any]:
    """Poll with the SDK until the batch has ended; its raw JSON, checked strictly."""

    async def ended() -> MessageBatch | None:
        batch = await sdk.messages.batches.retrieve(batch_id)
        return batch if batch.processing_status == "ended" else None

    await wait_until(ended, 60, f"{batch_id} to end", 0.2)
    return await raw.batch("GET", f"/{batch_id}")


async def test_a_mixed_batch_runs_to_ended_with_every_answer_in_its_shape(
    sdk: AsyncAnthropic, raw: RawAnthropic, api: ApiClient
) -> None:
    created = await sdk.messages.batches.create(requests=REQUESTS)  # type: ignore[arg-type]
    assert created.processing_status == "in_progress"
    assert created.request_counts.processing == len(REQUESTS)

    ended = await wait_ended(sdk, raw, created.id)

    assert ended["request_counts"] == {
        "processing": 0,
        "succeeded": 6,
        "errored": 1,
        "canceled": 0,
        "expired": 0,
    }
    assert (
        ended["results_url"] == f"{raw.api_url}/anthropic/v1/messages/batches/{created.id}/results"
    )
    assert ended["ended_at"] is not None and ended["cancel_initiated_at"] is None
    lines = await raw.results(ended["results_url"])
    assert [line.custom_id for line in lines] == [r["custom_id"] for r in REQUESTS]
    results = {line.custom_id: line.result for line in lines}
    messages = {
        custom_id: result.message  # type: ignore[union-attr]
        for custom_id, result in results.items()
        if result.type == "succeeded"
    }
    texts = {
        custom_id: [(b.type, getattr(b, "text", None)) for b in m.content]
        for custom_id, m in messages.items()
    }
    assert texts["gpt-text"] == [("text", "echo: hello")]
    assert texts["claude-blocks"] == [("text", "echo: describe these")]
    assert texts["gpt-tool-turn"] == texts["claude-tool-turn"] == [("text", "echo: snow, -3C")]
    for custom_id in ("gpt-tools", "claude-tools"):
        [block] = messages[custom_id].content
        assert (block.type, block.name, block.input) == (  # type: ignore[union-attr]
            "tool_use",
            "get_weather",
            {"text": ASK},
        )
        assert messages[custom_id].stop_reason == "tool_use"
    assert messages["claude-tools"].content[0].id.startswith("toolu_")  # type: ignore[union-attr]
    assert messages["gpt-tools"].content[0].id.startswith("call_")  # type: ignore[union-attr]
    assert {custom_id: m.model for custom_id, m in messages.items()} == {
        "gpt-text": "sim-echo",
        "claude-blocks": "sim-claude",
        "gpt-tools": "sim-echo",
        "claude-tools": "sim-claude",
        "gpt-tool-turn": "sim-echo",
        "claude-tool-turn": "sim-claude",
    }
    for custom_id in ("gpt-text", "claude-blocks", "gpt-tool-turn", "claude-tool-turn"):
        assert messages[custom_id].stop_reason == "end_turn"
        assert messages[custom_id].usage.output_tokens > 0
    refused = results["gpt-refused"]
    assert refused.type == "errored"
    assert refused.error.error.type == "invalid_request_error"  # type: ignore[union-attr]
    assert "HTTP 400" in refused.error.error.message  # type: ignore[union-attr]

    streamed = await sdk.messages.batches.results(created.id)
    assert [line.custom_id async for line in streamed] == [r["custom_id"] for r in REQUESTS]
    native = await api.get(created.id.removeprefix("msgbatch_"))
    assert (native["status"], native["total"], native["completed"], native["failed"]) == (
        "completed",
        7,
        6,
        1,
    )
    assert created.id in [b.id async for b in sdk.messages.batches.list(limit=1)]


async def test_cancel_ends_a_slow_batch_and_delete_removes_it_everywhere(
    sdk: AsyncAnthropic, raw: RawAnthropic, api: ApiClient
) -> None:
    requests = [
        {"custom_id": f"slow-{i}", "params": params(f"slow {i} [sim:delay-ms=100]")}
        for i in range(400)
    ]
    created = await sdk.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    job_id = created.id.removeprefix("msgbatch_")

    async def some_done() -> bool:
        return (await api.get(job_id))["completed"] >= 8

    await wait_until(some_done, 30, "the slow batch to make progress")
    with pytest.raises(anthropic.ConflictError):
        await sdk.messages.batches.delete(created.id)

    canceled = await sdk.messages.batches.cancel(created.id)

    assert canceled.processing_status == "ended"
    assert canceled.cancel_initiated_at == canceled.ended_at is not None
    counts = canceled.request_counts
    assert counts.processing == counts.errored == counts.expired == 0
    assert counts.succeeded >= 8 and counts.canceled > 0
    assert counts.succeeded + counts.canceled == 400
    ended = await raw.batch("GET", f"/{created.id}")
    lines = await raw.results(ended["results_url"])
    assert [line.custom_id for line in lines] == [r["custom_id"] for r in requests]
    kinds = [line.result.type for line in lines]
    assert (kinds.count("succeeded"), kinds.count("canceled")) == (
        ended["request_counts"]["succeeded"],
        ended["request_counts"]["canceled"],
    )

    deleted = await sdk.messages.batches.delete(created.id)

    assert (deleted.id, deleted.type) == (created.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError):
        await sdk.messages.batches.retrieve(created.id)
    status, data = await raw.call("GET", f"/{created.id}/results")
    assert (status, error_of(data)[0]) == (404, "not_found_error")
    assert (await api.request("GET", f"/v1/batches/{job_id}"))[0] == 404


async def test_list_auto_pages_through_every_batch_both_ways(
    system: System, http: aiohttp.ClientSession
) -> None:
    key = (await admin.create_key(system.iso.database_url, "anthropic-e2e-list")).key
    client = sdk_client(system.api_url, key)
    try:
        ids = [
            (await client.messages.batches.create(requests=REQUESTS[:1])).id  # type: ignore[arg-type]
            for _ in range(5)
        ]
        assert [b.id async for b in client.messages.batches.list(limit=2)] == ids[::-1]
        first = await client.messages.batches.list(limit=2)
        assert (first.has_more, first.first_id, first.last_id) == (True, ids[4], ids[3])
        after = await client.messages.batches.list(limit=2, after_id=ids[3])
        assert [b.id for b in after.data] == [ids[2], ids[1]]
        before = client.messages.batches.list(limit=2, before_id=ids[0])
        assert [b.id async for b in before] == [ids[2], ids[1], ids[4], ids[3]]
    finally:
        await client.close()


async def test_another_workspaces_key_gets_404_on_every_endpoint(
    system: System, sdk: AsyncAnthropic, http: aiohttp.ClientSession
) -> None:
    created = await sdk.messages.batches.create(requests=REQUESTS[:1])  # type: ignore[arg-type]
    other_key = (await admin.create_key(system.iso.database_url, "anthropic-e2e-other")).key
    other = RawAnthropic(system.api_url, other_key, http)

    for method, path in (
        ("GET", f"/{created.id}"),
        ("POST", f"/{created.id}/cancel"),
        ("GET", f"/{created.id}/results"),
        ("DELETE", f"/{created.id}"),
    ):
        status, data = await other.call(method, path)
        assert (status, error_of(data)[0]) == (404, "not_found_error"), (method, path)
    status, page = await other.call("GET", "")
    assert status == 200
    assert created.id not in [b["id"] for b in page["data"]]
    assert (await sdk.messages.batches.retrieve(created.id)).id == created.id
