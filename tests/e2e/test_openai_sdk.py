"""The OpenAI-compatible surface end to end, driven by the official ``openai`` SDK pointed
at a live system: files → batch → poll → output and error files → list auto-paging →
cancel, and every object the API returns read strictly by the SDK's own types."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai.types import Batch, FileDeleted, FileObject
from openai.types.chat import ChatCompletion
from openai.types.shared import ErrorObject

from relay_batches.services.relay_cli import admin
from tests.helpers.processes import System
from tests.helpers.support import wait_until

MODEL = "gpt-4o-mini"


def line(custom_id: str, text: str, **body: Any) -> dict[str, Any]:
    """One OpenAI batch input line."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": text}], **body},
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    """The lines as a JSONL file."""
    return b"".join(orjson.dumps(item) + b"\n" for item in lines)


class Raw:
    """Plain HTTP on the surface, for reading the JSON exactly as it is sent."""

    def __init__(self, base: str, key: str, http: aiohttp.ClientSession) -> None:
        self.base = base
        self.key = key
        self.http = http

    async def get(self, path: str) -> tuple[int, Any]:
        """(status, decoded JSON body) of a GET."""
        headers = {"Authorization": f"Bearer {self.key}"}
        async with self.http.get(self.base + path, headers=headers) as response:
            return response.status, orjson.loads(await response.read())

    async def strict_batch(self, batch_id: str) -> Batch:
        """The batch as sent, read by the SDK's type; every time an integer."""
        status, raw = await self.get(f"/batches/{batch_id}")
        assert status == 200, raw
        for name in ("created_at", "in_progress_at", "completed_at", "cancelled_at", "expires_at"):
            assert raw[name] is None or type(raw[name]) is int, (name, raw[name])
        return Batch.model_validate(raw, strict=True)

    async def strict_file(self, file_id: str) -> FileObject:
        """The file as sent, read by the SDK's type."""
        status, raw = await self.get(f"/files/{file_id}")
        assert status == 200, raw
        return FileObject.model_validate(raw, strict=True)


@pytest.fixture(scope="module")
async def openai_key(system: System) -> str:
    """A key of the OpenAI tests' own workspace."""
    return (await admin.create_key(system.iso.database_url, "openai-a")).key


@pytest.fixture
async def client(system: System, openai_key: str) -> AsyncIterator[openai.AsyncOpenAI]:
    """The SDK as a user sets it up, pointed at Relay."""
    created = openai.AsyncOpenAI(
        base_url=f"{system.api_url}/openai/v1", api_key=openai_key, max_retries=0
    )
    yield created
    await created.close()


@pytest.fixture
def raw(system: System, openai_key: str, http: aiohttp.ClientSession) -> Raw:
    """Plain HTTP on the surface with the same key."""
    return Raw(f"{system.api_url}/openai/v1", openai_key, http)


async def wait_batch(client: openai.AsyncOpenAI, batch_id: str, statuses: set[str]) -> Batch:
    """Poll like a user's loop until the batch reaches one of ``statuses``."""
    seen: list[Batch] = []

    async def reached() -> bool:
        seen.append(await client.batches.retrieve(batch_id))
        return seen[-1].status in statuses

    await wait_until(reached, 90, f"batch {batch_id} to reach {statuses}")
    return seen[-1]


async def content_lines(client: openai.AsyncOpenAI, file_id: str) -> list[dict[str, Any]]:
    """A file's content, one decoded JSON object per line."""
    content = await client.files.content(file_id)
    return [orjson.loads(x) for x in content.content.splitlines()]


