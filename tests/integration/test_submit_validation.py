"""What of the native submit contract (docs/api/native.md) needs HTTP, against the real
ingest-api: status codes, the error object's exact shape, content types, body sizes,
authentication, the configured limits, and a few representative rules end to end.

Each submit rule itself is tested once, on the validation functions, in
``tests/unit/test_validation.py``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
from aiohttp.test_utils import TestServer

from relay_batches.dialects.chat import PARAM_FIELDS
from relay_batches.ids import new_id
from tests.helpers.api import TEST_LIMITS, TEST_MAX_BODY, TEST_MAX_JSON_BODY
from tests.helpers.support import ApiClient

ROW_FIELDS = ", ".join(sorted({*PARAM_FIELDS, "custom_id", "messages", "model"}))

MODEL = "gpt-4o-mini"
ID_RE = re.compile(r"^[0-9a-f]{32}$")
TIMESTAMP_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
DROP = object()  # marks a top-level field to leave out of the body
MAX_ROWS = TEST_LIMITS.max_rows
MAX_BYTES = TEST_LIMITS.max_content_bytes


def msg(content: Any = "hello", role: Any = "user") -> dict[str, Any]:
    """One chat message."""
    return {"role": role, "content": content}


def req(custom_id: Any = DROP, messages: Any = DROP) -> dict[str, Any]:
    """One request row; by default a single user message and no custom_id."""
    row: dict[str, Any] = {"messages": [msg()] if messages is DROP else messages}
    if custom_id is not DROP:
        row["custom_id"] = custom_id
    return row


def good_rows(n: int) -> list[dict[str, Any]]:
    """``n`` valid rows with distinct explicit custom ids."""
    return [req(f"r-{i}") for i in range(n)]


def body(**fields: Any) -> dict[str, Any]:
    """A valid submission with ``fields`` replaced (``DROP`` removes a field)."""
    base: dict[str, Any] = {"model": MODEL, "requests": good_rows(2)}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not DROP}


def assert_error(
    status: int,
    data: Any,
    *,
    expected_status: int,
    error_type: str,
    param: str | None,
    fragment: str | None = None,
) -> None:
    """``data`` is exactly the native error object with these values."""
    assert status == expected_status, (status, data)
    assert isinstance(data, dict) and set(data) == {"error"}, data
    error = data["error"]
    assert set(error) == {"type", "message", "param"}, error
    assert error["type"] == error_type, error
    assert error["param"] == param, error
    assert isinstance(error["message"], str) and error["message"], error
    if fragment is not None:
        assert fragment in error["message"], error


def assert_invalid(status: int, data: Any, param: str | None, fragment: str | None) -> None:
    """A 400 ``invalid_request_error`` naming ``param``."""
    assert_error(
        status,
        data,
        expected_status=400,
        error_type="invalid_request_error",
        param=param,
        fragment=fragment,
    )


async def post_raw(
    client: ApiClient, raw: bytes | AsyncIterator[bytes], content_type: str | None
) -> tuple[int, Any]:
    """POST ``raw`` to /v1/batches with ``content_type`` (None: aiohttp's default)."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    return await client.request("POST", "/v1/batches", data=raw, headers=headers)


# --- representative rules, end to end ---------------------------------------------

REPRESENTATIVE_RULES = [
    pytest.param(body(model="gpt-9-imaginary"), "model", "unknown", id="job-level-field"),
    pytest.param(
        body(requests=[*good_rows(3), {"custom_id": "r-3"}]),
        "requests[3].messages",
        "requests[3].messages must be a non-empty array",  # docs/api/native.md
        id="row-field-path",
    ),
    pytest.param(
        body(params={"max_tokens": 0}), "params.max_tokens", "params.max_tokens", id="params"
    ),
    pytest.param(
        body(requests=good_rows(MAX_ROWS + 1)),
        "requests",
        f"at most {MAX_ROWS}",
        id="configured-max-rows",
    ),
    pytest.param(
        body(requests=[req("a", [msg(content="a" * (MAX_BYTES + 1))])]),
        "requests[0].messages[0].content",
        f"at most {MAX_BYTES} bytes",
        id="configured-content-bytes",
    ),
    pytest.param(body(priority=1001), "priority", "between -1000 and 1000", id="priority-range"),
    pytest.param(
        body(requests=[*good_rows(2), req("p", [msg(content=[{"type": "text", "text": 5}])])]),
        "requests[2].messages[0].content[0].text",
        "requests[2].messages[0].content[0].text must be a string",
        id="content-part",
    ),
    pytest.param(
        body(requests=[req("t", [msg(), msg(role="tool", content="42")])]),
        "requests[0].messages[1].tool_call_id",
        "requests[0].messages[1].tool_call_id is required",
        id="tool-turn",
    ),
    pytest.param(
        body(requests=[{**req("m"), "model": "gpt-9-imaginary"}]),
        "requests[0].model",
        "requests[0].model 'gpt-9-imaginary' is unknown",
        id="row-model",
    ),
    pytest.param(
        body(requests=[*good_rows(3), {**good_rows(1)[0], "custom_id": "r-9", "bogus": 1}]),
        "requests[3].bogus",
        f"requests[3].bogus is not a field of a request (fields: {ROW_FIELDS})",
        id="unknown-row-field",
    ),
]


@pytest.mark.parametrize(("payload", "param", "fragment"), REPRESENTATIVE_RULES)
async def test_a_rule_violation_is_400_with_param(
    client_a: ApiClient, payload: dict[str, Any], param: str, fragment: str
) -> None:
    status, data = await client_a.request("POST", "/v1/batches", json=payload)
    assert_invalid(status, data, param, fragment)


async def test_the_configured_limits_are_inclusive(client_a: ApiClient) -> None:
    rows = [*good_rows(MAX_ROWS - 1), req("last", [msg(content="a" * MAX_BYTES)])]
    created = await client_a.submit(body(requests=rows))
    assert created["total"] == MAX_ROWS


# --- the body itself -----------------------------------------------------------------

BAD_BODIES = [
    pytest.param(b"{not json", "JSON", id="not-json"),
    pytest.param(orjson.dumps([body()]), "object", id="array"),
]


@pytest.mark.parametrize(("raw", "fragment"), BAD_BODIES)
async def test_body_not_a_json_object_is_400(
    client_a: ApiClient, raw: bytes, fragment: str
) -> None:
    status, data = await post_raw(client_a, raw, "application/json")
    assert_invalid(status, data, None, fragment)


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonl",
        None,  # aiohttp sends application/octet-stream for raw bytes
    ],
)
async def test_non_json_content_type_is_415(client_a: ApiClient, content_type: str | None) -> None:
    status, data = await post_raw(client_a, orjson.dumps(body()), content_type)
    assert_error(
        status,
        data,
        expected_status=415,
        error_type="unsupported_media_type",
        param=None,
        fragment="application/json",
    )


