"""A JSON body is read as UTF-8 (RFC 8259 §8.1): every endpoint taking one refuses a
``Content-Type`` declaring another ``charset`` with a 415 naming it, in its surface's
own error object, rather than decoding, say, a declared UTF-16 body as UTF-8. No
``charset``, or ``utf-8`` in any case, quoted or as ``utf8``, is accepted as before.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.helpers.support import ApiClient

MODEL = "gpt-4o-mini"
NATIVE = {"model": MODEL, "requests": [{"messages": [{"role": "user", "content": "hi"}]}]}
ANTHROPIC = {
    "requests": [
        {
            "custom_id": "a",
            "params": {
                "model": MODEL,
                "max_tokens": 16,
                "messages": [{"role": "user", "content": "hi"}],
            },
        }
    ]
}
OPENAI = {
    "input_file_id": "file-none",
    "endpoint": "/v1/chat/completions",
    "completion_window": "24h",
}


async def post(client: ApiClient, path: str, body: Any, content_type: str) -> tuple[int, Any]:
    """POST ``body`` as UTF-8 JSON under ``content_type``."""
    return await client.request(
        "POST", path, data=orjson.dumps(body), headers={"Content-Type": content_type}
    )


def refused(charset: str) -> str:
    """The message of a 415 naming ``charset``."""
    return f"charset {charset} is not supported: send UTF-8"


@pytest.mark.parametrize(
    ("header", "named"),
    [
        ("application/json; charset=utf-16", "utf-16"),
        ('application/json; charset="UTF-16LE"', "UTF-16LE"),
        ("application/json;charset=iso-8859-1", "iso-8859-1"),
        ("application/json; charset=us-ascii", "us-ascii"),
    ],
)
async def test_the_native_submit_refuses_another_charset(
    client_a: ApiClient, header: str, named: str
) -> None:
    status, data = await post(client_a, "/v1/batches", NATIVE, header)
    assert status == 415, (status, data)
    assert data == {
        "error": {
            "type": "unsupported_media_type",
            "message": refused(named),
            "param": "Content-Type",
        }
    }


async def test_a_native_retry_body_with_another_charset_is_a_415(client_a: ApiClient) -> None:
    batch = await client_a.submit(NATIVE)
    status, data = await post(
        client_a, f"/v1/batches/{batch['id']}/retry", {}, "application/json; charset=utf-16"
    )
    assert status == 415, (status, data)
    assert data["error"]["message"] == refused("utf-16")
    assert data["error"]["param"] == "Content-Type"


async def test_the_openai_create_refuses_another_charset(client_a: ApiClient) -> None:
    header = "application/json; charset=utf-16"
    status, data = await post(client_a, "/openai/v1/batches", OPENAI, header)
    assert status == 415, (status, data)
    assert data == {
        "error": {
            "message": refused("utf-16"),
            "type": "unsupported_media_type",
            "param": "Content-Type",
            "code": None,
        }
    }


async def test_the_anthropic_create_refuses_another_charset(client_a: ApiClient) -> None:
    header = "application/json; charset=utf-16"
    status, data = await post(client_a, "/anthropic/v1/messages/batches", ANTHROPIC, header)
    assert status == 415, (status, data)
    assert data == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": refused("utf-16")},
    }


@pytest.mark.parametrize(
    "header",
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/json; charset=UTF-8",
        'application/json; charset="utf-8"',
        "application/json;charset=utf8",
    ],
)
async def test_utf_8_or_no_charset_is_accepted(client_a: ApiClient, header: str) -> None:
    status, data = await post(client_a, "/v1/batches", NATIVE, header)
    assert status == 201, (status, data)
    status, data = await post(client_a, "/anthropic/v1/messages/batches", ANTHROPIC, header)
    assert status == 200, (status, data)
