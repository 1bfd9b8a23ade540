"""The model router against the upstream simulator (its chat completions and Messages
endpoints) and an Anthropic-shaped fake, over real loopback HTTP: retries, fallback, dead
letters, permanent failures, timeouts, and whole chat rows (content parts, tools, tool
turns) through both providers."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from relay_batches.router.aliases import AliasTable, parse_aliases
from relay_batches.router.cooldown import CooldownPolicy, Cooldowns
from relay_batches.router.http1 import Http1Client
from relay_batches.router.policy import BackoffPolicy
from relay_batches.router.router import ModelRouter
from relay_batches.services.upstream_sim.app import build_app
from relay_batches.services.upstream_sim.config import SimConfig

USER = [{"role": "user", "content": "hello"}]


async def _serve(app: web.Application) -> TestServer:
    server = TestServer(app, handler_cancellation=True)
    await server.start_server()
    return server


@pytest.fixture
async def sim() -> AsyncIterator[TestServer]:
    """A healthy simulator."""
    server = await _serve(build_app(SimConfig()))
    yield server
    await server.close()


@pytest.fixture
async def broken_sim() -> AsyncIterator[TestServer]:
    """A simulator that answers 503 to every call."""
    server = await _serve(build_app(SimConfig(error_rate=1.0, seed=1)))
    yield server
    await server.close()


@pytest.fixture
async def session() -> AsyncIterator[Http1Client]:
    """The router's HTTP client."""
    client = Http1Client()
    yield client
    await client.close()


def _deployment(server: TestServer, **extra: Any) -> dict[str, Any]:
    return {
        "provider": "openai",
        "base_url": str(server.make_url("/v1")),
        "model": "sim-echo",
        "timeout_s": 5,
        "max_retries": 3,
        **extra,
    }


def _aliases(deployments: dict[str, dict[str, Any]], order: list[str]) -> AliasTable:
    return parse_aliases({"aliases": {"m": {"deployments": order}}, "deployments": deployments}, {})


def _router(aliases: AliasTable, session: Http1Client) -> ModelRouter:
    return ModelRouter(
        aliases,
        session,
        BackoffPolicy(base_s=0.001, cap_s=0.01),
        rng=random.Random(7),
        cooldowns=Cooldowns(CooldownPolicy(threshold=1000)),
    )


def _user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


async def test_two_503s_then_success_completes_with_three_attempts(
    sim: TestServer, session: Http1Client
) -> None:
    router = _router(_aliases({"a": _deployment(sim)}, ["a"]), session)
    result = await router.complete("m", _user("retry me [sim:fail-first=2]"), {})
    assert result.completion is not None
    assert result.completion.content == "echo: retry me [sim:fail-first=2]"
    assert (result.attempts, result.deployment, result.error) == (3, "a", None)


async def test_429_with_retry_after_is_retried(sim: TestServer, session: Http1Client) -> None:
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    router = ModelRouter(
        _aliases({"a": _deployment(sim)}, ["a"]),
        session,
        BackoffPolicy(base_s=0.001, cap_s=2.0),
        sleep=sleep,
    )
    result = await router.complete("m", _user("slow down [sim:retry-after=1]"), {})
    assert result.completion is not None
    assert result.attempts == 2
    assert slept == [1.0]


async def test_always_503_on_a_falls_back_to_b(
    sim: TestServer, broken_sim: TestServer, session: Http1Client
) -> None:
    aliases = _aliases({"a": _deployment(broken_sim), "b": _deployment(sim)}, ["a", "b"])
    result = await _router(aliases, session).complete("m", USER, {})
    assert result.completion is not None
    assert result.completion.content == "echo: hello"
    assert result.deployment == "b"
    assert result.attempts == 4 + 1


async def test_failing_on_every_deployment_is_dead_lettered(
    broken_sim: TestServer, session: Http1Client
) -> None:
    aliases = _aliases(
        {"a": _deployment(broken_sim, max_retries=1), "b": _deployment(broken_sim)}, ["a", "b"]
    )
    result = await _router(aliases, session).complete("m", USER, {})
    assert result.completion is None
    assert result.dead_letter is True
    assert result.attempts == 2 + 4
    assert result.error is not None
    assert result.error.startswith("upstream_error: b: HTTP 503")


