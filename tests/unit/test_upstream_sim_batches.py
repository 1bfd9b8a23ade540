"""The upstream simulator's provider batch APIs over real HTTP: OpenAI Files + Batches and
Anthropic Message Batches (aiohttp TestServer + TestClient, and the official SDKs)."""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest

from relay_batches.services.upstream_sim import anthropic_batches, openai_files
from relay_batches.services.upstream_sim.config import SimConfig
from tests.unit.test_upstream_sim import Client, MakeClient, make_client

__all__ = ["make_client"]  # the simulator fixture of the realtime tests, shared

CHAT = "/v1/chat/completions"
HEADERS = {"x-api-key": "sk-sim", "anthropic-version": "2023-06-01"}


class FakeClock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def client(make_client: MakeClient) -> Client:
    """A simulator with default settings (batches end at their first poll)."""
    return await make_client()


def chat_body(text: str, **extra: Any) -> dict[str, Any]:
    """A chat completions body with one user message."""
    return {"model": "m-1", "messages": [{"role": "user", "content": text}], **extra}


def line(custom_id: str, text: str, **extra: Any) -> dict[str, Any]:
    """One batch input line."""
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": chat_body(text, **extra)}


def jsonl(items: list[dict[str, Any]]) -> bytes:
    """Lines of JSON, each ended by a newline."""
    return b"".join(orjson.dumps(item) + b"\n" for item in items)


async def upload(client: Client, content: bytes, purpose: str = "batch") -> aiohttp.ClientResponse:
    """POST /v1/files with a multipart form."""
    form = aiohttp.FormData()
    form.add_field("purpose", purpose)
    form.add_field("file", io.BytesIO(content), filename="input.jsonl")
    return await client.post("/v1/files", data=form, headers={"Authorization": "Bearer sk"})


async def submit(client: Client, items: list[dict[str, Any]] | bytes) -> dict[str, Any]:
    """Upload an input file and create a batch of it; the create answer."""
    response = await upload(client, items if isinstance(items, bytes) else jsonl(items))
    assert response.status == 200
    file_id = (await response.json())["id"]
    body = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}
    response = await client.post("/v1/batches", json=body)
    assert response.status == 200, await response.text()
    created: dict[str, Any] = await response.json()
    return created


async def get_json(client: Client, path: str, **kwargs: Any) -> tuple[int, Any]:
    """GET ``path``: its status and JSON body."""
    async with client.get(path, **kwargs) as response:
        return response.status, await response.json()


async def poll(client: Client, batch_id: str) -> dict[str, Any]:
    """GET /v1/batches/{id}."""
    status, batch = await get_json(client, f"/v1/batches/{batch_id}")
    assert status == 200
    return dict(batch)


async def file_lines(client: Client, file_id: str) -> list[dict[str, Any]]:
    """The JSONL content of a file, checked against the file object's size."""
    _, meta = await get_json(client, f"/v1/files/{file_id}")
    async with client.get(f"/v1/files/{file_id}/content") as response:
        assert response.status == 200
        content = await response.read()
    assert meta["bytes"] == len(content)
    return [orjson.loads(raw) for raw in content.splitlines()]


async def realtime(client: Client, path: str, body: dict[str, Any], **kwargs: Any) -> Any:
    """The status and JSON answer of a realtime call."""
    async with client.post(path, json=body, **kwargs) as response:
        return response.status, await response.json()


def without_ids(payload: dict[str, Any]) -> dict[str, Any]:
    """A reply without what differs between two answers to the same body."""
    return {key: value for key, value in payload.items() if key not in ("id", "created")}


# --- OpenAI ---------------------------------------------------------------------------


