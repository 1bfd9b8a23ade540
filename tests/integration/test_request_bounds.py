"""Inputs that must get a clear 4xx from the real ingest-api, never a 500 and never a
stored poison: deep free-form JSON, unknown fields, content encodings, stalled bodies,
requests aiohttp's parser refuses, and more large bodies at once than there are slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
import zlib
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
from aiohttp.test_utils import TestServer

from relay_batches.ids import new_id
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.services.ingest_api.deps import DEPS
from relay_batches.services.ingest_api.edge.body import BodyGate
from relay_batches.services.relay_cli import admin
from tests.helpers.api import (
    TEST_LARGE_BODY,
    TEST_LARGE_SLOTS,
    TEST_MAX_BODY,
    TEST_MIN_RATE,
    TEST_READ_TIMEOUT_S,
)
from tests.helpers.support import ApiClient, Isolation, wait_until

MODEL = "gpt-4o-mini"
ROWS = b'[{"messages":[{"role":"user","content":"hi"}]}]'
SCHEMA_PARAM = "params.response_format.json_schema"


def nested_schema(depth: int) -> bytes:
    """A json_schema object nesting ``depth`` levels (``{}`` is one)."""
    return b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)


def schema_body(depth: int) -> bytes:
    """A valid submission whose response_format.json_schema nests ``depth`` levels
    (written as text: orjson cannot encode past 255 levels)."""
    return (
        b'{"model":"gpt-4o-mini","requests":' + ROWS + b',"params":{"response_format":'
        b'{"type":"json_schema","json_schema":' + nested_schema(depth) + b"}}}"
    )


async def post(
    client: ApiClient, raw: bytes, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """POST raw bytes to /v1/batches as JSON."""
    return await client.request(
        "POST",
        "/v1/batches",
        data=raw,
        headers={"Content-Type": "application/json", **(headers or {})},
    )


def assert_error(status: int, data: Any, expected: int, param: str | None = None) -> None:
    """``data`` is API.md's error object with ``expected`` status and ``param``."""
    assert status == expected, (status, data)
    assert set(data) == {"error"} and set(data["error"]) == {"type", "message", "param"}, data
    assert data["error"]["param"] == param, data


# --- free-form JSON depth -----------------------------------------------------------


@pytest.mark.parametrize("depth", [31, 32])
async def test_a_json_schema_up_to_32_levels_is_stored_and_echoed(
    client_a: ApiClient, depth: int
) -> None:
    status, created = await post(client_a, schema_body(depth))
    assert status == 201, created
    schema = created["params"]["response_format"]["json_schema"]
    assert schema == orjson.loads(nested_schema(depth))
    status, got = await client_a.request("GET", f"/v1/batches/{created['id']}")
    assert (status, got["params"]) == (200, created["params"])
    status, page = await client_a.request("GET", "/v1/batches?limit=100")
    assert status == 200, page
    assert created["id"] in [b["id"] for b in page["data"]]


@pytest.mark.parametrize("depth", [33, 249, 250, 251, 300])
async def test_a_deeper_json_schema_is_a_400_naming_it_and_stores_nothing(
    client_a: ApiClient, depth: int
) -> None:
    status, before = await client_a.request("GET", "/v1/batches?limit=1")
    assert status == 200, before
    status, data = await post(client_a, schema_body(depth))
    assert_error(status, data, 400, SCHEMA_PARAM)
    assert "at most 32 levels" in data["error"]["message"]
    status, after = await client_a.request("GET", "/v1/batches?limit=1")
    assert (status, after["data"]) == (200, before["data"])


async def test_other_free_form_response_format_keys_are_bounded_too(client_a: ApiClient) -> None:
    raw = (
        b'{"model":"gpt-4o-mini","requests":' + ROWS + b',"params":{"response_format":'
        b'{"type":"text","extra":' + nested_schema(40) + b"}}}"
    )
    status, data = await post(client_a, raw)
    assert_error(status, data, 400, "params.response_format.extra")


# --- unknown fields -----------------------------------------------------------------


@pytest.mark.parametrize("field", ["webhook_url", "budget"])
async def test_an_unknown_top_level_field_is_a_400_naming_it(
    client_a: ApiClient, field: str
) -> None:
    raw = orjson.dumps({"model": MODEL, "requests": orjson.loads(ROWS), field: "x"})
    status, data = await post(client_a, raw)
    assert_error(status, data, 400, field)


# --- content encodings --------------------------------------------------------------


def submission() -> bytes:
    return orjson.dumps({"model": MODEL, "requests": orjson.loads(ROWS), "name": "zipped"})


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("GZIP", gzip.compress)],
)
async def test_a_gzip_or_deflate_body_is_inflated(
    client_a: ApiClient, encoding: str, pack: Any
) -> None:
    status, created = await post(client_a, pack(submission()), {"Content-Encoding": encoding})
    assert (status, created.get("name")) == (201, "zipped"), created