async def test_json_content_type_with_charset_is_accepted(client_a: ApiClient) -> None:
    status, data = await post_raw(client_a, orjson.dumps(body()), "application/json; charset=utf-8")
    assert status == 201, data


def oversized_body(size: int) -> bytes:
    """A valid submission of exactly ``size`` bytes (padded with whitespace)."""
    head = orjson.dumps(body())[:-1]
    return head + b" " * (size - len(head) - 1) + b"}"


async def chunks(raw: bytes, size: int = 16 * 1024) -> AsyncIterator[bytes]:
    """``raw`` as a chunked upload (no Content-Length)."""
    for start in range(0, len(raw), size):
        yield raw[start : start + size]


def assert_too_large(status: int, data: Any, limit: int = TEST_MAX_JSON_BODY) -> None:
    assert_error(
        status,
        data,
        expected_status=413,
        error_type="request_too_large",
        param=None,
        fragment=str(limit),
    )


async def test_body_at_the_size_limit_is_accepted(client_a: ApiClient) -> None:
    status, data = await post_raw(client_a, oversized_body(TEST_MAX_JSON_BODY), "application/json")
    assert status == 201, data


@pytest.mark.parametrize("size", [TEST_MAX_JSON_BODY + 1, 2 * TEST_MAX_JSON_BODY])
async def test_body_over_the_size_limit_is_413(client_a: ApiClient, size: int) -> None:
    status, data = await post_raw(client_a, oversized_body(size), "application/json")
    assert_too_large(status, data)