async def test_openai_batch_answers_every_line_as_the_realtime_call_would(client: Client) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    items = [
        line("plain", "hello"),
        line("tool", "find it [sim:tool-call]", tools=tools),
        line("padded", "pad [sim:reply-bytes=300]"),
        line("busy", "no [sim:status=503]"),
        line("broken", "x", messages=[]),
        line("inside", "fails in the batch [sim:batch-error]"),
    ]
    created = await submit(client, items)
    assert created["status"] == "validating"
    assert created["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert created["id"].startswith("batch_") and created["object"] == "batch"
    done = await poll(client, created["id"])
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 6, "completed": 3, "failed": 3}
    assert all(done[key] is not None for key in ("in_progress_at", "finalizing_at", "completed_at"))
    assert done["failed_at"] is None and done["errors"] is None and done["model"] == "m-1"
    output = await file_lines(client, done["output_file_id"])
    errors = await file_lines(client, done["error_file_id"])
    assert [row["custom_id"] for row in output] == ["padded", "tool", "plain"]  # reversed
    assert [row["custom_id"] for row in errors] == ["inside", "broken", "busy"]
    for row in output + errors[1:]:
        assert row["id"].startswith("batch_req_") and row["error"] is None
        item = next(i for i in items if i["custom_id"] == row["custom_id"])
        status, answer = await realtime(client, CHAT, item["body"])
        assert row["response"]["status_code"] == status
        if status == 200:
            assert without_ids(row["response"]["body"]) == without_ids(answer)
        else:
            assert row["response"]["body"] == answer
    # [sim:batch-error] fails only inside the batch; its realtime call answers normally
    assert (await realtime(client, CHAT, items[-1]["body"]))[0] == 200
    assert errors[0]["response"]["status_code"] == 500
    inside = errors[0]["response"]["body"]["error"]
    assert inside["type"] == "server_error" and "[sim:batch-error]" in inside["message"]
    assert len(output[0]["response"]["body"]["choices"][0]["message"]["content"]) == 300
    assert output == await file_lines(client, done["output_file_id"])  # the same each read


async def test_openai_batch_expire_ends_the_batch_expired_with_partial_output(
    client: Client,
) -> None:
    items = [line("a", "one"), line("late", "too slow [sim:batch-expire]"), line("b", "two")]
    done = await poll(client, (await submit(client, items))["id"])
    assert done["status"] == "expired" and done["expired_at"] is not None
    assert done["completed_at"] is None
    assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert [row["custom_id"] for row in await file_lines(client, done["output_file_id"])] == [
        "b",
        "a",
    ]
    [expired] = await file_lines(client, done["error_file_id"])
    assert expired["custom_id"] == "late" and expired["response"] is None
    assert expired["error"]["code"] == "batch_expired"
    for marker in ("[sim:batch-expire]", "[sim:batch-fail]"):  # realtime ignores them
        status, answer = await realtime(client, CHAT, chat_body(f"hi {marker}"))
        assert status == 200 and answer["choices"][0]["message"]["content"] == f"echo: hi {marker}"


async def test_openai_batch_fail_fails_the_whole_batch_naming_the_line(client: Client) -> None:
    items = [line("a", "one"), line("b", "all of it [sim:batch-fail]")]
    done = await poll(client, (await submit(client, items))["id"])
    assert done["status"] == "failed" and done["failed_at"] is not None
    assert done["output_file_id"] is None and done["error_file_id"] is None
    assert done["in_progress_at"] is None
    [error] = done["errors"]["data"]
    assert done["errors"]["object"] == "list"
    assert (error["code"], error["line"]) == ("batch_failed", 2)


def _too_many() -> bytes:
    return jsonl([line(f"r{i}", "x") for i in range(openai_files.MAX_LINES + 1)])