async def test_the_inflated_size_counts_against_the_body_limit(client_a: ApiClient) -> None:
    inflated = orjson.dumps({"model": MODEL, "requests": orjson.loads(ROWS)})[:-1]
    inflated += b" " * (TEST_MAX_BODY * 40) + b"}"
    packed = gzip.compress(inflated, 9)
    assert len(packed) < TEST_MAX_BODY // 4
    status, data = await post(client_a, packed, {"Content-Encoding": "gzip"})
    assert_error(status, data, 413)
    assert data["error"]["type"] == "request_too_large"


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_corrupt_encoding_is_a_400(client_a: ApiClient, encoding: str) -> None:
    packed = gzip.compress(submission())
    corrupt = packed[:10] + bytes(b ^ 0x5A for b in packed[10:])
    status, data = await post(client_a, corrupt, {"Content-Encoding": encoding})
    assert_error(status, data, 400)
    assert "cannot be decoded" in data["error"]["message"], data


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, gzip"])
async def test_an_encoding_we_do_not_inflate_is_a_415(client_a: ApiClient, encoding: str) -> None:
    status, data = await post(client_a, submission(), {"Content-Encoding": encoding})
    assert_error(status, data, 415, "Content-Encoding")
    assert data["error"]["type"] == "unsupported_media_type"


# --- raw connections: stalls, protocol errors, large-body slots ---------------------


class Raw:
    """One raw TCP connection to the API."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, server: TestServer) -> Raw:
        assert server.port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response(
        self, timeout_s: float = 30, closes: bool = True
    ) -> tuple[int, dict[str, str], Any, bool]:
        """(status, headers, JSON body, whether the server then closed the connection;
        only looked for when it ``closes``: a kept-alive connection would never say)."""
        async with asyncio.timeout(timeout_s):
            status_line = await self.reader.readline()
            headers: dict[str, str] = {}
            while (line := await self.reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await self.reader.readexactly(int(headers["content-length"]))
            closed = closes and await self.reader.read(1) == b""
        self.writer.close()
        return int(status_line.split()[1]), headers, orjson.loads(body), closed


def post_head(client: ApiClient, length: int, extra: str = "") -> bytes:
    return (
        f"POST /v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {client.key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n"
    ).encode()


async def test_a_stalled_body_is_answered_408_and_the_connection_closed(
    api_server: TestServer, client_a: ApiClient
) -> None:
    raw = await Raw.open(api_server)
    body = submission()
    await raw.send(post_head(client_a, len(body)) + body[: len(body) // 2])
    started = asyncio.get_running_loop().time()
    status, _, data, closed = await raw.response(timeout_s=TEST_READ_TIMEOUT_S + 30)
    assert asyncio.get_running_loop().time() - started >= TEST_READ_TIMEOUT_S - 0.5
    assert_error(status, data, 408)
    assert data["error"]["type"] == "request_timeout"
    assert closed


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", id="long-url"),
        pytest.param(
            b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", id="header"
        ),
        pytest.param(b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n", id="bad-method"),
        pytest.param(b"GET / HTTP/9\r\nHost: x\r\n\r\n", id="bad-version"),
        pytest.param(b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", id="bad-header-line"),
    ],
)
async def test_a_request_the_parser_refuses_gets_the_error_object(
    api_server: TestServer, request_bytes: bytes
) -> None:
    raw = await Raw.open(api_server)
    await raw.send(request_bytes)
    status, headers, data, closed = await raw.response()
    assert headers["content-type"].startswith("application/json"), headers
    assert_error(status, data, 400)
    assert data["error"]["type"] == "invalid_request_error"
    assert closed


async def test_broken_chunked_framing_gets_the_error_object(
    api_server: TestServer, client_a: ApiClient
) -> None:
    raw = await Raw.open(api_server)
    head = post_head(client_a, 0).replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
    await raw.send(head + b'5\r\n{"mod\r\nzz\r\n')
    status, _, data, _ = await raw.response()
    assert_error(status, data, 400)


async def trickle(holders: list[Raw], stop: asyncio.Event, piece: bytes = b" " * 512) -> None:
    """Keep each holder's body alive (``piece`` at a time, four times per read timeout:
    by default well over the minimum rate) until ``stop``."""
    while not stop.is_set():
        for holder in holders:
            await holder.send(piece)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), TEST_READ_TIMEOUT_S / 4)


@pytest.fixture
async def client_c(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession
) -> ApiClient:
    """A client of a workspace of its own."""
    created = await admin.create_key(iso.database_url, f"bounds-{new_id()[:12]}")
    return ApiClient(str(api_server.make_url("")).rstrip("/"), created.key, http)


async def hold_large(server: TestServer, clients: list[ApiClient]) -> list[Raw]:
    """One large declared body per client, begun and still arriving."""
    holders = []
    for client in clients:
        holder = await Raw.open(server)
        await holder.send(post_head(client, TEST_LARGE_BODY * 2) + b"{")
        holders.append(holder)
    return holders


async def slots_held(gate: BodyGate, count: int) -> None:
    async def held() -> bool:
        return gate.in_use == count

    await wait_until(held, 30, f"{count} large-body slots held")


async def end_by_stalling(holders: list[Raw]) -> None:
    """Each holder's stall ends it with a 408, which frees its slot."""
    for holder in holders:
        status, _, data, _ = await holder.response(timeout_s=TEST_READ_TIMEOUT_S + 30)
        assert_error(status, data, 408)


