"""The OpenAI surface's ledger parts over real HTTP against the ingest-api on the real
Postgres and RabbitMQ: files stored as parts and rows, the row limit, and output files
rendered from outcomes in byte-bounded pages. No dispatcher runs here: outcomes are
recorded as the aggregator would."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
from aiohttp.test_utils import TestServer
from openai.types.chat import ChatCompletion

from relay_batches.bus.client import Bus
from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.files import PART_BYTES, FileStore
from relay_batches.ledger.jobs import JobStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.ledger.pool import create_pool
from relay_batches.messages import RowOutcome
from relay_batches.model import Job
from relay_batches.router.aliases import AliasTable
from relay_batches.services.ingest_api.deps import ApiDeps
from relay_batches.services.ingest_api.surfaces.openai import files as openai_files
from relay_batches.services.ingest_api.surfaces.openai import output as openai_output
from relay_batches.services.relay_cli import admin
from tests.helpers.api import TEST_LIMITS, TEST_MAX_BODY, start_api
from tests.helpers.support import ApiClient, Isolation

MODEL = "gpt-4o-mini"


def line(custom_id: str, messages: list[dict[str, Any]]) -> bytes:
    """One OpenAI batch line with its newline."""
    body = {"model": MODEL, "messages": messages}
    item = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return orjson.dumps(item) + b"\n"


@pytest.fixture
async def small_pages(
    pool: asyncpg.Pool, bus: Bus, aliases: AliasTable
) -> AsyncIterator[TestServer]:
    """The API on a ledger whose pages hold at most 300 bytes of outcomes."""
    server = await start_api(pool, bus, aliases, JobStore(pool, page_bytes=300))
    yield server
    await server.close()


async def client_of(iso: Isolation, server: TestServer, http: aiohttp.ClientSession) -> ApiClient:
    """A client of a fresh workspace."""
    created = await admin.create_key(iso.database_url, f"openai-{new_id()[:12]}")
    return ApiClient(str(server.make_url("")).rstrip("/"), created.key, http)


async def upload(client: ApiClient, name: str, data: bytes) -> dict[str, Any]:
    """``POST /openai/v1/files``; insists on 200."""
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", io.BytesIO(data), filename=name, content_type="application/jsonl")
    status, body = await client.request("POST", "/openai/v1/files", data=form)
    assert status == 200, body
    return dict(body)


async def create_batch(client: ApiClient, file_id: str) -> dict[str, Any]:
    """``POST /openai/v1/batches``; insists on 200."""
    status, body = await client.request(
        "POST",
        "/openai/v1/batches",
        json={
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "2h",
        },
    )
    assert status == 200, body
    return dict(body)


async def content(client: ApiClient, http: aiohttp.ClientSession, file_id: str) -> bytes:
    """A file's content and a check that its Content-Length is exact."""
    headers = {"Authorization": f"Bearer {client.key}"}
    url = f"{client.base_url}/openai/v1/files/{file_id}/content"
    async with http.get(url, headers=headers) as response:
        assert response.status == 200
        data = await response.read()
        assert response.content_length == len(data)
        return data