@pytest.mark.parametrize(
    ("content", "code", "line_no"),
    [
        (b'{"custom_id": "a"\n', "invalid_json_line", 1),
        (jsonl([{**line("a", "x"), "custom_id": None}]), "missing_required_parameter", 1),
        (jsonl([line("a", "x"), line("a", "y")]), "duplicate_custom_id", 2),
        (jsonl([line("a", "x"), {**line("b", "y"), "url": "/v1/embeddings"}]), "url_mismatch", 2),
        (jsonl([{**line("a", "x"), "method": "GET"}]), "invalid_method", 1),
        (b"", "empty_file", None),
        (_too_many(), "too_many_tasks", None),
    ],
)
async def test_openai_invalid_input_fails_the_batch(
    client: Client, content: bytes, code: str, line_no: int | None
) -> None:
    done = await poll(client, (await submit(client, content))["id"])
    assert done["status"] == "failed"
    assert done["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert [(e["code"], e["line"]) for e in done["errors"]["data"]] == [(code, line_no)]


@pytest.mark.parametrize(
    ("changes", "status", "param"),
    [
        ({"input_file_id": "file-missing"}, 404, "input_file_id"),
        ({"endpoint": "/v1/images/generations"}, 400, "endpoint"),
        ({"completion_window": "1h"}, 400, "completion_window"),
        ({"metadata": {"k": 1}}, 400, "metadata"),
    ],
)
async def test_openai_create_errors(
    client: Client, changes: dict[str, Any], status: int, param: str
) -> None:
    file_id = (await (await upload(client, jsonl([line("a", "x")]))).json())["id"]
    body = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h", **changes}
    answer = await realtime(client, "/v1/batches", body)
    assert answer[0] == status
    assert answer[1]["error"]["param"] == param
    assert answer[1]["error"]["type"] == "invalid_request_error"


async def test_openai_files_retrieve_delete_and_their_errors(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    content = jsonl([line("a", "x")])
    stored = await (await upload(client, content)).json()
    assert stored["id"].startswith("file-")
    assert (stored["object"], stored["purpose"], stored["bytes"]) == ("file", "batch", len(content))
    assert stored["filename"] == "input.jsonl"
    async with client.get(f"/v1/files/{stored['id']}/content") as response:
        assert await response.read() == content
    created = await realtime(
        client,
        "/v1/batches",
        {"input_file_id": stored["id"], "endpoint": CHAT, "completion_window": "24h"},
    )
    async with client.delete(f"/v1/files/{stored['id']}") as response:
        assert await response.json() == {"id": stored["id"], "object": "file", "deleted": True}
    status, missing = await get_json(client, f"/v1/files/{stored['id']}")
    assert status == 404 and missing["error"]["type"] == "invalid_request_error"
    # the batch keeps its input after the file is deleted
    assert (await poll(client, created[1]["id"]))["status"] == "completed"
    assert (await upload(client, content, purpose="fine-tune")).status == 400
    monkeypatch.setattr(openai_files, "MAX_FILE_BYTES", 1000)
    response = await upload(client, b"x" * 1001)
    assert response.status == 413
    assert (await response.json())["error"]["param"] == "file"


async def test_openai_cancel_then_cancelled_at_the_next_poll(client: Client) -> None:
    created = await submit(client, [line("a", "x"), line("b", "y")])
    async with client.post(f"/v1/batches/{created['id']}/cancel") as response:
        cancelling = await response.json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    done = await poll(client, created["id"])
    assert done["status"] == "cancelled" and done["cancelled_at"] is not None
    assert done["output_file_id"] is None and done["error_file_id"] is None
    assert done["request_counts"]["completed"] == 0
    async with client.post(f"/v1/batches/{created['id']}/cancel") as response:
        assert response.status == 409
    async with client.post("/v1/batches/batch_nope/cancel") as response:
        assert response.status == 404


async def test_openai_list_is_newest_first_with_a_cursor(client: Client) -> None:
    ids = [(await submit(client, [line(f"r{i}", "x")]))["id"] for i in range(3)]
    status, first = await get_json(client, "/v1/batches?limit=2")
    assert status == 200 and first["object"] == "list"
    assert [b["id"] for b in first["data"]] == [ids[2], ids[1]]
    assert (first["first_id"], first["last_id"], first["has_more"]) == (ids[2], ids[1], True)
    assert all(b["status"] == "completed" for b in first["data"])
    _, rest = await get_json(client, f"/v1/batches?limit=2&after={first['last_id']}")
    assert [b["id"] for b in rest["data"]] == [ids[0]] and rest["has_more"] is False
    assert (await get_json(client, "/v1/batches?limit=0"))[0] == 400


async def test_openai_delay_ends_the_batch_at_the_first_poll_after_it(
    make_client: MakeClient,
) -> None:
    clock = FakeClock()
    client = await make_client(SimConfig(batch_delay_s=60), clock=clock)
    created = await submit(client, [line("a", "x")])
    assert (await poll(client, created["id"]))["status"] == "in_progress"
    clock.now += 59
    running = await poll(client, created["id"])
    assert running["status"] == "in_progress" and running["output_file_id"] is None
    clock.now += 1
    assert (await poll(client, created["id"]))["status"] == "completed"


async def test_a_big_batch_leaves_the_event_loop_free(client: Client) -> None:
    count = openai_files.MAX_LINES
    created = await submit(client, [line(f"r{i}", f"row {i}") for i in range(count)])
    polled = asyncio.create_task(poll(client, created["id"]))
    slowest = 0.0
    while not polled.done():
        started = time.monotonic()
        assert (await get_json(client, "/healthz"))[0] == 200
        slowest = max(slowest, time.monotonic() - started)
        await asyncio.sleep(0.05)
    done = await polled
    assert done["request_counts"] == {"total": count, "completed": count, "failed": 0}
    assert slowest < 1.0
    assert len(await file_lines(client, done["output_file_id"])) == count


# --- Anthropic ------------------------------------------------------------------------


def request(custom_id: str, text: str, **params: Any) -> dict[str, Any]:
    """One Message Batches request."""
    body = {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": text}]}
    return {"custom_id": custom_id, "params": {**body, **params}}


async def create_message_batch(client: Client, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """POST /v1/messages/batches; the batch."""
    status, batch = await realtime(
        client, "/v1/messages/batches", {"requests": requests}, headers=HEADERS
    )
    assert status == 200, batch
    return dict(batch)


async def message_batch(client: Client, batch_id: str) -> dict[str, Any]:
    """GET /v1/messages/batches/{id}."""
    status, batch = await get_json(client, f"/v1/messages/batches/{batch_id}", headers=HEADERS)
    assert status == 200
    return dict(batch)


async def results(client: Client, batch_id: str) -> list[dict[str, Any]]:
    """The result lines of an ended batch."""
    async with client.get(f"/v1/messages/batches/{batch_id}/results", headers=HEADERS) as answer:
        assert answer.status == 200
        return [orjson.loads(raw) for raw in (await answer.read()).splitlines()]


async def test_anthropic_batch_results_match_the_realtime_answers(client: Client) -> None:
    requests = [
        request("ok", "hello"),
        request("bad", "no max tokens", max_tokens=None),
        request("busy", "[sim:status=529]"),
        request("inside", "x [sim:batch-error]"),
        request("late", "y [sim:batch-expire]"),
    ]
    created = await create_message_batch(client, requests)
    assert created["id"].startswith("msgbatch_") and created["type"] == "message_batch"
    assert created["processing_status"] == "in_progress" and created["results_url"] is None
    assert created["request_counts"]["processing"] == 5
    done = await message_batch(client, created["id"])
    assert done["processing_status"] == "ended" and done["ended_at"] is not None
    assert done["request_counts"] == {
        "processing": 0,
        "succeeded": 1,
        "errored": 3,
        "canceled": 0,
        "expired": 1,
    }
    assert done["results_url"] == str(
        client.make_url(f"/v1/messages/batches/{created['id']}/results")
    )
    lines = await results(client, created["id"])
    assert [item["custom_id"] for item in lines] == ["late", "inside", "busy", "bad", "ok"]
    by_id = {item["custom_id"]: item["result"] for item in lines}
    assert by_id["late"] == {"type": "expired"}
    assert by_id["inside"]["error"]["error"]["type"] == "api_error"
    for custom_id in ("ok", "bad", "busy"):
        params = next(r["params"] for r in requests if r["custom_id"] == custom_id)
        status, answer = await realtime(client, "/v1/messages", params, headers=HEADERS)
        if status == 200:
            assert by_id[custom_id]["type"] == "succeeded"
            assert without_ids(by_id[custom_id]["message"]) == without_ids(answer)
        else:
            assert by_id[custom_id] == {"type": "errored", "error": answer}
    status, realtime_answer = await realtime(
        client, "/v1/messages", requests[3]["params"], headers=HEADERS
    )
    assert status == 200 and realtime_answer["content"][0]["text"].startswith("echo: x")


async def test_anthropic_cancel_ends_with_every_request_canceled(client: Client) -> None:
    created = await create_message_batch(client, [request("a", "x"), request("b", "y")])
    path = f"/v1/messages/batches/{created['id']}"
    async with client.post(path + "/cancel", headers=HEADERS) as response:
        canceling = await response.json()
    assert canceling["processing_status"] == "canceling"
    assert canceling["cancel_initiated_at"] is not None
    done = await message_batch(client, created["id"])
    assert done["processing_status"] == "ended" and done["request_counts"]["canceled"] == 2
    assert [item["result"] for item in await results(client, created["id"])] == [
        {"type": "canceled"},
        {"type": "canceled"},
    ]
    async with client.post(path + "/cancel", headers=HEADERS) as response:
        assert response.status == 400


async def test_anthropic_results_and_delete_wait_for_the_end(make_client: MakeClient) -> None:
    clock = FakeClock()
    client = await make_client(SimConfig(batch_delay_s=30), clock=clock)
    created = await create_message_batch(client, [request("a", "x")])
    path = f"/v1/messages/batches/{created['id']}"
    assert (await message_batch(client, created["id"]))["processing_status"] == "in_progress"
    status, early = await get_json(client, path + "/results", headers=HEADERS)
    assert status == 400 and early["error"]["type"] == "invalid_request_error"
    async with client.delete(path, headers=HEADERS) as response:
        assert response.status == 400
    clock.now += 30
    assert (await message_batch(client, created["id"]))["processing_status"] == "ended"
    async with client.delete(path, headers=HEADERS) as response:
        assert await response.json() == {"id": created["id"], "type": "message_batch_deleted"}
    assert (await get_json(client, path, headers=HEADERS))[0] == 404


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"requests": []}, "non-empty"),
        ({"requests": [request("has space", "x")]}, "custom_id"),
        ({"requests": [request("a" * 65, "x")]}, "custom_id"),
        ({"requests": [request("a", "x"), request("a", "y")]}, "not unique"),
        ({"requests": [{"custom_id": "a", "params": "x"}]}, "params"),
    ],
)
async def test_anthropic_create_validation(
    client: Client, body: dict[str, Any], fragment: str
) -> None:
    status, answer = await realtime(client, "/v1/messages/batches", body, headers=HEADERS)
    assert status == 400
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert fragment in answer["error"]["message"]