@pytest.mark.parametrize("size", [TEST_MAX_JSON_BODY + 1, 2 * TEST_MAX_JSON_BODY])
async def test_chunked_body_over_the_size_limit_is_413(client_a: ApiClient, size: int) -> None:
    status, data = await post_raw(client_a, chunks(oversized_body(size)), "application/json")
    assert_too_large(status, data)


async def test_an_upload_may_be_larger_than_a_json_body(client_a: ApiClient) -> None:
    """Uploads are spooled to disk, so their limit (RELAY_MAX_BODY_BYTES) is above the
    one of a JSON body, which is decoded in memory (RELAY_MAX_JSON_BODY_BYTES)."""
    size = (TEST_MAX_JSON_BODY + TEST_MAX_BODY) // 2
    line = b"x" * 999 + b"\n"  # one prompt per line
    content = line * (size // len(line))
    form = aiohttp.FormData()
    form.add_field("model", "gpt-4o-mini")
    form.add_field("file", b"prompt\n" + content, filename="big.csv", content_type="text/csv")
    status, data = await client_a.request("POST", "/v1/batches/upload", data=form)
    assert status == 400, data  # past the rows limit, read whole: not a 413
    assert "50" in data["error"]["message"], data
    status, data = await post_raw(client_a, oversized_body(size), "application/json")
    assert_too_large(status, data)


# --- authentication ------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-authorization"),
        pytest.param({"Authorization": "Bearer"}, id="bearer-without-key"),
        pytest.param({"Authorization": "Bearer    "}, id="bearer-blank-key"),
        pytest.param({"Authorization": "Basic dXNlcjpwYXNz"}, id="basic-scheme"),
        pytest.param({"Authorization": "rk_just-the-key"}, id="no-scheme"),
    ],
)
@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/batches"), ("GET", "/v1/batches")])
async def test_missing_key_is_401(
    client_a: ApiClient,
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    headers: dict[str, str],
) -> None:
    headers = {**headers, "Content-Type": "application/json"}
    async with http.request(
        method, client_a.base_url + path, headers=headers, data=orjson.dumps(body())
    ) as response:
        data = orjson.loads(await response.read())
    assert_error(
        response.status, data, expected_status=401, error_type="authentication_error", param=None
    )


@pytest.mark.parametrize("key", ["rk_unknown-key-0000000000000000", "ключ", "x" * 5000])
async def test_unknown_key_is_401(client_a: ApiClient, key: str) -> None:
    status, data = await client_a.request("POST", "/v1/batches", json=body(), key=key)
    assert_error(status, data, expected_status=401, error_type="authentication_error", param=None)