async def test_file_batch_poll_output_and_error_files(
    client: openai.AsyncOpenAI, raw: Raw, system: System, http: aiohttp.ClientSession
) -> None:
    data = jsonl(
        [
            line("a", "first"),
            line("b", "second [sim:status=400]"),
            line("c", "third"),
        ]
    )
    uploaded = await client.files.create(file=("requests.jsonl", data), purpose="batch")
    assert (uploaded.object, uploaded.bytes, uploaded.filename, uploaded.purpose) == (
        "file",
        len(data),
        "requests.jsonl",
        "batch",
    )
    assert uploaded.id.startswith("file-")
    assert await raw.strict_file(uploaded.id) == uploaded
    assert (await client.files.content(uploaded.id)).content == data

    created = await client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"team": "search"},
    )
    assert created.status == "in_progress"
    assert created.input_file_id == uploaded.id
    assert created.metadata == {"team": "search"}
    assert created.expires_at is not None
    assert abs(created.expires_at - (created.created_at + 24 * 3600)) <= 1

    done = await wait_batch(client, created.id, {"completed", "failed"})
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (3, 2)
    assert done.request_counts.failed == 1
    assert done.completed_at is not None and done.finalizing_at == done.completed_at
    assert await raw.strict_batch(created.id) == done
    assert done.output_file_id is not None and done.error_file_id is not None

    outputs = await content_lines(client, done.output_file_id)
    assert [o["custom_id"] for o in outputs] == ["a", "c"]
    bodies = [ChatCompletion.model_validate(o["response"]["body"], strict=True) for o in outputs]
    assert [b.choices[0].message.content for b in bodies] == ["echo: first", "echo: third"]
    assert [b.choices[0].finish_reason for b in bodies] == ["stop", "stop"]
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in outputs)

    errors = await content_lines(client, done.error_file_id)
    assert [(e["custom_id"], e["error"]) for e in errors] == [("b", None)]
    failure = ErrorObject.model_validate(errors[0]["response"]["body"]["error"], strict=True)
    assert errors[0]["response"]["status_code"] >= 400 and failure.code == "upstream_error"
    for file_id in (done.output_file_id, done.error_file_id):
        stored = await raw.strict_file(file_id)
        content = await client.files.content(file_id)
        assert (stored.purpose, stored.bytes) == ("batch_output", len(content.content))

    # The same job in the native API.
    native = done.id.removeprefix("batch_")
    headers = {"Authorization": f"Bearer {raw.key}"}
    async with http.get(f"{system.api_url}/v1/batches/{native}", headers=headers) as response:
        job = await response.json()
    assert (job["status"], job["total"], job["completed"], job["failed"]) == (
        "completed",
        3,
        2,
        1,
    )


async def test_list_auto_paging_newest_first(client: openai.AsyncOpenAI, raw: Raw) -> None:
    uploaded = await client.files.create(
        file=("p.jsonl", jsonl([line("x", "hi")])), purpose="batch"
    )
    ids = []
    for _ in range(3):
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="1h"
        )
        ids.append(batch.id)

    listed = [b.id async for b in client.batches.list(limit=2)]

    assert listed[:3] == ids[::-1]
    assert len(listed) == len(set(listed))
    files = [f.id async for f in client.files.list(limit=1)]
    assert uploaded.id in files and len(files) == len(set(files))
    # The pages as sent: OpenAI's list shape, every item read strictly by the SDK's type.
    status, page = await raw.get("/batches?limit=2")
    assert status == 200 and (page["object"], page["has_more"]) == ("list", True)
    assert [page["first_id"], page["last_id"]] == ids[:0:-1]
    for item in page["data"]:
        Batch.model_validate(item, strict=True)
    status, page = await raw.get(f"/batches?limit=100&after={ids[1]}")
    assert status == 200 and page["data"][0]["id"] == ids[0]
    status, page = await raw.get("/files?limit=2&order=desc")
    assert status == 200 and page["object"] == "list" and page["first_id"] == uploaded.id
    for item in page["data"]:
        FileObject.model_validate(item, strict=True)


async def test_cancel_ends_cancelled_and_a_second_cancel_returns_it(
    client: openai.AsyncOpenAI, raw: Raw
) -> None:
    slow = [line(f"s{i}", f"slow {i} [sim:delay-ms=2000]") for i in range(40)]
    uploaded = await client.files.create(file=("slow.jsonl", jsonl(slow)), purpose="batch")
    created = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    cancelled = await client.batches.cancel(created.id)
    again = await client.batches.cancel(created.id)

    assert cancelled.status == "cancelled"
    assert cancelled.cancelled_at is not None and cancelled.cancelling_at == cancelled.cancelled_at
    assert again.status == "cancelled" and again.cancelled_at == cancelled.cancelled_at
    final = await raw.strict_batch(created.id)
    assert final.error_file_id is not None
    errors = await content_lines(client, final.error_file_id)
    assert final.request_counts is not None
    assert len(errors) == 40 - final.request_counts.completed
    unrun = [e for e in errors if e["error"] and e["error"]["code"] == "batch_cancelled"]
    assert len(unrun) >= 30 and all(e["response"] is None for e in unrun)