async def test_anthropic_limits_and_headers(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"requests": [request("a", "x"), request("b", "y")]}
    status, answer = await realtime(client, "/v1/messages/batches", body)
    assert status == 401 and answer["error"]["type"] == "authentication_error"
    no_version = {"x-api-key": "k"}
    assert (await realtime(client, "/v1/messages/batches", body, headers=no_version))[0] == 400
    monkeypatch.setattr(anthropic_batches, "MAX_REQUESTS", 1)
    assert (await realtime(client, "/v1/messages/batches", body, headers=HEADERS))[0] == 400
    monkeypatch.setattr(anthropic_batches, "MAX_BODY_BYTES", 100)
    status, answer = await realtime(client, "/v1/messages/batches", body, headers=HEADERS)
    assert status == 413 and answer["error"]["type"] == "request_too_large"


async def test_anthropic_list_pages_both_ways(client: Client) -> None:
    ids = [(await create_message_batch(client, [request(f"r{i}", "x")]))["id"] for i in range(3)]
    status, first = await get_json(client, "/v1/messages/batches?limit=2", headers=HEADERS)
    assert status == 200 and [b["id"] for b in first["data"]] == [ids[2], ids[1]]
    assert (first["first_id"], first["last_id"], first["has_more"]) == (ids[2], ids[1], True)
    _, after = await get_json(
        client, f"/v1/messages/batches?limit=2&after_id={ids[1]}", headers=HEADERS
    )
    assert [b["id"] for b in after["data"]] == [ids[0]] and after["has_more"] is False
    _, before = await get_json(
        client, f"/v1/messages/batches?limit=1&before_id={ids[0]}", headers=HEADERS
    )
    assert [b["id"] for b in before["data"]] == [ids[1]] and before["has_more"] is True


