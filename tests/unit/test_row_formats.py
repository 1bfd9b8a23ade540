"""OpenAI batch lines and Anthropic batch requests translated into stored chat rows."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from relay_batches.services.ingest_api.rows.row_formats import (
    anthropic_request_row,
    openai_line_row,
)
from relay_batches.services.ingest_api.rows.validation import (
    RowError,
    RowInput,
    RowRejected,
    SubmitLimits,
)
from tests.helpers.rows import HI, LIMITS, MODELS


def line(**body: Any) -> dict[str, Any]:
    return {
        "custom_id": "req-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": [HI], **body},
    }


def params(**fields: Any) -> dict[str, Any]:
    return {"model": "claude-haiku", "max_tokens": 100, "messages": [HI], **fields}


def stored(row: RowInput) -> Any:
    return orjson.loads(row.request_json)


def openai_error(value: object) -> RowError:
    with pytest.raises(RowRejected) as caught:
        openai_line_row(4, value, LIMITS, MODELS)
    assert caught.value.error.index == 4
    return caught.value.error


def anthropic_error(value: object) -> RowError:
    with pytest.raises(RowRejected) as caught:
        anthropic_request_row(2, value, LIMITS, MODELS)
    assert caught.value.error.index == 2
    return caught.value.error


# --- OpenAI ----------------------------------------------------------------------------


def test_an_openai_line_becomes_its_body_with_the_model() -> None:
    row = openai_line_row(0, line(temperature=0.2, n=1, stream=False), LIMITS, MODELS)
    assert (row.custom_id, row.model) == ("req-1", "gpt-4o-mini")
    assert row.request_json == (
        '{"messages":[{"content":"hi","role":"user"}],"model":"gpt-4o-mini","n":1,'
        '"stream":false,"temperature":0.2}'
    )


def test_an_openai_line_keeps_tools_and_tool_turns() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "call f"}]},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    row = openai_line_row(0, line(messages=messages, tools=[tool]), LIMITS, MODELS)
    assert stored(row) == {"model": "gpt-4o-mini", "messages": messages, "tools": [tool]}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        pytest.param(
            [1],
            RowError(4, "", "must be a JSON object {custom_id, method, url, body}"),
            id="not-object",
        ),
        pytest.param(
            {**line(), "custom_id": None}, RowError(4, "custom_id", "is required"), id="no-id"
        ),
        pytest.param(
            {**line(), "custom_id": 3}, RowError(4, "custom_id", "must be a string"), id="id-type"
        ),
        pytest.param(
            {**line(), "method": "GET"}, RowError(4, "method", "must be POST"), id="method"
        ),
        pytest.param(
            {**line(), "url": "/v1/images/generations"},
            RowError(
                4,
                "url",
                "must be one of /v1/chat/completions, /v1/embeddings, /v1/completions,"
                " /v1/moderations, /v1/responses (the endpoints Relay runs)",
            ),
            id="url",
        ),
        pytest.param({**line(), "body": None}, RowError(4, "body", "is required"), id="no-body"),
        pytest.param(
            {**line(), "extra": 1},
            RowError(
                4, "extra", "is not a field of a batch line (fields: body, custom_id, method, url)"
            ),
            id="line-key",
        ),
        pytest.param(
            {**line(), "body": {"messages": [HI]}},
            RowError(4, "body.model", "is required"),
            id="no-model",
        ),
        pytest.param(
            line(model="gpt-9"), RowError(4, "body.model", "'gpt-9' is unknown"), id="model"
        ),
        pytest.param(
            line(stream=True),
            RowError(4, "body.stream", "must be false: batch rows are not streamed"),
            id="stream",
        ),
        pytest.param(
            line(stream_options={"include_usage": True}),
            RowError(
                4,
                "body.stream_options",
                "is only for streamed replies: batch rows are not streamed",
            ),
            id="stream-options",
        ),
        pytest.param(line(n=0), RowError(4, "body.n", "must be an integer from 1 to 128"), id="n"),
        pytest.param(
            line(logit_bias={"x": 1}),
            RowError(4, "body.logit_bias", "keys must be token ids (decimal digits)"),
            id="logit-bias",
        ),
        pytest.param(
            line(tools=[{"type": "file_search"}]),
            RowError(4, "body.tools[0].type", "must be 'function'"),
            id="tool-type",
        ),
        pytest.param(
            line(messages=[{"role": "user", "content": 5}]),
            RowError(4, "body.messages[0].content", "must be a string"),
            id="content",
        ),
        pytest.param(
            {**line(), "custom_id": "r\udc00"},
            RowError(4, "custom_id", "must be valid Unicode text"),
            id="surrogate-custom-id",
        ),
        pytest.param(
            {**line(), "\udc00": 1},
            RowError(
                4, "\udc00", "is not a field of a batch line (fields: body, custom_id, method, url)"
            ),
            id="surrogate-key",
        ),
    ],
)
def test_openai_line_errors_name_their_field(value: object, error: RowError) -> None:
    assert openai_error(value) == error


# --- Anthropic -------------------------------------------------------------------------


def test_an_anthropic_request_is_translated_into_a_chat_row() -> None:
    request = {
        "custom_id": "q_1",
        "params": params(
            system=[{"type": "text", "text": "Be terse."}],
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Look:"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                        },
                        {"type": "image", "source": {"type": "url", "url": "https://x.test/b.jpg"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Checking."},
                        {
                            "type": "tool_use",
                            "id": "tu_1",
                            "name": "weather",
                            "input": {"city": "Oslo"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "tu_1",
                            "content": [{"type": "text", "text": "-3C"}],
                        },
                        {"type": "text", "text": "And tomorrow?"},
                    ],
                },
            ],
            tools=[
                {"name": "weather", "description": "Weather", "input_schema": {"type": "object"}}
            ],
            tool_choice={"type": "tool", "name": "weather"},
            stop_sequences=["\n\nHuman:"],
            temperature=0.3,
            top_p=0.8,
        ),
    }
    row = anthropic_request_row(0, request, LIMITS, MODELS)
    assert (row.custom_id, row.model) == ("q_1", "claude-haiku")
    assert stored(row) == {
        "model": "claude-haiku",
        "max_tokens": 100,
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/b.jpg"}},
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "Checking."}],
                "tool_calls": [
                    {
                        "id": "tu_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "tu_1", "content": [{"type": "text", "text": "-3C"}]},
            {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Weather",
                    "parameters": {"type": "object"},
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
        "stop": ["\n\nHuman:"],
        "temperature": 0.3,
        "top_p": 0.8,
    }


@pytest.mark.parametrize(
    ("choice", "translated"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any", "disable_parallel_tool_use": False}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
    ],
)
def test_anthropic_tool_choices_translate(choice: dict[str, object], translated: object) -> None:
    row = anthropic_request_row(
        0, {"custom_id": "a", "params": params(tool_choice=choice)}, LIMITS, MODELS
    )
    assert stored(row)["tool_choice"] == translated


def test_a_string_system_and_plain_turns_stay_strings() -> None:
    row = anthropic_request_row(
        0, {"custom_id": "a", "params": params(system="Be terse.")}, LIMITS, MODELS
    )
    assert row.request_json == (
        '{"max_tokens":100,"messages":[{"content":"Be terse.","role":"system"},'
        '{"content":"hi","role":"user"}],"model":"claude-haiku"}'
    )


def test_an_empty_tool_result_is_an_empty_tool_message() -> None:
    turns = [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
    ]
    row = anthropic_request_row(
        0, {"custom_id": "a", "params": params(messages=turns)}, LIMITS, MODELS
    )
    assert stored(row)["messages"] == [
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "t", "content": ""},
    ]


def block(**fields: Any) -> dict[str, Any]:
    return params(messages=[{"role": "user", "content": [fields]}])


@pytest.mark.parametrize(
    ("value", "error"),
    [
        pytest.param(
            "x", RowError(2, "", "must be a JSON object {custom_id, params}"), id="not-object"
        ),
        pytest.param(
            {"custom_id": "a b", "params": params()},
            RowError(2, "custom_id", "must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -"),
            id="id-chars",
        ),
        pytest.param(
            {"custom_id": "a" * 65, "params": params()},
            RowError(2, "custom_id", "must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -"),
            id="id-long",
        ),
        pytest.param({"params": params()}, RowError(2, "custom_id", "is required"), id="no-id"),
        pytest.param({"custom_id": "a"}, RowError(2, "params", "is required"), id="no-params"),
        pytest.param(
            {"custom_id": "a", "params": params(), "x": 1},
            RowError(2, "x", "is not a field of a request (fields: custom_id, params)"),
            id="key",
        ),
        pytest.param(
            {"custom_id": "a", "params": {"model": "claude-haiku", "messages": [HI]}},
            RowError(2, "params.max_tokens", "is required"),
            id="max-tokens",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(model="claude-9")},
            RowError(2, "params.model", "'claude-9' is unknown"),
            id="model",
        ),
        pytest.param(
            {
                "custom_id": "a",
                "params": params(thinking={"type": "enabled", "budget_tokens": 1024}),
            },
            RowError(
                2,
                "params.thinking",
                "cannot be translated to a chat request (Relay runs rows on any provider)",
            ),
            id="thinking",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(top_k=5)},
            RowError(
                2,
                "params.top_k",
                "cannot be translated to a chat request (Relay runs rows on any provider)",
            ),
            id="top-k",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(metadata={"user_id": "u"})},
            RowError(
                2, "params.metadata", "is not supported: Relay forwards no end-user id to providers"
            ),
            id="metadata",
        ),
        pytest.param(
            {
                "custom_id": "a",
                "params": block(type="text", text="x", cache_control={"type": "ephemeral"}),
            },
            RowError(
                2,
                "params.messages[0].content[0].cache_control",
                "is not supported: Relay does not use prompt caching",
            ),
            id="cache-control",
        ),
        pytest.param(
            {"custom_id": "a", "params": block(type="document", source={})},
            RowError(
                2,
                "params.messages[0].content[0].type",
                "must be one of text, image, tool_use, tool_result",
            ),
            id="document",
        ),
        pytest.param(
            {"custom_id": "a", "params": block(type="tool_result", tool_use_id="t", is_error=True)},
            RowError(2, "params.messages[0].content[0].is_error", "must be False"),
            id="is-error",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(messages=[{"role": "system", "content": "x"}])},
            RowError(2, "params.messages[0].role", "must be 'user' or 'assistant'"),
            id="role",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(tool_choice={"type": "tool"})},
            RowError(2, "params.tool_choice.name", "is required"),
            id="tool-choice-name",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(tool_choice={"type": "auto", "name": "f"})},
            RowError(
                2,
                "params.tool_choice.name",
                "is not a field of an auto tool_choice (fields: disable_parallel_tool_use, type)",
            ),
            id="tool-choice-auto-name",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(tool_choice={"type": "any", "name": "f"})},
            RowError(
                2,
                "params.tool_choice.name",
                "is not a field of an any tool_choice (fields: disable_parallel_tool_use, type)",
            ),
            id="tool-choice-any-name",
        ),
        pytest.param(
            {
                "custom_id": "a",
                "params": params(tool_choice={"type": "none", "disable_parallel_tool_use": False}),
            },
            RowError(
                2,
                "params.tool_choice.disable_parallel_tool_use",
                "is not a field of a none tool_choice (fields: type)",
            ),
            id="tool-choice-none-parallel",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(tool_choice={"type": "tool", "name": ""})},
            RowError(2, "params.tool_choice.name", "must not be empty"),
            id="tool-choice-empty-name",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(tool_choice={"type": "later"})},
            RowError(2, "params.tool_choice.type", "must be one of auto, any, tool, none"),
            id="tool-choice-type",
        ),
        pytest.param(
            {"custom_id": "a", "params": {**params(), "\udc00": 1}},
            RowError(2, "params", "must be valid Unicode text"),
            id="surrogate-key",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(messages=[{**HI, "\udc00": 1}])},
            RowError(2, "params.messages[0]", "must be valid Unicode text"),
            id="surrogate-key-in-message",
        ),
        pytest.param(
            {"custom_id": "a\udc00", "params": params()},
            RowError(2, "custom_id", "must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -"),
            id="surrogate-custom-id",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(tools=[{"name": "f"}])},
            RowError(2, "params.tools[0].input_schema", "is required"),
            id="tool-schema",
        ),
        pytest.param(
            {
                "custom_id": "a",
                "params": params(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
            },
            RowError(2, "params.tools[0].type", "must be 'custom'"),
            id="server-tool",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(temperature=1.5)},
            RowError(2, "params.temperature", "must be a number from 0 to 1"),
            id="temperature",
        ),
        pytest.param(
            {"custom_id": "a", "params": params(stop_sequences=["a"] * 5)},
            RowError(2, "params.stop_sequences", "must hold at most 4 items"),
            id="stop-sequences",
        ),
    ],
)
def test_anthropic_errors_name_their_field(value: object, error: RowError) -> None:
    assert anthropic_error(value) == error


def test_anthropic_content_is_bounded_after_translation() -> None:
    limits = SubmitLimits(max_content_bytes=4)
    with pytest.raises(RowRejected) as caught:
        anthropic_request_row(
            0,
            {"custom_id": "a", "params": params(messages=[{"role": "user", "content": "12345"}])},
            limits,
            MODELS,
        )
    assert caught.value.error == RowError(
        0, "params.messages[0].content", "must be at most 4 bytes of UTF-8"
    )


def test_a_tool_use_input_is_bounded_in_depth() -> None:
    deep: dict[str, Any] = {}
    for _ in range(300):
        deep = {"a": deep}
    turns = [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": deep}],
        }
    ]
    error = anthropic_error({"custom_id": "a", "params": params(messages=turns)})
    assert error == RowError(
        2,
        "params.messages[0].content[0].input",
        "must nest at most 32 levels of objects and arrays",
    )


def test_an_openai_line_over_the_content_limit_is_refused() -> None:
    limits = SubmitLimits(max_content_bytes=4)
    assert openai_line_row(0, line(), limits, MODELS).custom_id == "req-1"  # "hi" fits
    with pytest.raises(RowRejected) as caught:
        openai_line_row(1, line(messages=[{"role": "user", "content": "12345"}]), limits, MODELS)
    assert caught.value.error == RowError(
        1, "body.messages[0].content", "must be at most 4 bytes of UTF-8"
    )
