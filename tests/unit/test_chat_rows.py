"""Rich native rows (chat_rows models through ``validate_submit``): what is accepted and
how it is stored, and that every error names its field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from relay_batches.dialects.chat import PARAM_FIELDS, RequestRow, check_row, stored_request
from relay_batches.errors import ApiError
from relay_batches.services.ingest_api.rows.validation import (
    RowInput,
    SubmitLimits,
    scan_submit,
    validate_submit,
)
from tests.helpers.rows import HI, LIMITS, MODELS

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}


def one_row(row: dict[str, Any], limits: SubmitLimits = LIMITS) -> RowInput:
    """The single row of a submission, checked identically by both entry points."""
    payload = {"model": "gpt-4o-mini", "requests": [row]}
    spec = validate_submit(payload, limits, MODELS)
    assert scan_submit(orjson.dumps(payload), limits, MODELS) == spec
    return spec.rows[0]


def refused(row: dict[str, Any], limits: SubmitLimits = LIMITS) -> ApiError:
    payload = {"model": "gpt-4o-mini", "requests": [{"messages": [HI]}, row]}
    with pytest.raises(ApiError) as caught:
        validate_submit(payload, limits, MODELS)
    with pytest.raises(ApiError) as scanned:
        scan_submit(orjson.dumps(payload), limits, MODELS)
    assert scanned.value == caught.value
    assert caught.value.status == 400
    return caught.value


def test_content_parts_tools_and_tool_turns_are_stored_whole_in_sorted_object_form() -> None:
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Be terse."}]},
        {
            "role": "user",
            "name": "ann",
            "content": [
                {"type": "text", "text": "What is in this image, and the weather?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "https://x.test/a.png", "detail": "low"},
                },
            ],
        },
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    row = {
        "custom_id": "rich",
        "model": "claude-haiku",
        "messages": messages,
        "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_object"},
        "max_completion_tokens": 64,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["END"],
        "seed": 7,
    }
    stored = one_row(row)
    assert (stored.custom_id, stored.model) == ("rich", "claude-haiku")
    expected = {k: v for k, v in row.items() if k != "custom_id"}
    expected["messages"] = [
        messages[0],
        messages[1],
        {k: v for k, v in messages[2].items() if k != "content"},
        messages[3],
    ]
    assert orjson.loads(stored.request_json) == expected
    assert stored.request_json == orjson.dumps(expected, option=orjson.OPT_SORT_KEYS).decode()


def test_a_plain_row_stays_a_bare_array_and_a_row_field_makes_it_an_object() -> None:
    assert one_row({"messages": [HI]}).request_json == '[{"content":"hi","role":"user"}]'
    with_param = one_row({"messages": [HI], "max_tokens": 5})
    assert with_param.request_json == '{"max_tokens":5,"messages":[{"content":"hi","role":"user"}]}'
    assert with_param.model is None
    nulls = one_row({"messages": [HI], "model": None, "temperature": None})
    assert nulls.request_json == '[{"content":"hi","role":"user"}]'


def test_a_row_model_is_kept_as_the_rows_own() -> None:
    row = one_row({"messages": [HI], "model": "claude-haiku"})
    assert row.model == "claude-haiku"
    assert (
        row.request_json == '{"messages":[{"content":"hi","role":"user"}],"model":"claude-haiku"}'
    )


def test_stored_request_sorts_keys_and_drops_custom_id() -> None:
    text = stored_request(
        {"custom_id": "x", "seed": 1, "messages": [{"role": "user", "content": "a"}]}
    )
    assert text == '{"messages":[{"content":"a","role":"user"}],"seed":1}'


@pytest.mark.parametrize(
    ("row", "param", "message"),
    [
        pytest.param(
            {"messages": [HI], "model": "gpt-9"},
            "requests[1].model",
            "requests[1].model 'gpt-9' is unknown",
            id="unknown-model",
        ),
        pytest.param(
            {"messages": [HI], "model": 5},
            "requests[1].model",
            "requests[1].model must be a string",
            id="model-type",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": [{"type": "audio"}]}]},
            "requests[1].messages[0].content[0].type",
            "requests[1].messages[0].content[0].type must be one of text, image_url",
            id="part-type",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "requests[1].messages[0].content[0].text",
            "requests[1].messages[0].content[0].text is required",
            id="part-text",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": []}]},
            "requests[1].messages[0].content",
            "requests[1].messages[0].content must be a non-empty array",
            id="no-parts",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "requests[1].messages[0].content[0].image_url.url",
            "requests[1].messages[0].content[0].image_url.url is required",
            id="image-url",
        ),
        pytest.param(
            {
                "messages": [
                    {
                        "role": "system",
                        "content": [{"type": "image_url", "image_url": {"url": "u"}}],
                    }
                ]
            },
            "requests[1].messages[0].content[0].image_url",
            "requests[1].messages[0].content[0].image_url is not a field of a text part"
            " (fields: text, type)",
            id="system-image",
        ),
        pytest.param(
            {"messages": [{"role": "assistant"}]},
            "requests[1].messages[0].content",
            "requests[1].messages[0].content is required unless tool_calls is given",
            id="assistant-empty",
        ),
        pytest.param(
            {"messages": [{"role": "assistant", "tool_calls": [{**CALL, "type": "web"}]}]},
            "requests[1].messages[0].tool_calls[0].type",
            "requests[1].messages[0].tool_calls[0].type must be 'function'",
            id="call-type",
        ),
        pytest.param(
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}],
                    }
                ]
            },
            "requests[1].messages[0].tool_calls[0].function.arguments",
            "requests[1].messages[0].tool_calls[0].function.arguments must be a string",
            id="call-arguments",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": "x", "tool_call_id": "a"}]},
            "requests[1].messages[0].tool_call_id",
            "requests[1].messages[0].tool_call_id is not a field of a user message"
            " (fields: content, name, role)",
            id="user-tool-call-id",
        ),
        pytest.param(
            {"messages": [HI], "tools": [{"type": "code_interpreter"}]},
            "requests[1].tools[0].type",
            "requests[1].tools[0].type must be 'function'",
            id="tool-type",
        ),
        pytest.param(
            {"messages": [HI], "tools": [{"type": "function", "function": {"name": "a b"}}]},
            "requests[1].tools[0].function.name",
            "requests[1].tools[0].function.name must match ^[a-zA-Z0-9_-]+$",
            id="tool-name",
        ),
        pytest.param(
            {
                "messages": [HI],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}],
            },
            "requests[1].tools[0].function.parameters",
            "requests[1].tools[0].function.parameters must be an object",
            id="tool-parameters",
        ),
        pytest.param(
            {"messages": [HI], "tool_choice": "any"},
            "requests[1].tool_choice",
            "requests[1].tool_choice must be 'none', 'auto' or 'required'",
            id="tool-choice",
        ),
        pytest.param(
            {"messages": [HI], "tool_choice": {"type": "function", "function": {"nam": "f"}}},
            "requests[1].tool_choice.function.nam",
            "requests[1].tool_choice.function.nam is not a field of a tool_choice function"
            " (fields: name)",
            id="tool-choice-key",
        ),
        pytest.param(
            {"messages": [HI], "response_format": {"type": "xml"}},
            "requests[1].response_format.type",
            "requests[1].response_format.type must be one of json_object, json_schema, text",
            id="response-format",
        ),
        pytest.param(
            {"messages": [HI], "max_completion_tokens": 0},
            "requests[1].max_completion_tokens",
            "requests[1].max_completion_tokens must be an integer from 1 to 1000000",
            id="max-completion-tokens",
        ),
        pytest.param(
            {"messages": [HI], "temperature": "hot"},
            "requests[1].temperature",
            "requests[1].temperature must be a number",
            id="temperature",
        ),
        pytest.param(
            {"messages": [HI], "best_of": 2},
            "requests[1].best_of",
            "requests[1].best_of is not a field of a request (fields: "
            + ", ".join(sorted({*PARAM_FIELDS, "custom_id", "messages", "model"}))
            + ")",
            id="unknown-row-key",
        ),
    ],
)
def test_every_error_names_its_field(row: dict[str, Any], param: str, message: str) -> None:
    err = refused(row)
    assert (err.param, err.message) == (param, message)


def test_content_parts_count_their_text_bytes_together() -> None:
    limits = SubmitLimits(max_content_bytes=8)
    parts = [{"type": "text", "text": "1234"}, {"type": "text", "text": "5678"}]
    assert one_row({"messages": [{"role": "user", "content": parts}]}, limits)
    parts.append({"type": "text", "text": "9"})
    err = refused({"messages": [{"role": "user", "content": parts}]}, limits)
    assert (err.param, err.message) == (
        "requests[1].messages[0].content",
        "requests[1].messages[0].content must be at most 8 bytes of UTF-8",
    )


def test_tool_parameters_are_bounded_like_params_schemas() -> None:
    deep: dict[str, Any] = {}
    for _ in range(40):
        deep = {"a": deep}
    tool = {"type": "function", "function": {"name": "f", "parameters": deep}}
    err = refused({"messages": [HI], "tools": [tool]})
    assert err.param == "requests[1].tools[0].function.parameters"
    assert err.message.endswith("must nest at most 32 levels of objects and arrays")
    big = {"type": "function", "function": {"name": "f", "parameters": {"d": "x" * 70_000}}}
    err = refused({"messages": [HI], "tools": [big]})
    assert err.message == "requests[1].tools[0].function.parameters must be at most 65536 bytes"


def test_job_params_take_the_row_parameters_too() -> None:
    payload = {
        "model": "gpt-4o-mini",
        "requests": [{"messages": [HI]}],
        "params": {"tools": [TOOL], "tool_choice": "required"},
    }
    spec = validate_submit(payload, LIMITS, MODELS)
    assert orjson.loads(spec.options.params_json) == {"tools": [TOOL], "tool_choice": "required"}


@pytest.mark.parametrize(
    ("row", "param"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a\ud800"}]}]},
            "requests[1].messages[0].content[0].text",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "name": "\udfff"}]},
            "requests[1].messages[0].name",
        ),
        ({"messages": [HI], "stop": ["\ud800"]}, "requests[1].stop[0]"),
        ({"messages": [HI], "\udc00": 1}, "requests[1]"),
        ({"messages": [{**HI, "\udc00": 1}]}, "requests[1].messages[0]"),
        (
            {"messages": [HI], "response_format": {"type": "text", "\udc00": 1}},
            "requests[1].response_format",
        ),
    ],
)
def test_a_lone_surrogate_anywhere_is_a_400_naming_it(row: dict[str, Any], param: str) -> None:
    payload = {"model": "gpt-4o-mini", "requests": [{"messages": [HI]}, row]}
    with pytest.raises(ApiError) as caught:
        validate_submit(payload, LIMITS, MODELS)
    assert (caught.value.param, caught.value.message) == (
        param,
        f"{param} must be valid Unicode text",
    )


PLAIN_ROWS = [
    {"messages": [HI]},
    {"custom_id": "x", "messages": [{"content": "a", "role": "system"}, HI]},
    {"messages": [{"role": role, "content": "é😀"} for role in ("developer", "assistant")]},
    {"custom_id": "c" * 256, "messages": [{"role": "user", "content": ""}]},
]


@pytest.mark.parametrize("row", PLAIN_ROWS)
def test_the_fast_check_and_the_model_agree_on_plain_rows(row: dict[str, Any]) -> None:
    fast = one_row(row)
    assert check_row(RequestRow, row, LIMITS.max_content_bytes, MODELS) is None
    assert fast.request_json == stored_request(row)
    assert fast.model is None


@pytest.mark.parametrize(
    "row",
    [
        {"messages": [{"role": "user", "content": "x" * 9}]},
        {"custom_id": "c" * 257, "messages": [HI]},
        {"custom_id": "a\x00", "messages": [HI]},
        {"messages": [{"role": "robot", "content": "x"}]},
    ],
)
def test_what_the_fast_check_refuses_the_model_refuses(row: dict[str, Any]) -> None:
    limits = SubmitLimits(max_content_bytes=8)
    problem = check_row(RequestRow, row, limits.max_content_bytes, MODELS)
    assert problem is not None
    err = refused(row, limits)
    assert err.param == f"requests[1].{problem[0]}"
    assert err.message == f"requests[1].{problem[0]} {problem[1]}"