# --- both -----------------------------------------------------------------------------


async def test_stats_count_batches_rows_and_repeats_and_reset_clears(client: Client) -> None:
    await submit(client, [line("a", "x"), line("b", "y")])
    await create_message_batch(client, [request("b", "x"), request("c", "y")])
    await submit(client, [line("c", "x"), line("d", "y"), line("a", "z")])
    status, stats = await get_json(client, "/stats")
    assert status == 200
    assert (stats["batches_created"], stats["batch_rows"], stats["batch_rows_repeated"]) == (
        3,
        7,
        3,
    )
    assert stats["calls"] == 0  # batched requests are not realtime calls
    listed = (await get_json(client, "/v1/batches"))[1]["data"]
    async with client.post("/reset") as response:
        assert response.status == 200
    _, stats = await get_json(client, "/stats")
    assert (stats["batches_created"], stats["batch_rows"], stats["batch_rows_repeated"]) == (
        0,
        0,
        0,
    )
    assert (await get_json(client, f"/v1/batches/{listed[0]['id']}"))[0] == 404
    await submit(client, [line("a", "x")])
    assert (await get_json(client, "/stats"))[1]["batch_rows_repeated"] == 0


class PauseGate:
    """A stand-in for asyncio.sleep that records the durations and holds those of
    ``held`` seconds until :attr:`opened` is set."""

    def __init__(self, held: float) -> None:
        self.held = held
        self.calls: list[float] = []
        self.opened = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        if seconds == self.held:
            await self.opened.wait()


