"""Unit tests of the upstream simulator's Anthropic Messages endpoint over real HTTP
(aiohttp TestServer + TestClient)."""

from __future__ import annotations

import re

import pytest

from tests.unit.test_upstream_sim import (
    CHAT,
    OSLO,
    Client,
    call_stats,
    calls_counted,
    chat,
    client,
    make_client,
    tool_call_digest,
)

__all__ = ["client", "make_client"]  # the simulator fixtures of the realtime tests, shared

MESSAGES = "/v1/messages"
ANTHROPIC_HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}


def messages_body(*turns: dict, **fields: object) -> dict:
    """A Messages body with ``turns`` (default: one user turn saying hello)."""
    return {
        "model": "claude-sim",
        "max_tokens": 100,
        "messages": list(turns) or [{"role": "user", "content": "hello"}],
        **fields,
    }


async def post_messages(
    client: Client, body: object, headers: dict[str, str] | None = None
) -> tuple[int, dict]:
    async with client.post(
        MESSAGES, json=body, headers=ANTHROPIC_HEADERS if headers is None else headers
    ) as response:
        return response.status, await response.json()


async def test_messages_reply_shape(client: Client) -> None:
    body = messages_body(
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": [{"type": "text", "text": "an answer"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look "},
                {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                },
                {"type": "text", "text": "here"},
            ],
        },
        system="be brief",
        temperature=0.5,
        stop_sequences=["END"],
    )
    status, reply = await post_messages(client, body)
    assert status == 200
    assert re.fullmatch(r"msg_[0-9a-f]{24}", reply.pop("id"))
    # input: "be brief"=2, "first"=2, "an answer"=3, "look here"=3; "echo: look here"=4
    assert reply == {
        "type": "message",
        "role": "assistant",
        "model": "claude-sim",
        "content": [{"type": "text", "text": "echo: look here"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 4},
    }


async def test_messages_tool_call_trigger_and_tool_results(client: Client) -> None:
    tools = [
        {"name": "get_weather", "input_schema": {"type": "object"}},
        {"name": "other", "input_schema": {"type": "object"}},
    ]
    status, reply = await post_messages(
        client, messages_body({"role": "user", "content": OSLO}, tools=tools)
    )
    assert status == 200
    assert (reply["content"], reply["stop_reason"]) == (
        [
            {
                "type": "tool_use",
                "id": "toolu_" + tool_call_digest(OSLO, "get_weather"),
                "name": "get_weather",
                "input": {"text": OSLO},
            }
        ],
        "tool_use",
    )
    named = messages_body(
        {"role": "user", "content": OSLO},
        tools=tools,
        tool_choice={"type": "tool", "name": "other"},
    )
    assert (await post_messages(client, named))[1]["content"][0]["name"] == "other"
    none = messages_body(
        {"role": "user", "content": OSLO}, tools=tools, tool_choice={"type": "none"}
    )
    assert (await post_messages(client, none))[1]["content"] == [
        {"type": "text", "text": "echo: " + OSLO}
    ]
    answered = messages_body(
        {"role": "user", "content": OSLO},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}},
                {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "snow"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": [{"type": "text", "text": ", sun"}],
                },
            ],
        },
        tools=tools,
    )
    status, reply = await post_messages(client, answered)
    assert (status, reply["content"], reply["stop_reason"]) == (
        200,
        [{"type": "text", "text": "echo: snow, sun"}],
        "end_turn",
    )


def _error(kind: str, message: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


async def test_messages_need_the_api_key_and_version_headers(client: Client) -> None:
    assert await post_messages(client, messages_body(), {"anthropic-version": "2023-06-01"}) == (
        401,
        _error("authentication_error", "x-api-key header is required"),
    )
    assert await post_messages(client, messages_body(), {"x-api-key": "k"}) == (
        400,
        _error("invalid_request_error", "anthropic-version: header is required"),
    )


USE_BLOCK = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
USE = {"role": "assistant", "content": [USE_BLOCK]}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (messages_body(seed=1), "seed: Extra inputs are not permitted"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
            "model: Field required",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            "max_tokens: Field required (an integer of at least 1)",
        ),
        (messages_body(stream=True), "stream: the simulator does not stream"),
        (messages_body(temperature=1.5), "temperature: Input should be a number from 0 to 1"),
        (messages_body(stop_sequences="END"), "stop_sequences: Input should be a list of strings"),
        (
            messages_body(system=[{"type": "image"}]),
            "system: Input should be a string or a list of text blocks",
        ),
        (
            messages_body({"role": "system", "content": "x"}),
            "messages.0.role: Input should be 'user' or 'assistant'",
        ),
        (
            messages_body({"role": "user", "content": []}),
            "messages.0.content: Input should be a string or a list of blocks",
        ),
        (
            messages_body({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}),
            "messages.0.content.0: not a valid user content block",
        ),
        (
            messages_body({"role": "user", "content": [USE_BLOCK]}),
            "messages.0.content.0: not a valid user content block",
        ),
        (
            messages_body(
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f"}]},
            ),
            "messages.1.content.0: a tool_use block needs id, name and an input object",
        ),
        (
            messages_body(
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9"}]}
            ),
            "messages.0: unexpected tool_use_id found in tool_result blocks: t9",
        ),
        (
            messages_body(
                {"role": "user", "content": "x"}, USE, {"role": "user", "content": "no result"}
            ),
            "messages.2: tool_use ids were found without tool_result blocks immediately after: t1",
        ),
        (
            messages_body({"role": "user", "content": "x"}, tools=[{"name": "f"}]),
            "tools: each tool needs a name and an object input_schema",
        ),
        (
            messages_body(
                {"role": "user", "content": "x"},
                tools=[{"name": "f", "input_schema": {"type": "object"}}],
                tool_choice={"type": "tool"},
            ),
            "tool_choice: Input should be auto, any, tool (with a name) or none",
        ),
    ],
)
async def test_invalid_messages_requests_are_400(client: Client, body: dict, message: str) -> None:
    assert await post_messages(client, body) == (400, _error("invalid_request_error", message))


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (529, "overloaded_error"),
    ],
)
async def test_messages_triggers_answer_in_the_anthropic_error_shape(
    client: Client, status: int, kind: str
) -> None:
    body = messages_body({"role": "user", "content": f"x [sim:status={status}]"})
    assert await post_messages(client, body) == (status, _error(kind, f"simulated status {status}"))


async def test_messages_fail_first_and_retry_after_and_the_shared_stats(client: Client) -> None:
    body = messages_body({"role": "user", "content": "x [sim:retry-after=2]"})
    async with client.post(MESSAGES, json=body, headers=ANTHROPIC_HEADERS) as response:
        assert (response.status, response.headers["Retry-After"]) == (429, "2")
    assert (await post_messages(client, body))[0] == 200
    async with client.post(CHAT, json=chat("hi")) as response:
        assert response.status == 200
    assert await call_stats(client) == calls_counted(3, ok=2, errors=1, throttled=0)