async def test_a_large_body_past_the_slots_is_a_503_with_retry_after(
    api_server: TestServer, client_a: ApiClient, client_b: ApiClient, client_c: ApiClient
) -> None:
    gate = api_server.app[DEPS].body_gate
    assert TEST_LARGE_SLOTS == 2
    holders = await hold_large(api_server, [client_a, client_b])
    stop = asyncio.Event()
    keep_alive = asyncio.create_task(trickle(holders, stop))
    try:
        await slots_held(gate, TEST_LARGE_SLOTS)
        status, created = await post(client_c, submission())  # a small body still passes
        assert status == 201, created
        late = await Raw.open(api_server)
        await late.send(post_head(client_c, TEST_LARGE_BODY * 2) + b"{")
        status, headers, data, closed = await late.response()
        assert_error(status, data, 503)
        assert "too many large requests" in data["error"]["message"], data
        assert headers["retry-after"] == "2"
        assert closed
    finally:
        stop.set()
        await keep_alive
    await end_by_stalling(holders)
    assert gate.in_use == 0
    status, created = await post(client_a, submission()[:-1] + b" " * TEST_LARGE_BODY + b"}")
    assert status == 201, created


async def test_a_workspace_holds_at_most_one_large_body_slot(
    api_server: TestServer, client_a: ApiClient, client_b: ApiClient
) -> None:
    gate = api_server.app[DEPS].body_gate
    holders = await hold_large(api_server, [client_a])
    stop = asyncio.Event()
    keep_alive = asyncio.create_task(trickle(holders, stop))
    try:
        await slots_held(gate, 1)
        second = await Raw.open(api_server)
        await second.send(post_head(client_a, TEST_LARGE_BODY * 2) + b"{")
        status, headers, data, closed = await second.response()
        assert_error(status, data, 503)
        assert "this workspace already has a large request" in data["error"]["message"], data
        assert (headers["retry-after"], closed) == ("2", True)
        large = submission()[:-1] + b" " * TEST_LARGE_BODY + b"}"
        status, created = await post(client_b, large)  # another workspace gets the free slot
        assert status == 201, created
    finally:
        stop.set()
        await keep_alive
    await end_by_stalling(holders)
    assert (gate.in_use, gate.holders) == (0, set())


async def test_a_trickled_body_is_408_once_under_the_minimum_rate(
    api_server: TestServer, client_a: ApiClient
) -> None:
    """A byte every quarter of the read timeout never stalls, but is far under the
    minimum rate: answered 408 soon after the read timeout, freeing its slot."""
    gate = api_server.app[DEPS].body_gate
    holders = await hold_large(api_server, [client_a])
    loop = asyncio.get_running_loop()
    started = loop.time()
    stop = asyncio.Event()
    keep_alive = asyncio.create_task(trickle(holders, stop, b" "))
    try:
        status, _, data, closed = await holders[0].response(timeout_s=TEST_READ_TIMEOUT_S * 10)
    finally:
        stop.set()
        with contextlib.suppress(ConnectionError):
            await keep_alive
    assert loop.time() - started >= TEST_READ_TIMEOUT_S - 0.5
    assert_error(status, data, 408)
    assert f"under {TEST_MIN_RATE:g} bytes/s" in data["error"]["message"], data
    assert closed
    assert gate.in_use == 0