async def read_lines(response: aiohttp.ClientResponse, count: int) -> bytes:
    """What ``response`` streams until ``count`` whole lines arrived."""
    got = b""
    while got.count(b"\n") < count:
        got += await asyncio.wait_for(response.content.readany(), 10)
    return got


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_inputs_are_held_and_results_downloads_stop_halfway(
    make_client: MakeClient, provider: str
) -> None:
    gate = PauseGate(held=9)
    config = SimConfig(batch_input_delay_s=7, batch_results_pause_s=9)
    client = await make_client(config, sleep=gate)
    if provider == "openai":
        created = await submit(client, [line(f"r{i}", f"row {i}") for i in range(10)])
        url = f"/v1/files/{(await poll(client, created['id']))['output_file_id']}/content"
        headers: dict[str, str] = {}
    else:
        created = await create_message_batch(client, [request(f"r{i}", "x") for i in range(10)])
        assert (await message_batch(client, created["id"]))["processing_status"] == "ended"
        url, headers = f"/v1/messages/batches/{created['id']}/results", HEADERS
    assert gate.calls == [7]  # the input waited before it was answered
    async with client.get(url, headers=headers) as response:
        assert response.status == 200
        first = await read_lines(response, 5)
        assert gate.calls == [7, 9] and first.count(b"\n") == 5  # half out, then held
        gate.opened.set()
        rest = await response.read()
    ids = [orjson.loads(raw)["custom_id"] for raw in (first + rest).splitlines()]
    assert ids == [f"r{i}" for i in reversed(range(10))]


async def test_the_official_sdks_read_the_simulated_batches(client: Client) -> None:
    base = str(client.make_url("")).rstrip("/")
    oai = openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-sim", max_retries=0)
    claude = anthropic.AsyncAnthropic(base_url=base, api_key="sk-sim", max_retries=0)
    try:
        uploaded = await oai.files.create(
            file=("in.jsonl", jsonl([line("a", "hi"), line("b", "[sim:status=500]")])),
            purpose="batch",
        )
        created = await oai.batches.create(
            input_file_id=uploaded.id,
            endpoint=CHAT,
            completion_window="24h",
            metadata={"run": "sdk"},
        )
        assert created.status == "validating" and created.metadata == {"run": "sdk"}
        done = await oai.batches.retrieve(created.id)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
        assert done.output_file_id is not None and done.error_file_id is not None
        output = await oai.files.content(done.output_file_id)
        [row] = [orjson.loads(raw) for raw in output.content.splitlines()]
        assert row["response"]["body"]["choices"][0]["message"]["content"] == "echo: hi"
        page = await oai.batches.list(limit=5)
        assert [b.id for b in page.data] == [created.id]

        batch = await claude.messages.batches.create(
            requests=[
                {
                    "custom_id": "a",
                    "params": {
                        "model": "claude-x",
                        "max_tokens": 8,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                }
            ]
        )
        assert batch.processing_status == "in_progress"
        ended = await claude.messages.batches.retrieve(batch.id)
        assert ended.processing_status == "ended" and ended.request_counts.succeeded == 1
        got = [item async for item in await claude.messages.batches.results(batch.id)]
        assert [item.custom_id for item in got] == ["a"]
        assert got[0].result.type == "succeeded"
        assert got[0].result.message.content[0].text == "echo: hi"  # type: ignore[union-attr]
    finally:
        await oai.close()
        await claude.close()