async def raw_http(server: TestServer, request: bytes) -> tuple[int, Any]:
    """Send ``request`` byte for byte on a fresh connection; (status, decoded JSON body)."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(request)
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, payload = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, orjson.loads(payload)


async def test_key_that_is_not_utf8_is_401(api_server: TestServer) -> None:
    status, data = await raw_http(
        api_server,
        b"GET /v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer rk_\xff\xfe\r\n"
        b"Connection: close\r\n\r\n",
    )
    assert_error(status, data, expected_status=401, error_type="authentication_error", param=None)


# --- the happy path ------------------------------------------------------------------


def assert_created(data: dict[str, Any]) -> None:
    """The five fields docs/api/native.md promises on every 201, with the right shapes."""
    assert set(data) >= {"id", "object", "status", "total", "next_run_at"}, data
    assert ID_RE.match(data["id"]), data
    assert data["object"] == "batch"


async def test_submit_returns_201_with_a_queued_batch(client_a: ApiClient) -> None:
    payload = body(
        name="Review sentiment — October",
        priority=5,
        webhookUrl="https://my-app/relay-webhook",
        cron=None,
    )
    status, data = await client_a.request("POST", "/v1/batches", json=payload)
    assert status == 201, data
    assert_created(data)
    assert data["status"] == "queued"
    assert data["total"] == 2
    assert data["next_run_at"] is None
    assert data["name"] == "Review sentiment — October"
    assert data["model"] == MODEL
    assert data["priority"] == 5
    assert (data["completed"], data["failed"], data["dead_letter"]) == (0, 0, 0)
    assert TIMESTAMP_RE.match(data["created_at"]), data
    assert (data["started_at"], data["completed_at"], data["error"]) == (None, None, None)
    assert (data["cron"], data["template_id"]) == (None, None)
    assert await client_a.get(data["id"]) == data


async def test_submit_defaults_priority_and_name(client_a: ApiClient) -> None:
    created = await client_a.submit({"model": MODEL, "requests": [req()]})
    assert_created(created)
    assert created["status"] == "queued"
    assert created["total"] == 1
    assert created["priority"] == 0
    assert isinstance(created["name"], str) and created["name"].strip()
    assert created["next_run_at"] is None


async def test_a_budget_is_stored_on_the_batch(client_a: ApiClient) -> None:
    created = await client_a.submit(body(budget_usd=0.25))
    assert (created["budget_usd"], created["cost_usd"]) == (0.25, 0)
    assert (await client_a.get(created["id"]))["budget_usd"] == 0.25
    plain = await client_a.submit(body())
    assert plain["budget_usd"] is None


@pytest.mark.parametrize("budget", ["1", True, 0, -5, 1_000_001])
async def test_a_bad_budget_is_400_naming_it(client_a: ApiClient, budget: Any) -> None:
    status, data = await client_a.request("POST", "/v1/batches", json=body(budget_usd=budget))
    assert_invalid(status, data, "budget_usd", "budget_usd must be")


async def test_cron_submission_is_a_scheduled_template(client_a: ApiClient) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    created = await client_a.submit(body(cron="*/5 * * * 1-5"))
    assert_created(created)
    assert created["status"] == "scheduled"
    assert created["cron"] == "*/5 * * * 1-5"
    assert TIMESTAMP_RE.match(created["next_run_at"]), created
    next_run = datetime.strptime(created["next_run_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert next_run > before
    assert next_run.minute % 5 == 0 and next_run.second == 0
    assert next_run.isoweekday() <= 5
    assert (await client_a.get(created["id"]))["status"] == "scheduled"


# --- reading: unknown ids, list parameters, routes -----------------------------------


@pytest.mark.parametrize(
    "batch_id",
    [
        pytest.param(new_id(), id="well-formed-unknown"),
        pytest.param("not-an-id", id="malformed"),
        pytest.param(new_id().upper(), id="uppercase-hex"),
        pytest.param(new_id()[:31], id="31-chars"),
        pytest.param(new_id() + "0", id="33-chars"),
        pytest.param(new_id() + "%0A", id="trailing-newline"),
        pytest.param("%27%3B%20DROP%20TABLE%20batches", id="sql-ish"),
        pytest.param("%FF%FE", id="not-utf8"),
    ],
)
@pytest.mark.parametrize(
    ("method", "suffix"),
    [("GET", ""), ("GET", "/results"), ("GET", "/dead_letter"), ("POST", "/cancel")],
)
async def test_unknown_batch_is_404(
    client_a: ApiClient, batch_id: str, method: str, suffix: str
) -> None:
    status, data = await client_a.request(method, f"/v1/batches/{batch_id}{suffix}")
    assert_error(
        status, data, expected_status=404, error_type="not_found_error", param="id", fragment="no"
    )


@pytest.mark.parametrize(
    ("query", "param"),
    [
        pytest.param("limit=0", "limit", id="limit-0"),
        pytest.param("limit=101", "limit", id="limit-101"),
        pytest.param("limit=-1", "limit", id="limit-negative"),
        pytest.param("limit=abc", "limit", id="limit-text"),
        pytest.param("limit=", "limit", id="limit-empty"),
        pytest.param("limit=2.5", "limit", id="limit-fraction"),
        pytest.param("limit=" + "1" * 5000, "limit", id="limit-5000-digits"),
        pytest.param("limit=%C2%B2", "limit", id="limit-superscript-two"),
        pytest.param("limit=%D9%A3", "limit", id="limit-arabic-indic-digit"),
        pytest.param("status=bogus", "status", id="status-unknown"),
        pytest.param("status=QUEUED", "status", id="status-wrong-case"),
        pytest.param("status=", "status", id="status-empty"),
        pytest.param("status=%FF", "status", id="status-not-utf8"),
        pytest.param("after=bogus", "after", id="after-malformed"),
    ],
)
async def test_bad_list_parameter_is_400(client_a: ApiClient, query: str, param: str) -> None:
    status, data = await client_a.request("GET", f"/v1/batches?{query}")
    assert_invalid(status, data, param, param)


@pytest.mark.parametrize("limit", [1, 100])
async def test_list_limit_bounds_are_accepted(client_a: ApiClient, limit: int) -> None:
    await client_a.submit(body())
    status, data = await client_a.request("GET", f"/v1/batches?limit={limit}")
    assert status == 200, data
    assert data["object"] == "list"
    assert 1 <= len(data["data"]) <= limit


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/nothing-here"), ("GET", "/v1/batches/x/y/z"), ("GET", "/nothing-here")],
)
async def test_unknown_route_is_404_with_error_object(
    client_a: ApiClient, method: str, path: str
) -> None:
    status, data = await client_a.request(method, path)
    assert_error(status, data, expected_status=404, error_type="not_found_error", param=None)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("DELETE", "/v1/batches"),
        ("PUT", "/v1/batches"),
        ("PUT", f"/v1/batches/{new_id()}"),  # DELETE is a route: 404 for an unknown id
        ("PATCH", f"/v1/batches/{new_id()}"),
        ("GET", f"/v1/batches/{new_id()}/cancel"),
        ("POST", f"/v1/batches/{new_id()}/results"),
    ],
)
async def test_wrong_method_is_405_with_error_object(
    client_a: ApiClient, method: str, path: str
) -> None:
    status, data = await client_a.request(method, path)
    assert_error(status, data, expected_status=405, error_type="invalid_request_error", param=None)


async def test_nul_in_content_is_stored(client_a: ApiClient, pool: asyncpg.Pool) -> None:
    created = await client_a.submit(body(requests=[req("a", [msg(content="nul \u0000 inside")])]))
    messages = await pool.fetchval(
        "SELECT request FROM batch_rows WHERE batch_id = $1", created["id"]
    )
    assert orjson.loads(messages) == [{"content": "nul \u0000 inside", "role": "user"}]


async def test_rich_rows_are_stored_whole(client_a: ApiClient, pool: asyncpg.Pool) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    rich = {
        "custom_id": "rich",
        "model": MODEL,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look it up"}], "name": "ann"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "found"},
        ],
        "tools": [tool],
        "tool_choice": "auto",
        "max_tokens": 32,
    }
    created = await client_a.submit(body(requests=[req("plain"), rich]))
    assert created["total"] == 2
    records = await pool.fetch(
        "SELECT custom_id, request FROM batch_rows WHERE batch_id = $1 ORDER BY row_index",
        created["id"],
    )
    assert [(r["custom_id"], r["request"]) for r in records] == [
        ("plain", '[{"content":"hello","role":"user"}]'),
        (
            "rich",
            orjson.dumps(
                {k: v for k, v in rich.items() if k != "custom_id"}, option=orjson.OPT_SORT_KEYS
            ).decode(),
        ),
    ]