def chunked(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def chunked_head(client: ApiClient, path: str, content_type: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {client.key}\r\n"
        f"Content-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()


async def test_a_chunked_upload_takes_a_large_body_slot_as_it_grows(
    api_server: TestServer, client_a: ApiClient
) -> None:
    """No Content-Length: the file part's bytes, counted as they are read, take the slot
    before the part is complete."""
    gate = api_server.app[DEPS].body_gate
    boundary = "b0undary"
    head = chunked_head(client_a, "/v1/batches/upload", f"multipart/form-data; boundary={boundary}")
    opening = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{MODEL}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.csv"\r\n'
        "Content-Type: text/csv\r\n\r\n"
    ).encode()
    raw = await Raw.open(api_server)
    await raw.send(head + chunked(opening + b"\n" * (TEST_LARGE_BODY * 2)))
    await slots_held(gate, 1)  # the file part is still open
    await raw.send(chunked(f"hello\n\r\n--{boundary}--\r\n".encode()) + b"0\r\n\r\n")
    status, _, created, _ = await raw.response(closes=False)
    assert status == 201, created
    assert [b["total"] for b in created["data"]] == [1]
    assert gate.in_use == 0


async def test_a_chunked_submit_takes_a_large_body_slot_as_it_grows(
    api_server: TestServer, client_a: ApiClient
) -> None:
    gate = api_server.app[DEPS].body_gate
    body = submission()
    raw = await Raw.open(api_server)
    head = chunked_head(client_a, "/v1/batches", "application/json")
    await raw.send(head + chunked(body[:-1] + b" " * (TEST_LARGE_BODY * 2)))
    await slots_held(gate, 1)  # the body is still open
    await raw.send(chunked(b"}") + b"0\r\n\r\n")
    status, _, created, _ = await raw.response(closes=False)
    assert (status, created.get("name")) == (201, "zipped"), created
    assert gate.in_use == 0


async def test_a_small_submit_does_not_wait_behind_a_large_ones_parse(
    api_server: TestServer, client_a: ApiClient, client_b: ApiClient
) -> None:
    """The large-body parse thread is kept busy (a job blocked on an event), with a
    large submit of A queued behind it: B's small submit is answered meanwhile."""
    deps = api_server.app[DEPS]
    release = threading.Event()
    busy = asyncio.get_running_loop().run_in_executor(deps.parser, release.wait, 60)
    try:
        large = asyncio.create_task(
            post(client_a, submission()[:-1] + b" " * TEST_LARGE_BODY + b"}")
        )
        small = asyncio.create_task(post(client_b, submission()))
        done, _ = await asyncio.wait([large, small], timeout=30, return_when="FIRST_COMPLETED")
        assert done == {small}, "the small submit waited behind the large one"
        status, created = small.result()
        assert status == 201, created
    finally:
        release.set()
        await busy
    status, created = await large
    assert status == 201, created


async def test_a_batch_stored_with_deep_params_before_the_limit_still_echoes(
    pool: asyncpg.Pool, client_a: ApiClient
) -> None:
    """A batch stored before the depth limit existed (its json_schema 250 levels deep,
    written straight to the ledger) answers 200 on every page that holds it."""
    workspace = await KeyStore(pool).workspace_for_key(client_a.key)
    assert workspace is not None
    params = b'{"response_format":{"type":"json_schema","json_schema":' + nested_schema(250)
    new = NewJob(
        new_id(), workspace, "legacy", MODEL, 0, 1, None, None, None, (params + b"}}").decode()
    )
    await JobStore(pool).create(new, [("row-1", '[{"content":"hi","role":"user"}]')])
    status, got = await client_a.request("GET", f"/v1/batches/{new.id}")
    assert (status, got["name"]) == (200, "legacy"), got
    status, page = await client_a.request("GET", "/v1/batches?limit=100")
    assert status == 200, page
    assert new.id in [b["id"] for b in page["data"]]


async def test_a_stalled_upload_is_answered_408(
    api_server: TestServer, client_a: ApiClient
) -> None:
    boundary = "b0undary"
    part = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{MODEL}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.csv"\r\n'
        "Content-Type: text/csv\r\n\r\nhello\r\n"
    ).encode()
    head = (
        f"POST /v1/batches/upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {client_a.key}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {len(part) + 100}\r\n\r\n"
    ).encode()
    raw = await Raw.open(api_server)
    await raw.send(head + part)
    status, _, data, closed = await raw.response(timeout_s=TEST_READ_TIMEOUT_S + 30)
    assert_error(status, data, 408)
    assert closed


async def test_a_gzip_upload_is_inflated(client_a: ApiClient) -> None:
    form = aiohttp.FormData()
    form.add_field("model", MODEL)
    form.add_field("file", b"prompt\nhello\n", filename="a.csv", content_type="text/csv")
    payload = form()
    chunks: list[bytes] = []

    class Sink:
        async def write(self, data: bytes) -> None:
            chunks.append(bytes(data))

    await payload.write(Sink())  # type: ignore[arg-type]
    status, data = await client_a.request(
        "POST",
        "/v1/batches/upload",
        data=gzip.compress(b"".join(chunks)),
        headers={"Content-Type": payload.content_type, "Content-Encoding": "gzip"},
    )
    assert status == 201, data
    assert [b["total"] for b in data["data"]] == [1]