async def test_a_file_with_bad_lines_gives_a_failed_batch_with_line_errors(
    client: openai.AsyncOpenAI, raw: Raw
) -> None:
    bad_url = {**line("c", "x"), "url": "/v1/audio/speech"}
    data = jsonl([line("a", "fine")]) + b"{not json\n\n" + jsonl([bad_url, line("a", "again")])
    uploaded = await client.files.create(file=("bad.jsonl", data), purpose="batch")

    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.errors is not None and batch.errors.object == "list"
    assert [(e.code, e.line) for e in batch.errors.data or []] == [
        ("invalid_json_line", 2),
        ("url_mismatch", 4),
    ]
    assert (batch.output_file_id, batch.error_file_id) == (None, None)
    assert await raw.strict_batch(batch.id) == batch


async def test_duplicate_custom_ids_are_named_by_line(client: openai.AsyncOpenAI) -> None:
    data = jsonl([line("a", "one"), line("b", "two"), line("a", "three")])
    uploaded = await client.files.create(file=("dup.jsonl", data), purpose="batch")

    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    assert batch.status == "failed"
    assert [(e.code, e.line) for e in batch.errors.data or []] == [("duplicate_custom_id", 3)]


async def test_errors_come_in_openai_shape_naming_the_field(client: openai.AsyncOpenAI) -> None:
    uploaded = await client.files.create(file=("e.jsonl", jsonl([line("a", "x")])), purpose="batch")
    cases = [
        ({"endpoint": "/v1/audio/speech"}, "endpoint"),
        ({"completion_window": "8d"}, "completion_window"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ]
    for change, param in cases:
        args: dict[str, Any] = {
            "input_file_id": uploaded.id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            **change,
        }
        with pytest.raises(openai.BadRequestError) as caught:
            await client.batches.create(**args)
        assert caught.value.param == param
        assert caught.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        await client.batches.retrieve("batch_nope")


async def test_delete_a_file(client: openai.AsyncOpenAI, raw: Raw) -> None:
    uploaded = await client.files.create(file=("d.jsonl", jsonl([line("a", "x")])), purpose="batch")

    deleted = await client.files.delete(uploaded.id)

    assert deleted == FileDeleted(id=uploaded.id, deleted=True, object="file")
    assert (await raw.get(f"/files/{uploaded.id}"))[0] == 404
    with pytest.raises(openai.NotFoundError):
        await client.files.content(uploaded.id)


async def test_another_workspace_gets_404_on_every_endpoint(
    client: openai.AsyncOpenAI, system: System
) -> None:
    uploaded = await client.files.create(file=("w.jsonl", jsonl([line("a", "x")])), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await wait_batch(client, batch.id, {"completed"})
    assert done.output_file_id is not None
    other_key = (await admin.create_key(system.iso.database_url, "openai-b")).key
    other = openai.AsyncOpenAI(
        base_url=f"{system.api_url}/openai/v1", api_key=other_key, max_retries=0
    )
    calls = [
        other.files.retrieve(uploaded.id),
        other.files.content(uploaded.id),
        other.files.delete(uploaded.id),
        other.files.retrieve(done.output_file_id),
        other.files.content(done.output_file_id),
        other.files.delete(done.output_file_id),
        other.batches.retrieve(batch.id),
        other.batches.cancel(batch.id),
        other.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ]
    try:
        for call in calls:
            with pytest.raises(openai.NotFoundError):
                await call
        assert [b.id async for b in other.batches.list()] == []
        assert [f.id async for f in other.files.list()] == []
    finally:
        await other.close()
    # ... and nothing of it changed for the owner.
    assert (await client.files.retrieve(done.output_file_id)).id == done.output_file_id
    assert (await client.batches.retrieve(batch.id)).status == "completed"


async def test_requests_run_concurrently_with_the_native_surface(
    client: openai.AsyncOpenAI,
) -> None:
    uploaded = await client.files.create(
        file=("many.jsonl", jsonl([line(f"r{i}", f"row {i}") for i in range(300)])),
        purpose="batch",
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await wait_batch(client, batch.id, {"completed"})
    assert done.output_file_id is not None and done.error_file_id is None
    outputs = await content_lines(client, done.output_file_id)
    assert [o["custom_id"] for o in outputs] == [f"r{i}" for i in range(300)]
    assert [o["response"]["body"]["choices"][0]["message"]["content"] for o in outputs] == [
        f"echo: row {i}" for i in range(300)
    ]


async def test_rows_with_content_parts_tools_and_tool_turns_run(
    client: openai.AsyncOpenAI, raw: Raw
) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    parts = {
        "custom_id": "parts",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": MODEL,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look at "},
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                        {"type": "text", "text": "this"},
                    ],
                }
            ],
            "max_tokens": 50,
        },
    }
    turns = line("tools", "define it", tools=[tool], tool_choice="auto", temperature=0.2)
    turns["body"]["messages"] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "what is relay?", "name": "ana"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a gateway"},
        {"role": "user", "content": "now define it"},
    ]
    claude = line("claude", "hello claude", model="sim-claude", max_tokens=20)
    claude["body"]["messages"].insert(0, {"role": "system", "content": "Be brief."})
    calls_tool = line("call", "find relay [sim:tool-call]", tools=[tool])
    uploaded = await client.files.create(
        file=("rich.jsonl", jsonl([parts, turns, claude, calls_tool])), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.errors is None and batch.status == "in_progress"

    done = await wait_batch(client, batch.id, {"completed"})

    assert done.request_counts is not None and done.request_counts.completed == 4
    assert done.output_file_id is not None
    outputs = await content_lines(client, done.output_file_id)
    bodies = {o["custom_id"]: ChatCompletion.model_validate(o["response"]["body"]) for o in outputs}
    assert bodies["parts"].choices[0].message.content == "echo: look at this"
    assert bodies["tools"].choices[0].message.content == "echo: now define it"
    assert bodies["claude"].choices[0].message.content == "echo: hello claude"
    called = bodies["call"].choices[0]
    assert called.finish_reason == "tool_calls" and called.message.content is None
    assert called.message.tool_calls is not None
    function = called.message.tool_calls[0].function  # type: ignore[union-attr]
    assert function.name == "lookup"
    assert orjson.loads(function.arguments) == {"text": "find relay [sim:tool-call]"}
    # Mixed models: each row answered by its own alias's deployment, named as it answered.
    assert bodies["claude"].model != bodies["parts"].model
    assert bodies["tools"].model == bodies["parts"].model
    assert (await raw.strict_batch(batch.id)).model == MODEL  # the first line's


async def test_a_short_completion_window_ends_the_batch_expired(
    client: openai.AsyncOpenAI, raw: Raw
) -> None:
    rows = [line("quick", "quick")] + [
        line(f"slow{i}", f"slow {i} [sim:delay-ms=20000]") for i in range(12)
    ]
    uploaded = await client.files.create(file=("exp.jsonl", jsonl(rows)), purpose="batch")
    created = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="3s"
    )
    assert created.expires_at is not None
    assert abs(created.expires_at - (created.created_at + 3)) <= 1

    done = await wait_batch(client, created.id, {"expired", "completed"})

    assert done.status == "expired" and done.expired_at is not None
    assert await raw.strict_batch(created.id) == done
    assert done.error_file_id is not None
    errors = await content_lines(client, done.error_file_id)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        (f"slow{i}", "batch_expired") for i in range(12)
    ]
    assert done.request_counts is not None and done.request_counts.completed == 1
    assert done.output_file_id is not None
    outputs = await content_lines(client, done.output_file_id)
    assert [o["custom_id"] for o in outputs] == ["quick"]  # finished rows are kept