async def test_a_400_fails_at_once_without_dead_letter(
    sim: TestServer, session: Http1Client
) -> None:
    aliases = _aliases({"a": _deployment(sim)}, ["a"])
    result = await _router(aliases, session).complete("m", _user("bad [sim:status=400]"), {})
    assert result.completion is None
    assert (result.attempts, result.dead_letter) == (1, False)
    assert result.error is not None
    assert result.error.startswith("upstream_error: a: HTTP 400")


async def test_a_hanging_upstream_is_cut_at_timeout(sim: TestServer, session: Http1Client) -> None:
    aliases = _aliases({"a": _deployment(sim, timeout_s=0.3, max_retries=1)}, ["a"])
    result = await _router(aliases, session).complete("m", _user("wait [sim:hang]"), {})
    assert result.completion is None
    assert result.attempts == 2
    assert result.dead_letter is True
    assert result.error == "upstream_error: a: timed out after 0.3s"


async def test_usage_and_params_reach_the_upstream(session: Http1Client) -> None:
    seen: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(orjson.loads(await request.read()))
        return web.json_response(
            {
                "choices": [{"message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 3},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    server = await _serve(app)
    try:
        deployment = _deployment(server, params={"temperature": 0.1, "max_tokens": 50})
        router = _router(_aliases({"a": deployment}, ["a"]), session)
        result = await router.complete("m", USER, {"temperature": 0.7, "seed": 5})
    finally:
        await server.close()
    assert result.completion is not None
    assert (result.completion.prompt_tokens, result.completion.completion_tokens) == (11, 3)
    assert seen == [
        {"temperature": 0.7, "max_tokens": 50, "seed": 5, "model": "sim-echo", "messages": USER}
    ]


async def test_anthropic_messages_shape_over_http(session: Http1Client) -> None:
    seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def messages(request: web.Request) -> web.Response:
        seen.append((dict(request.headers), orjson.loads(await request.read())))
        return web.json_response(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Bonjour"},
                    {"type": "text", "text": " !"},
                ],
                "usage": {"input_tokens": 21, "output_tokens": 4},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    server = await _serve(app)
    aliases = parse_aliases(
        {
            "aliases": {"claude": {"deployments": ["anthropic"]}},
            "deployments": {
                "anthropic": {
                    "provider": "anthropic",
                    "base_url": str(server.make_url("/v1")),
                    "model": "claude-x",
                    "api_key_env": "ANTHROPIC_KEY",
                }
            },
        },
        {"ANTHROPIC_KEY": "sk-ant-test"},
    )
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "French."},
        {"role": "user", "content": "Hello"},
    ]
    try:
        result = await _router(aliases, session).complete(
            "claude", chat, {"temperature": 0.2, "stop": "END", "max_completion_tokens": 64}
        )
    finally:
        await server.close()
    assert result.completion is not None
    assert result.completion.content == "Bonjour !"
    assert (result.completion.prompt_tokens, result.completion.completion_tokens) == (21, 4)
    [(headers, body)] = seen
    assert headers["x-api-key"] == "sk-ant-test"
    assert headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in headers
    assert body == {
        "model": "claude-x",
        "max_tokens": 64,
        "system": "Be brief.\n\nFrench.",
        "messages": [{"role": "user", "content": "Hello"}],
        "temperature": 0.2,
        "stop_sequences": ["END"],
    }


# --- whole chat rows through both providers ---------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASK = "weather in Oslo? [sim:tool-call]"
TOOLS = {"tools": [WEATHER], "tool_choice": "auto"}


def _both(sim: TestServer) -> AliasTable:
    """Alias ``gpt`` on the simulator's chat endpoint, ``claude`` on its Messages one,
    ``claude-or-gpt`` trying Claude first."""
    claude = {
        **_deployment(sim, provider="anthropic", model="sim-claude"),
        "headers": {"x-api-key": "sim"},
    }
    return parse_aliases(
        {
            "aliases": {
                "gpt": {"deployments": ["gpt"]},
                "claude": {"deployments": ["claude"]},
                "claude-or-gpt": {"deployments": ["claude", "gpt"]},
            },
            "deployments": {"gpt": _deployment(sim), "claude": claude},
        },
        {},
    )


ASKING = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": ASK}]},
]


def _answer_turns(call: dict[str, Any], result: str) -> list[dict[str, Any]]:
    return [
        *ASKING,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": result},
    ]


@pytest.mark.parametrize(
    ("alias", "model", "call_prefix"),
    [("gpt", "sim-echo", "call_"), ("claude", "sim-claude", "toolu_")],
)
async def test_a_tool_call_then_its_answer_through_each_provider(
    sim: TestServer, session: Http1Client, alias: str, model: str, call_prefix: str
) -> None:
    router = _router(_both(sim), session)
    first = await router.complete(alias, ASKING, TOOLS)
    assert first.completion is not None and first.error is None
    assert (first.deployment, first.attempts) == (alias, 1)
    (call,) = first.completion.tool_calls or []
    assert call["id"].startswith(call_prefix)
    assert call == {
        "id": call["id"],
        "type": "function",
        "function": {"name": "get_weather", "arguments": orjson.dumps({"text": ASK}).decode()},
    }
    assert (first.completion.content, first.completion.finish_reason) == ("", "tool_calls")
    assert first.completion.model == model
    assert first.completion.prompt_tokens > 0 and first.completion.completion_tokens > 0

    second = await router.complete(alias, _answer_turns(call, "snow, -3C"), TOOLS)
    assert second.completion is not None
    assert (second.completion.content, second.completion.tool_calls) == ("echo: snow, -3C", None)
    assert (second.completion.finish_reason, second.completion.model) == ("stop", model)


async def test_consecutive_tool_turns_and_a_user_turn_reach_claude_as_one_user_turn(
    sim: TestServer, session: Http1Client
) -> None:
    calls = [
        {
            "id": f"call_{city}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": orjson.dumps({"city": city}).decode()},
        }
        for city in ("Oslo", "Rome")
    ]
    messages = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": "Checking both.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_Oslo", "content": "snow"},
        {
            "role": "tool",
            "tool_call_id": "call_Rome",
            "content": [{"type": "text", "text": "+sun"}],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "+and this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            ],
        },
    ]
    result = await _router(_both(sim), session).complete("claude", messages, TOOLS)
    assert result.completion is not None, result.error
    # the simulator echoes the last user turn's text: both tool results and the text part
    assert result.completion.content == "echo: snow+sun+and this?"
    assert result.completion.finish_reason == "stop"