async def test_a_file_of_several_parts_round_trips_byte_for_byte(
    iso: Isolation,
    api_server: TestServer,
    http: aiohttp.ClientSession,
    pool: asyncpg.Pool,
) -> None:
    client = await client_of(iso, api_server, http)
    turns = [{"role": "user", "content": "x" * 1000} for _ in range(10)]
    data = b"\xef\xbb\xbf" + b"".join(line(f"r{i}", turns) for i in range(TEST_LIMITS.max_rows))
    data = data.replace(b"\n", b"\r\n", 1) + b"\n\n"  # a CRLF line and trailing blank lines
    assert len(data) > PART_BYTES

    stored = await upload(client, "big.jsonl", data)

    assert stored["bytes"] == len(data)
    assert await content(client, http, stored["id"]) == data
    hex_id = stored["id"].removeprefix("file-")
    parts = await pool.fetchval("SELECT count(*) FROM file_parts WHERE file_id = $1", hex_id)
    rows = await pool.fetch(
        "SELECT row_index, custom_id FROM batch_rows WHERE batch_id = $1 ORDER BY row_index",
        hex_id,
    )
    assert parts == -(-len(data) // PART_BYTES)
    assert [(r[0], r[1]) for r in rows] == [(i, f"r{i}") for i in range(TEST_LIMITS.max_rows)]
    batch = await create_batch(client, stored["id"])
    assert (batch["status"], batch["request_counts"]["total"]) == ("in_progress", 50)
    job_rows = await pool.fetchval(
        "SELECT rows_batch_id FROM batches WHERE id = $1", batch["id"].removeprefix("batch_")
    )
    assert job_rows == hex_id  # run in place: nothing copied


async def test_a_file_over_the_row_limit_gives_a_failed_batch_and_keeps_no_rows(
    iso: Isolation,
    api_server: TestServer,
    http: aiohttp.ClientSession,
    pool: asyncpg.Pool,
) -> None:
    client = await client_of(iso, api_server, http)
    one = [{"role": "user", "content": "hi"}]
    data = b"".join(line(f"r{i}", one) for i in range(TEST_LIMITS.max_rows + 1))

    stored = await upload(client, "many.jsonl", data)
    batch = await create_batch(client, stored["id"])

    assert batch["status"] == "failed"
    assert batch["errors"]["data"] == [
        {
            "code": "too_many_tasks",
            "message": f"the file holds more than {TEST_LIMITS.max_rows} requests",
            "param": None,
            "line": TEST_LIMITS.max_rows + 1,
        }
    ]
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    native = await pool.fetchrow(
        "SELECT status, total, completed, failed, error FROM batches WHERE id = $1",
        batch["id"].removeprefix("batch_"),
    )
    assert tuple(native) == ("failed", 1, 0, 1, "input file failed validation")
    hex_id = stored["id"].removeprefix("file-")
    assert await pool.fetchval("SELECT count(*) FROM batch_rows WHERE batch_id = $1", hex_id) == 0
    assert await content(client, http, stored["id"]) == data  # the file itself is kept


async def test_a_line_over_the_row_limit_is_its_error_and_no_row_is_kept(
    iso: Isolation,
    api_server: TestServer,
    http: aiohttp.ClientSession,
    pool: asyncpg.Pool,
) -> None:
    client = await client_of(iso, api_server, http)
    many = [{"role": "user", "content": "x" * 1000} for _ in range(200)]  # about 200 KiB
    data = line("a", [{"role": "user", "content": "hi"}]) + line("b", many)

    stored = await upload(client, "long.jsonl", data)
    batch = await create_batch(client, stored["id"])

    assert batch["status"] == "failed"
    assert batch["errors"]["data"] == [
        {
            "code": "invalid_request",
            "message": f"the line is longer than {TEST_LIMITS.max_row_bytes} bytes",
            "param": None,
            "line": 2,
        }
    ]
    hex_id = stored["id"].removeprefix("file-")
    assert await pool.fetchval("SELECT count(*) FROM batch_rows WHERE batch_id = $1", hex_id) == 0


async def test_a_file_over_the_body_limit_is_a_413_naming_it(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    client = await client_of(iso, api_server, http)
    one = [{"role": "user", "content": "x" * 900}]
    data = b"".join(line(f"r{i}", one) for i in range(1200))  # over 1 MiB, RELAY_MAX_BODY_BYTES
    assert len(data) > TEST_MAX_BODY
    before = await pool.fetchval("SELECT count(*) FROM files")

    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", io.BytesIO(data), filename="big.jsonl", content_type="application/jsonl")
    status, body = await client.request("POST", "/openai/v1/files", data=form)

    assert status == 413
    assert body["error"]["message"] == f"request body exceeds {TEST_MAX_BODY} bytes"
    assert await pool.fetchval("SELECT count(*) FROM files") == before


async def test_output_files_render_across_bounded_pages_with_exact_sizes(
    iso: Isolation,
    small_pages: TestServer,
    http: aiohttp.ClientSession,
    pool: asyncpg.Pool,
) -> None:
    client = await client_of(iso, small_pages, http)
    data = b"".join(line(f"r{i}", [{"role": "user", "content": f"q{i}"}]) for i in range(30))
    stored = await upload(client, "out.jsonl", data)
    batch = await create_batch(client, stored["id"])
    job_id = batch["id"].removeprefix("batch_")
    await DispatchStore(pool).claim_queued(f"openai-{job_id}", 100, 30)
    await OutcomeStore(pool).record(
        [
            RowOutcome(job_id, i, f"answer {i} " + "y" * 40, None, 1, prompt_tokens=2)
            if i % 3
            else RowOutcome(job_id, i, None, "upstream_error: sim: HTTP 400", 1)
            for i in range(30)
        ]
    )

    status, done = await client.request("GET", f"/openai/v1/batches/{batch['id']}")

    assert status == 200 and done["status"] == "completed"
    assert done["request_counts"] == {"total": 30, "completed": 20, "failed": 10}
    output = await content(client, http, done["output_file_id"])
    errors = await content(client, http, done["error_file_id"])
    ok = [orjson.loads(x) for x in output.splitlines()]
    bad = [orjson.loads(x) for x in errors.splitlines()]
    assert [o["custom_id"] for o in ok] == [f"r{i}" for i in range(30) if i % 3]
    assert [o["response"]["body"]["choices"][0]["message"]["content"] for o in ok] == [
        f"answer {i} " + "y" * 40 for i in range(30) if i % 3
    ]
    assert [(b["custom_id"], b["error"], b["response"]["status_code"]) for b in bad] == [
        (f"r{i}", None, 400) for i in range(0, 30, 3)
    ]
    assert {orjson.dumps(b["response"]["body"]) for b in bad} == {
        orjson.dumps(
            {
                "error": {
                    "message": "upstream_error: sim: HTTP 400",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "upstream_error",
                }
            }
        )
    }
    for file_id, body in ((done["output_file_id"], output), (done["error_file_id"], errors)):
        status, meta = await client.request("GET", f"/openai/v1/files/{file_id}")
        assert (status, meta["bytes"], meta["purpose"]) == (200, len(body), "batch_output")
    status, listed = await client.request("GET", "/openai/v1/files?order=asc")
    listed_ids = [f["id"] for f in listed["data"]]
    assert listed_ids[0] == stored["id"]  # the two output files were created together
    assert sorted(listed_ids[1:]) == sorted([done["output_file_id"], done["error_file_id"]])


async def test_bad_stored_tool_calls_give_an_output_file_of_valid_chat_completions(
    iso: Isolation,
    api_server: TestServer,
    http: aiohttp.ClientSession,
    pool: asyncpg.Pool,
) -> None:
    """Rows recorded before replies were checked may hold any tool calls: the output
    file still renders every line, each a chat completion the SDK accepts strictly."""
    client = await client_of(iso, api_server, http)
    stored_calls = ["[1]", "not json", '{"id":"call_1"}', '[{"function":"x"}]']
    data = b"".join(line(f"r{i}", [{"role": "user", "content": "q"}]) for i in range(4))
    batch = await create_batch(client, (await upload(client, "tc.jsonl", data))["id"])
    job_id = batch["id"].removeprefix("batch_")
    await DispatchStore(pool).claim_queued(f"openai-{job_id}", 100, 4)
    await OutcomeStore(pool).record(
        [
            RowOutcome(job_id, i, "", None, 1, tool_calls=text, finish_reason="tool_calls")
            for i, text in enumerate(stored_calls)
        ]
    )

    status, done = await client.request("GET", f"/openai/v1/batches/{batch['id']}")
    assert (status, done["status"]) == (200, "completed")
    output = await content(client, http, done["output_file_id"])

    bodies = [
        ChatCompletion.model_validate(orjson.loads(x)["response"]["body"], strict=True)
        for x in output.splitlines()
    ]
    assert [(b.choices[0].message.content, b.choices[0].message.tool_calls) for b in bodies] == [
        ("", None)
    ] * 4


async def test_an_idempotency_key_replays_the_batch_it_created(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession
) -> None:
    client = await client_of(iso, api_server, http)
    stored = await upload(client, "i.jsonl", line("a", [{"role": "user", "content": "x"}]))
    body = {"input_file_id": stored["id"], "endpoint": "/v1/chat/completions"}
    headers = {"Idempotency-Key": "retry-1"}

    first = await client.request(
        "POST", "/openai/v1/batches", json={**body, "completion_window": "24h"}, headers=headers
    )
    again = await client.request(
        "POST", "/openai/v1/batches", json={**body, "completion_window": "24h"}, headers=headers
    )
    other = await client.request(
        "POST", "/openai/v1/batches", json={**body, "completion_window": "1h"}, headers=headers
    )

    assert first[0] == again[0] == 200
    assert again[1]["id"] == first[1]["id"] and again[1]["object"] == "batch"
    assert other[0] == 409
    assert other[1]["error"]["param"] == "Idempotency-Key"
    status, page = await client.request("GET", "/openai/v1/batches")
    assert (status, [b["id"] for b in page["data"]]) == (200, [first[1]["id"]])


async def test_deleting_an_input_file_keeps_the_rows_its_batch_runs(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    client = await client_of(iso, api_server, http)
    one = [{"role": "user", "content": "x"}]
    used = await upload(client, "used.jsonl", line("a", one) + line("b", one))
    unused = await upload(client, "unused.jsonl", line("a", one))
    await create_batch(client, used["id"])

    for stored in (used, unused):
        status, deleted = await client.request("DELETE", f"/openai/v1/files/{stored['id']}")
        assert (status, deleted) == (200, {"id": stored["id"], "object": "file", "deleted": True})

    async def counts(file_id: str) -> tuple[int, int]:
        hex_id = file_id.removeprefix("file-")
        rows = await pool.fetchval("SELECT count(*) FROM batch_rows WHERE batch_id = $1", hex_id)
        parts = await pool.fetchval("SELECT count(*) FROM file_parts WHERE file_id = $1", hex_id)
        return rows, parts

    assert await counts(used["id"]) == (2, 0)
    assert await counts(unused["id"]) == (0, 0)
    for stored in (used, unused):
        assert (await client.request("GET", f"/openai/v1/files/{stored['id']}"))[0] == 404
        assert (await client.request("DELETE", f"/openai/v1/files/{stored['id']}"))[0] == 404
    status, refused = await client.request(
        "POST",
        "/openai/v1/batches",
        json={
            "input_file_id": used["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    assert (status, refused["error"]["param"]) == (404, "input_file_id")


async def test_a_file_over_the_size_limit_is_a_413_and_nothing_is_stored(
    iso: Isolation,
    api_server: TestServer,
    http: aiohttp.ClientSession,
    pool: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(openai_files, "MAX_FILE_BYTES", 256 * 1024)
    client = await client_of(iso, api_server, http)
    one = [{"role": "user", "content": "x" * 500}]
    data = b"".join(line(f"r{i}", one) for i in range(600))  # about 370 KiB
    before = await pool.fetchval("SELECT count(*) FROM files")

    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", io.BytesIO(data), filename="big.jsonl", content_type="application/jsonl")
    status, body = await client.request("POST", "/openai/v1/files", data=form)

    assert status == 413
    assert body["error"]["message"] == f"request body exceeds {256 * 1024} bytes"
    assert body["error"]["type"] == "request_too_large" and "code" in body["error"]
    assert await pool.fetchval("SELECT count(*) FROM files") == before


async def test_upload_form_errors_name_the_field(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession
) -> None:
    client = await client_of(iso, api_server, http)
    cases = [
        ({"purpose": "fine-tune"}, "purpose"),
        ({}, "purpose"),
        ({"purpose": "batch", "expires_after[anchor]": "created_at"}, "expires_after"),
    ]
    for fields, param in cases:
        form = aiohttp.FormData()
        for name, value in fields.items():
            form.add_field(name, value)
        form.add_field("file", io.BytesIO(b"{}\n"), filename="f.jsonl", content_type="text/plain")
        status, body = await client.request("POST", "/openai/v1/files", data=form)
        assert (status, body["error"]["param"]) == (400, param), body


async def test_stalled_uploads_hold_no_connection_from_other_requests(
    iso: Isolation, bus: Bus, aliases: AliasTable, http: aiohttp.ClientSession
) -> None:
    small = await create_pool(iso.database_url, max_size=2)
    server = await start_api(small, bus, aliases, JobStore(small))
    try:
        client = await client_of(iso, server, http)
        other = await client_of(iso, server, http)
        assert server.port is not None
        stalled = [await _stalled_upload(server.port, client.key) for _ in range(4)]

        async with asyncio.timeout(1.5):  # the stalled bodies are answered 408 after 3 s
            status, listed = await other.request("GET", "/openai/v1/files")

        assert (status, listed["data"]) == (200, [])
        answers = [await reader.readline() for reader, _ in stalled]
        assert answers == [b"HTTP/1.1 408 Request Timeout\r\n"] * 4
        for _, writer in stalled:
            writer.close()
    finally:
        await server.close()
        await small.close()


async def _stalled_upload(port: int, key: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An upload whose client sends its headers and the start of its file, then nothing;
    returned once the server has taken it in (its ``100 Continue``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="s.jsonl"\r\n\r\n'
    )
    head = (
        "POST /openai/v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: multipart/form-data; boundary=b\r\n"
        "Content-Length: 10000\r\nExpect: 100-continue\r\n\r\n"
    )
    writer.write(head.encode())
    await writer.drain()
    assert await reader.readline() == b"HTTP/1.1 100 Continue\r\n"
    assert await reader.readline() == b"\r\n"
    writer.write(start + line("a", [{"role": "user", "content": "x"}]))
    await writer.drain()
    return reader, writer


async def test_concurrent_creates_with_one_key_leave_one_batch_and_one_link(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    client = await client_of(iso, api_server, http)
    stored = await upload(client, "k.jsonl", line("a", [{"role": "user", "content": "x"}]))
    body = {
        "input_file_id": stored["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    headers = {"Idempotency-Key": "race-1"}

    answers = await asyncio.gather(
        *(
            client.request("POST", "/openai/v1/batches", json=body, headers=headers)
            for _ in range(4)
        )
    )

    created = {b["id"] for status, b in answers if status == 200}
    assert len(created) == 1
    assert all(status in (200, 409) for status, _ in answers)
    hex_id = stored["id"].removeprefix("file-")
    links = await pool.fetch("SELECT batch_id FROM openai_batches WHERE input_file_id = $1", hex_id)
    jobs = await pool.fetch("SELECT id FROM batches WHERE rows_batch_id = $1", hex_id)
    assert [r[0] for r in links] == [r[0] for r in jobs] == [created.pop().removeprefix("batch_")]


async def test_concurrent_pollers_measure_each_output_file_once(
    iso: Isolation,
    small_pages: TestServer,
    http: aiohttp.ClientSession,
    pool: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = await client_of(iso, small_pages, http)
    data = b"".join(line(f"r{i}", [{"role": "user", "content": f"q{i}"}]) for i in range(20))
    batch = await create_batch(client, (await upload(client, "m.jsonl", data))["id"])
    job_id = batch["id"].removeprefix("batch_")
    await DispatchStore(pool).claim_queued(f"openai-{job_id}", 100, 20)
    await OutcomeStore(pool).record(
        [
            RowOutcome(job_id, i, f"answer {i}", None, 1)
            if i % 2
            else RowOutcome(job_id, i, None, "upstream_error: sim: HTTP 500", 1)
            for i in range(20)
        ]
    )
    renderings: list[str] = []
    original = openai_output.rendered

    def counted(deps: ApiDeps, job: Job, kind: str) -> AsyncIterator[bytes]:
        renderings.append(kind)
        return original(deps, job, kind)

    monkeypatch.setattr(openai_output, "rendered", counted)

    answers = await asyncio.gather(
        *(client.request("GET", f"/openai/v1/batches/{batch['id']}") for _ in range(6))
    )

    assert {(status, b["status"]) for status, b in answers} == {(200, "completed")}
    assert sorted(renderings) == ["error", "output"]
    status, listed = await client.request("GET", "/openai/v1/files?purpose=batch_output")
    assert (status, len(listed["data"])) == (200, 2)


async def _ended_batch(client: ApiClient, pool: asyncpg.Pool, file_id: str) -> dict[str, Any]:
    """A batch over ``file_id`` run to completed, its output and error files listed."""
    batch = await create_batch(client, file_id)
    job_id = batch["id"].removeprefix("batch_")
    await DispatchStore(pool).claim_queued(f"openai-{job_id}", 100, 30)
    await OutcomeStore(pool).record(
        [RowOutcome(job_id, 0, "fine", None, 1), RowOutcome(job_id, 1, None, "upstream_error", 1)]
    )
    status, done = await client.request("GET", f"/openai/v1/batches/{batch['id']}")
    assert (status, done["status"]) == (200, "completed")
    for file_id in (done["output_file_id"], done["error_file_id"]):
        assert (await client.request("GET", f"/openai/v1/files/{file_id}"))[0] == 200
    return dict(done)


async def _rows_of(pool: asyncpg.Pool, file_id: str) -> int:
    hex_id = file_id.removeprefix("file-")
    count: int = await pool.fetchval("SELECT count(*) FROM batch_rows WHERE batch_id = $1", hex_id)
    return count


@pytest.mark.parametrize("file_first", [False, True], ids=["job-first", "file-first"])
async def test_deleting_a_batch_through_anthropic_drops_its_link_and_output_files(
    iso: Isolation,
    api_server: TestServer,
    http: aiohttp.ClientSession,
    pool: asyncpg.Pool,
    file_first: bool,
) -> None:
    """The job is a normal job, deletable on the Anthropic surface: its OpenAI link and
    output/error files go with it, and its input file's rows are freed once the file is
    deleted too, in either order."""
    client = await client_of(iso, api_server, http)
    one = [{"role": "user", "content": "x"}]
    stored = await upload(client, "del.jsonl", line("a", one) + line("b", one))
    done = await _ended_batch(client, pool, stored["id"])
    job_id = done["id"].removeprefix("batch_")
    delete_file = ("DELETE", f"/openai/v1/files/{stored['id']}")
    if file_first:
        assert (await client.request(*delete_file))[0] == 200
        assert await _rows_of(pool, stored["id"]) == 2  # the batch still runs them

    status, deleted = await client.request(
        "DELETE", f"/anthropic/v1/messages/batches/msgbatch_{job_id}"
    )

    assert status == 200, deleted
    assert (
        await pool.fetchval("SELECT count(*) FROM openai_batches WHERE batch_id = $1", job_id) == 0
    )
    for file_id in (done["output_file_id"], done["error_file_id"]):
        assert (await client.request("GET", f"/openai/v1/files/{file_id}"))[0] == 404
    status, listed = await client.request("GET", "/openai/v1/files")
    assert [f["id"] for f in listed["data"]] == ([] if file_first else [stored["id"]])
    if not file_first:
        assert (await client.request(*delete_file))[0] == 200
    assert await _rows_of(pool, stored["id"]) == 0


async def test_deleting_one_job_of_an_upload_never_lets_a_replay_duplicate_the_others(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    """The upload's Idempotency-Key record names both jobs: it stays when one of them is
    deleted, so replaying the upload answers the stored list and creates nothing."""
    client = await client_of(iso, api_server, http)

    def form() -> aiohttp.FormData:
        data = aiohttp.FormData(default_to_multipart=True)
        data.add_field("model", MODEL)
        for name in ("a.csv", "b.csv"):
            data.add_field("file", b"hello\n", filename=name, content_type="text/plain")
        return data

    headers = {"Idempotency-Key": "upload-1"}
    status, first = await client.request("POST", "/v1/batches/upload", data=form(), headers=headers)
    assert status == 201, first
    gone, kept = (job["id"] for job in first["data"])
    assert (await client.request("POST", f"/v1/batches/{gone}/cancel"))[0] == 200
    assert (await client.request("DELETE", f"/anthropic/v1/messages/batches/msgbatch_{gone}"))[
        0
    ] == 200

    status, again = await client.request("POST", "/v1/batches/upload", data=form(), headers=headers)

    assert (status, [job["id"] for job in again["data"]]) == (201, [gone, kept])
    workspace = await pool.fetchval("SELECT workspace_id FROM batches WHERE id = $1", kept)
    jobs = await pool.fetch("SELECT id FROM batches WHERE workspace_id = $1", workspace)
    assert [r["id"] for r in jobs] == [kept]


async def test_deleting_a_job_frees_its_own_idempotency_key(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession
) -> None:
    """A create's record is that job alone: it goes with the job, so the key can be used
    again (and a replay never answers a job that is gone)."""
    client = await client_of(iso, api_server, http)
    body = {"model": MODEL, "requests": [{"messages": [{"role": "user", "content": "hi"}]}]}
    headers = {"Idempotency-Key": "single-1"}
    status, first = await client.request("POST", "/v1/batches", json=body, headers=headers)
    assert status == 201, first
    assert (await client.request("POST", f"/v1/batches/{first['id']}/cancel"))[0] == 200
    path = f"/anthropic/v1/messages/batches/msgbatch_{first['id']}"
    assert (await client.request("DELETE", path))[0] == 200

    status, again = await client.request("POST", "/v1/batches", json=body, headers=headers)

    assert status == 201 and again["id"] != first["id"]


class WatchedSlots(asyncio.Semaphore):
    """Long-store slots that tell when someone waits for one."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.waiting = asyncio.Event()

    async def acquire(self) -> bool:
        if self.locked():
            self.waiting.set()
        return await super().acquire()


async def test_file_stores_wait_for_the_slots_native_uploads_share(
    iso: Isolation, pool: asyncpg.Pool, bus: Bus, aliases: AliasTable, http: aiohttp.ClientSession
) -> None:
    """Native uploads and OpenAI files take the same long-store slots, so together they
    never hold more than two connections; other requests are served meanwhile."""
    slots = WatchedSlots(2)
    server = await start_api(pool, bus, aliases, JobStore(pool, long_stores=slots))
    try:
        client = await client_of(iso, server, http)
        for _ in range(2):  # as two native uploads storing
            await slots.acquire()
        slots.waiting.clear()
        data = line("a", [{"role": "user", "content": "hi"}])
        stored = asyncio.ensure_future(upload(client, "wait.jsonl", data))
        await asyncio.wait_for(slots.waiting.wait(), 10)
        assert not stored.done()
        status, page = await client.request("GET", "/v1/batches")  # a key lookup and a query
        assert (status, page["data"]) == (200, [])
        slots.release()
        assert (await asyncio.wait_for(stored, 10))["bytes"] == len(data)
        slots.release()
    finally:
        await server.close()


async def test_an_output_file_whose_batch_is_deleted_mid_download_aborts_the_transfer(
    iso: Isolation,
    small_pages: TestServer,
    http: aiohttp.ClientSession,
    pool: asyncpg.Pool,
) -> None:
    """Its rows go with the batch, so the rest of the file never comes: the download is
    cut off (an incomplete transfer the client sees at once), not ended short of the
    Content-Length it declared, on which the client would wait until its timeout."""
    client = await client_of(iso, small_pages, http)
    rows = 50  # TEST_LIMITS' most
    data = b"".join(line(f"r{i}", [{"role": "user", "content": f"q{i}"}]) for i in range(rows))
    stored = await upload(client, "cut.jsonl", data)
    batch = await create_batch(client, stored["id"])
    job_id = batch["id"].removeprefix("batch_")
    await DispatchStore(pool).claim_queued(f"openai-{job_id}", 100, 30)
    answer = "z" * 200_000
    await OutcomeStore(pool).record([RowOutcome(job_id, i, answer, None, 1) for i in range(rows)])
    status, done = await client.request("GET", f"/openai/v1/batches/{batch['id']}")
    assert status == 200 and done["status"] == "completed", done
    headers = {"Authorization": f"Bearer {client.key}"}
    url = f"{client.base_url}/openai/v1/files/{done['output_file_id']}/content"
    async with asyncio.timeout(20), http.get(url, headers=headers) as response:
        assert response.status == 200
        assert response.content_length is not None and response.content_length > rows * 200_000
        first = await response.content.read(64 * 1024)
        assert first
        status, _ = await client.request("DELETE", f"/v1/batches/{job_id}")
        assert status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


async def test_a_file_deleted_between_its_lookup_and_its_first_bytes_is_a_404(
    iso: Isolation,
    small_pages: TestServer,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race the fuzzer's parallel workers met: a download found the file, a DELETE
    removed it before its content was read. Nothing was sent yet, so it is a 404 (as if
    the delete came first), not a transfer cut off after its headers."""
    client = await client_of(iso, small_pages, http)
    stored = await upload(client, "gone.jsonl", line("r0", [{"role": "user", "content": "q"}]))
    real_parts = FileStore.parts

    async def deleted_first(self: FileStore, file_id: str) -> AsyncIterator[bytes]:
        status, _ = await client.request("DELETE", f"/openai/v1/files/{stored['id']}")
        assert status == 200
        async for chunk in real_parts(self, file_id):
            yield chunk

    monkeypatch.setattr(FileStore, "parts", deleted_first)
    status, body = await client.request("GET", f"/openai/v1/files/{stored['id']}/content")
    assert status == 404, body
