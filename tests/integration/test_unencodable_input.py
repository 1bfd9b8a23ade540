"""Lone surrogates over HTTP, on every surface: a body escaping one (``"\\udc00"``, valid
JSON that Python's decoder turns into text UTF-8 cannot encode) is a 400 in the surface's
error object naming the field, never a 500: in a key, a value, a custom id, a name,
metadata, and in the error's own echo of the key. (The OpenAI surface decodes bodies
with orjson, which refuses lone surrogates: its error objects are checked in
``tests/unit/test_error_body.py``.)"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from relay_batches.ids import new_id
from relay_batches.services.relay_cli import admin
from tests.helpers.support import Isolation

HI = {"role": "user", "content": "hi"}
NATIVE_FIELDS = (
    "budget_usd, completion_window, cron, endpoint, metadata, model, name, params, priority,"
    " requests, webhookUrl"
)


async def post(
    http: aiohttp.ClientSession, url: str, key: str, data: bytes, content_type: str
) -> tuple[int, str, Any]:
    """POST ``data``; the status, the content type and the decoded JSON answer."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": content_type}
    async with http.post(url, data=data, headers=headers) as response:
        raw = await response.read()
        return response.status, response.content_type, orjson.loads(raw)


@pytest.fixture
async def key(iso: Isolation) -> str:
    return (await admin.create_key(iso.database_url, f"surrogates-{new_id()[:8]}")).key


def escaped(value: object) -> bytes:
    """JSON text with every non-ASCII character escaped, lone surrogates included."""
    return json.dumps(value).encode()


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        pytest.param(
            {"model": "gpt-4o-mini", "requests": [{"messages": [HI]}], "\udc00": 1},
            "\\udc00",
            f"'\\udc00' is not a field of a batch (fields: {NATIVE_FIELDS})",
            id="top-level-key",
        ),
        pytest.param(
            {"model": "gpt-4o-mini", "requests": [{"messages": [HI], "\udc00": 1}]},
            "requests[0]",
            "requests[0] must be valid Unicode text",
            id="row-key",
        ),
        pytest.param(
            {"model": "gpt-4o-mini", "requests": [{"messages": [{**HI, "\udc00": 1}]}]},
            "requests[0].messages[0]",
            "requests[0].messages[0] must be valid Unicode text",
            id="message-key",
        ),
        pytest.param(
            {"model": "gpt-4o-mini", "requests": [{"custom_id": "\ud800", "messages": [HI]}]},
            "requests[0].custom_id",
            "requests[0].custom_id must be valid Unicode text",
            id="custom-id",
        ),
        pytest.param(
            {"model": "gpt-4o-mini", "name": "\ud800", "requests": [{"messages": [HI]}]},
            "name",
            "name must be valid Unicode text",
            id="name",
        ),
        pytest.param(
            {"model": "gpt-4o-mini", "metadata": {"a": "\ud800"}, "requests": [{"messages": [HI]}]},
            "metadata.a",
            "metadata.a must be valid Unicode text",
            id="metadata-value",
        ),
        pytest.param(
            {"model": "gpt-4o-mini", "metadata": {"\ud800": "v"}, "requests": [{"messages": [HI]}]},
            "metadata",
            "metadata keys must be valid Unicode text",
            id="metadata-key",
        ),
    ],
)
async def test_native_submit_refuses_a_lone_surrogate_naming_the_field(
    api_server: TestServer,
    http: aiohttp.ClientSession,
    key: str,
    body: dict[str, Any],
    param: str,
    message: str,
) -> None:
    url = str(api_server.make_url("/v1/batches"))
    status, kind, data = await post(http, url, key, escaped(body), "application/json")

    assert (status, kind) == (400, "application/json")
    assert data == {"error": {"type": "invalid_request_error", "message": message, "param": param}}


def anthropic_params(**extra: object) -> dict[str, object]:
    return {"model": "gpt-4o-mini", "max_tokens": 10, "messages": [HI], **extra}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            {"\udc00": []},
            "'\\udc00': extra inputs are not permitted (fields: requests)",
            id="body-key",
        ),
        pytest.param(
            {"requests": [{"custom_id": "a", "params": {**anthropic_params(), "\udc00": 1}}]},
            "requests[0].params: must be valid Unicode text",
            id="params-key",
        ),
        pytest.param(
            {
                "requests": [
                    {"custom_id": "a", "params": anthropic_params(messages=[{**HI, "\udc00": 1}])}
                ]
            },
            "requests[0].params.messages[0]: must be valid Unicode text",
            id="message-key",
        ),
        pytest.param(
            {"requests": [{"custom_id": "a", "\udc00": 1}]},
            "requests[0].\\udc00: is not a field of a request (fields: custom_id, params)",
            id="request-key",
        ),
    ],
)
async def test_anthropic_create_refuses_a_lone_surrogate_in_its_error_shape(
    api_server: TestServer,
    http: aiohttp.ClientSession,
    key: str,
    body: dict[str, Any],
    message: str,
) -> None:
    url = str(api_server.make_url("/anthropic/v1/messages/batches"))
    status, kind, data = await post(http, url, key, escaped(body), "application/json")

    assert (status, kind) == (400, "application/json")
    assert data == {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
