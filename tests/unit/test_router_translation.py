"""The providers' translations of a chat-completions row, both ways: OpenAI-compatible
deployments get the whole request; Anthropic deployments get a Messages request (every
mapping, and a clear refusal of what has none) and their replies come back as chat
completions."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from relay_batches.dialects.anthropic import upstream as anthropic
from relay_batches.dialects.openai import upstream as openai
from relay_batches.router.aliases import Deployment
from relay_batches.router.types import Completion, ProviderReply, UnsupportedRequest

USER = [{"role": "user", "content": "hi"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
PIXEL = "iVBORw0KGgo="


def claude(**params: Any) -> Deployment:
    return Deployment("claude", "anthropic", "http://up/v1", "claude-x", params=params)


def gpt(**params: Any) -> Deployment:
    return Deployment("gpt", "openai", "http://up/v1", "gpt-x", api_key="sk", params=params)


def translate(
    messages: list[dict[str, Any]], deployment: Deployment | None = None, **params: Any
) -> dict[str, Any]:
    return anthropic.translate_body(deployment or claude(), messages, params)


# --- OpenAI-compatible: the whole request --------------------------------------------------


def test_openai_sends_every_message_key_and_row_field_as_given() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "name": "ada",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://x/cat.png", "detail": "low"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    params = {
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_object"},
        "max_tokens": 100,
        "max_completion_tokens": 200,
        "temperature": 1.5,
        "top_p": 0.9,
        "stop": ["END"],
        "seed": 7,
    }
    url, headers, body = openai.build_request(gpt(), messages, params)
    assert url == "http://up/v1/chat/completions"
    assert headers == {"Content-Type": "application/json", "Authorization": "Bearer sk"}
    assert orjson.loads(body) == {**params, "model": "gpt-x", "messages": messages}


@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens"])
def test_openai_a_row_token_limit_replaces_the_deployment_default_of_either_name(
    limit: str,
) -> None:
    deployment = gpt(max_tokens=10, temperature=0.1)
    _, _, body = openai.build_request(deployment, USER, {limit: 99})
    assert orjson.loads(body) == {
        "temperature": 0.1,
        limit: 99,
        "model": "gpt-x",
        "messages": USER,
    }
    _, _, body = openai.build_request(deployment, USER, {})
    assert orjson.loads(body)["max_tokens"] == 10
    _, _, body = openai.build_request(deployment, USER, {"max_completion_tokens": None})
    assert orjson.loads(body)["max_tokens"] == 10  # a null limit is no limit given


def test_openai_reply_with_tool_calls_keeps_the_whole_answer() -> None:
    calls = [{"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    raw = orjson.dumps(
        {
            "model": "gpt-x-2026",
            "choices": [
                {
                    "message": {"role": "assistant", "content": None, "tool_calls": calls},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 4},
        }
    )
    assert openai.parse_reply(raw) == ProviderReply(
        Completion("", 12, 4, calls, "tool_calls", "gpt-x-2026")
    )


# --- Anthropic: the request -----------------------------------------------------------------


def test_anthropic_minimal_request_and_headers() -> None:
    deployment = Deployment(
        "claude", "anthropic", "http://up/v1", "claude-x", api_key="sk-ant", headers={"X-T": "1"}
    )
    url, headers, body = anthropic.build_request(deployment, USER, {})
    assert url == "http://up/v1/messages"
    assert headers == {
        "Content-Type": "application/json",
        "anthropic-version": "2023-06-01",
        "X-T": "1",
        "x-api-key": "sk-ant",
    }
    assert orjson.loads(body) == {"model": "claude-x", "max_tokens": 1024, "messages": USER}


def test_anthropic_system_and_developer_messages_become_the_system_text() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "developer",
            "content": [{"type": "text", "text": "French"}, {"type": "text", "text": "."}],
        },
        {"role": "user", "content": "Hello"},
    ]
    assert translate(messages) == {
        "model": "claude-x",
        "max_tokens": 1024,
        "system": "Be brief.\n\nFrench.",
        "messages": [{"role": "user", "content": "Hello"}],
    }


def test_anthropic_content_parts_become_text_and_image_blocks() -> None:
    parts = [
        {"type": "text", "text": "Compare"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
        {"type": "image_url", "image_url": {"url": "https://x/cat.jpg", "detail": "auto"}},
    ]
    assert translate([{"role": "user", "content": parts}])["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PIXEL},
                },
                {"type": "image", "source": {"type": "url", "url": "https://x/cat.jpg"}},
            ],
        }
    ]


def test_anthropic_tool_calls_and_tool_turns_become_tool_use_and_tool_results() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "call_p",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_r",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_p", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_r", "content": [{"type": "text", "text": "rain"}]},
        {"role": "user", "content": "Thanks, and Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_o",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_o", "content": "snow"},
    ]
    assert translate(messages)["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {
                    "type": "tool_use",
                    "id": "call_p",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "call_r",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_p", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_r",
                    "content": [{"type": "text", "text": "rain"}],
                },
                {"type": "text", "text": "Thanks, and Oslo?"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "call_o",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                }
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "call_o", "content": "snow"}],
        },
    ]


def test_anthropic_tools_become_input_schemas() -> None:
    bare = {"type": "function", "function": {"name": "ping"}}
    assert translate(USER, tools=[WEATHER_TOOL, bare])["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather of a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
        {"name": "ping", "input_schema": {"type": "object", "properties": {}}},
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("none", {"type": "none"}),
        ("auto", {"type": "auto"}),
        ("required", {"type": "any"}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            {"type": "tool", "name": "get_weather"},
        ),
    ],
)
def test_anthropic_tool_choice(choice: Any, expected: dict[str, Any]) -> None:
    assert translate(USER, tools=[WEATHER_TOOL], tool_choice=choice)["tool_choice"] == expected


def test_anthropic_parallel_tool_calls_false_disables_parallel_tool_use() -> None:
    body = translate(USER, tools=[WEATHER_TOOL], parallel_tool_calls=False)
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    body = translate(USER, tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False)
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    body = translate(USER, tools=[WEATHER_TOOL], tool_choice="none", parallel_tool_calls=False)
    assert body["tool_choice"] == {"type": "none"}
    assert "tool_choice" not in translate(USER, tools=[WEATHER_TOOL], parallel_tool_calls=True)
    assert "tool_choice" not in translate(USER, tool_choice="none")


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"stop": "END"}, {"stop_sequences": ["END"]}),
        ({"stop": ["a", "b"]}, {"stop_sequences": ["a", "b"]}),
        ({"temperature": 0.3, "top_p": 0.9}, {"temperature": 0.3, "top_p": 0.9}),
        ({"temperature": 1}, {"temperature": 1}),
        ({"user": "u-42"}, {"metadata": {"user_id": "u-42"}}),
        ({"response_format": {"type": "text"}}, {}),
        ({"seed": None, "stop": None, "response_format": None}, {}),
        ({"n": 1, "logprobs": False, "presence_penalty": 0, "frequency_penalty": 0.0}, {}),
    ],
)
def test_anthropic_sampling_fields(params: dict[str, Any], expected: dict[str, Any]) -> None:
    body = translate(USER, **params)
    assert {k: v for k, v in body.items() if k not in ("model", "max_tokens", "messages")} == (
        expected
    )


@pytest.mark.parametrize(
    ("deployment_params", "params", "max_tokens"),
    [
        ({}, {}, 1024),
        ({}, {"max_tokens": 50}, 50),
        ({}, {"max_completion_tokens": 60}, 60),
        ({}, {"max_tokens": 50, "max_completion_tokens": 60}, 60),
        ({"max_tokens": 300}, {}, 300),
        ({"max_tokens": 300}, {"max_completion_tokens": 70}, 70),
        ({"max_completion_tokens": 300}, {"max_tokens": 80}, 80),
    ],
)
def test_anthropic_max_tokens(
    deployment_params: dict[str, Any], params: dict[str, Any], max_tokens: int
) -> None:
    assert translate(USER, claude(**deployment_params), **params)["max_tokens"] == max_tokens


IMAGE = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}
TOOL_CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}


@pytest.mark.parametrize(
    ("messages", "params", "what"),
    [
        (USER, {"seed": 7}, "seed"),
        (
            USER,
            {"response_format": {"type": "json_object"}},
            "response_format of type 'json_object'",
        ),
        (
            USER,
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format of type 'json_schema'",
        ),
        (USER, {"temperature": 1.5}, "temperature above 1 (got 1.5)"),
        (USER, {"presence_penalty": 0.5}, "presence_penalty"),
        (USER, {"logprobs": True}, "logprobs"),
        (USER, {"n": 2}, "n"),
        (USER, {"logit_bias": {"1": 2}}, "logit_bias"),
        (
            USER,
            {"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]},
            "tools[0].function.strict",
        ),
        (USER, {"tools": [{"type": "custom", "custom": {}}]}, "tools[0] of type 'custom'"),
        (USER, {"tool_choice": "sometimes"}, 'tool_choice "sometimes"'),
        ([{"role": "user", "name": "ada", "content": "hi"}], {}, "messages[0].name"),
        (
            [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
            {},
            "messages[0].content[0] of type 'input_audio'",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image_url",
                            "image_url": {"url": "https://x/a.png", "detail": "high"},
                        }
                    ],
                }
            ],
            {},
            "messages[0].content[0].image_url.detail 'high'",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}
                    ],
                }
            ],
            {},
            "messages[0].content[0].image_url of media type 'image/bmp'",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "ftp://x/a.png"}}],
                }
            ],
            {},
            "messages[0].content[0].image_url.url that is neither http(s) nor a base64 data URL",
        ),
        (
            [{"role": "system", "content": [IMAGE]}, *USER],
            {},
            "messages[0].content[0] (only text is a system prompt)",
        ),
        (
            [*USER, {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}],
            {},
            "messages[1].tool_calls[0].function.arguments that are not a JSON object",
        ),
        (
            [
                *USER,
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            ],
            {},
            "messages[1].content[0] of type 'refusal'",
        ),
        (
            [{"role": "tool", "tool_call_id": "c", "content": [IMAGE]}],
            {},
            "messages[0].content[0] (a tool result holds text only)",
        ),
        ([{"role": "function", "name": None, "content": "x"}], {}, "messages[0].role 'function'"),
    ],
)
def test_anthropic_refuses_what_it_cannot_take_and_names_it(
    messages: list[dict[str, Any]], params: dict[str, Any], what: str
) -> None:
    with pytest.raises(UnsupportedRequest) as refused:
        anthropic.build_request(claude(), messages, params)
    assert str(refused.value) == f"anthropic deployments cannot take {what}"


def test_anthropic_a_deployment_default_is_refused_like_a_row_field() -> None:
    with pytest.raises(UnsupportedRequest, match=r"^anthropic deployments cannot take seed$"):
        translate(USER, claude(seed=1))


# --- Anthropic: the reply -------------------------------------------------------------------


def test_anthropic_reply_text_tool_use_stop_reason_usage_and_model() -> None:
    raw = orjson.dumps(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-x-2026",
            "content": [
                {"type": "text", "text": "Let me check"},
                {"type": "text", "text": "."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 30, "output_tokens": 9},
        }
    )
    call = {
        "id": "toolu_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
    }
    assert anthropic.parse_reply(raw) == ProviderReply(
        Completion("Let me check.", 30, 9, [call], "tool_calls", "claude-x-2026")
    )


def test_anthropic_reply_prompt_tokens_include_the_cached_ones() -> None:
    usage = {
        "input_tokens": 5,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 40,
        "output_tokens": 7,
    }
    raw = orjson.dumps({"content": [{"type": "text", "text": "ok"}], "usage": usage})
    # the prompt tokens read from the cache are noted apart as well
    assert anthropic.parse_reply(raw) == ProviderReply(Completion("ok", 145, 7, cached_tokens=40))


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "stop"),
        ("something_new", None),
        (None, None),
    ],
)
def test_anthropic_stop_reasons(stop_reason: str | None, finish_reason: str | None) -> None:
    raw = orjson.dumps({"content": [{"type": "text", "text": "ok"}], "stop_reason": stop_reason})
    assert anthropic.parse_reply(raw) == ProviderReply(
        Completion("ok", finish_reason=finish_reason)
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"{}",
        b'{"content": [{"type": "text"}]}',
        b'{"content": [{"type": "tool_use", "id": "t", "name": "f"}]}',
    ],
)
def test_anthropic_malformed_reply(raw: bytes) -> None:
    assert anthropic.parse_reply(raw) == ProviderReply(error="malformed response from upstream")


# --- malformed tool calls and refusals in replies ------------------------------------------


def _openai_reply(message: dict[str, Any], finish_reason: Any = "stop") -> bytes:
    return orjson.dumps({"choices": [{"message": message, "finish_reason": finish_reason}]})


@pytest.mark.parametrize(
    "tool_calls",
    [
        [1],
        [{"function": "x"}],
        {"id": "call_1"},
        "call_1",
        [{"id": 7, "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        [{"id": "c", "type": "function", "function": {"name": 3, "arguments": "{}"}}],
        [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
        [{"id": "c", "type": "function", "function": {"name": "f"}}],
        [{"id": "c", "type": "custom", "function": {"name": "f", "arguments": "{}"}}],
        [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
        [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            None,
        ],
    ],
)
def test_openai_reply_with_malformed_tool_calls_is_malformed(tool_calls: Any) -> None:
    raw = _openai_reply({"role": "assistant", "content": None, "tool_calls": tool_calls})
    assert openai.parse_reply(raw) == ProviderReply(error="malformed response from upstream")


def test_openai_reply_tool_calls_keep_only_the_chat_keys() -> None:
    call = {
        "id": "c",
        "type": "function",
        "index": 0,
        "function": {"name": "f", "arguments": "{}", "extra": 1},
    }
    raw = _openai_reply({"role": "assistant", "content": "", "tool_calls": [call]}, "tool_calls")
    canonical = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert openai.parse_reply(raw) == ProviderReply(
        Completion("", tool_calls=[canonical], finish_reason="tool_calls")
    )


def test_openai_refusal_is_kept_as_the_content_with_content_filter() -> None:
    raw = _openai_reply({"role": "assistant", "content": None, "refusal": "I can't help."})
    assert openai.parse_reply(raw) == ProviderReply(
        Completion("I can't help.", finish_reason="content_filter")
    )


def test_openai_refusal_beside_content_leaves_the_content() -> None:
    raw = _openai_reply({"role": "assistant", "content": "ok", "refusal": "no"})
    assert openai.parse_reply(raw) == ProviderReply(Completion("ok", finish_reason="stop"))


@pytest.mark.parametrize("finish_reason", ["abort", "function_call", 3, None])
def test_openai_finish_reason_outside_the_vocabulary_is_dropped(finish_reason: Any) -> None:
    raw = _openai_reply({"role": "assistant", "content": "ok"}, finish_reason)
    assert openai.parse_reply(raw) == ProviderReply(Completion("ok"))


@pytest.mark.parametrize(
    "block",
    [
        {"type": "tool_use", "id": 1, "name": "f", "input": {}},
        {"type": "tool_use", "id": "t", "name": 2, "input": {}},
        {"type": "tool_use", "id": "t", "name": "f", "input": [1]},
        {"type": "tool_use", "id": "t", "name": "f", "input": "{}"},
        {"type": "text", "text": 5},
    ],
)
def test_anthropic_reply_with_malformed_blocks_is_malformed(block: dict[str, Any]) -> None:
    raw = orjson.dumps({"content": [{"type": "text", "text": "hi"}, block]})
    assert anthropic.parse_reply(raw) == ProviderReply(error="malformed response from upstream")