async def test_content_parts_are_echoed_through_both_providers(
    sim: TestServer, session: Http1Client
) -> None:
    parts = [
        {"type": "text", "text": "describe "},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "text", "text": "this"},
    ]
    router = _router(_both(sim), session)
    for alias in ("gpt", "claude"):
        result = await router.complete(alias, [{"role": "user", "content": parts}], {})
        assert result.completion is not None, result.error
        assert result.completion.content == "echo: describe this"


async def test_a_field_claude_cannot_take_falls_through_to_the_openai_deployment(
    sim: TestServer, session: Http1Client
) -> None:
    router = _router(_both(sim), session)
    params = {**TOOLS, "seed": 7, "response_format": {"type": "json_object"}}
    result = await router.complete("claude-or-gpt", _user("hi [sim:tool-call]"), params)
    assert result.completion is not None
    assert (result.deployment, result.attempts, result.completion.finish_reason) == (
        "gpt",
        1,
        "tool_calls",
    )
    alone = await router.complete("claude", _user("hi"), {"seed": 7})
    assert (alone.completion, alone.attempts, alone.dead_letter, alone.error) == (
        None,
        0,
        False,
        "upstream_error: claude: anthropic deployments cannot take seed",
    )
    async with aiohttp.ClientSession() as http, http.get(sim.make_url("/stats")) as stats:
        assert (await stats.json())["calls"] == 1
