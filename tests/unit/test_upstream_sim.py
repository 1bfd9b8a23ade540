"""Unit tests of the upstream simulator over real HTTP (aiohttp TestServer + TestClient)."""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from relay_batches.services.upstream_sim.__main__ import main, options_from_env
from relay_batches.services.upstream_sim.app import STATE_KEY, build_app
from relay_batches.services.upstream_sim.config import HANG_SECONDS, SimConfig, Sleep
from relay_batches.services.upstream_sim.echo import estimate_tokens
from relay_batches.services.upstream_sim.faults import NO_TRIGGERS, Triggers, parse_triggers
from relay_batches.services.upstream_sim.state import SimState
from relay_batches.settings import ConfigError

CHAT = "/v1/chat/completions"
# Nor a flex call (service_tier "flex").
NO_BATCHES = {
    "batches_created": 0,
    "batch_rows": 0,
    "batch_rows_repeated": 0,
    "flex_calls": 0,
    "flex_refused": 0,
}
Client = TestClient[aiohttp.web.Request, aiohttp.web.Application]
MakeClient = Callable[..., Awaitable[Client]]


def calls_counted(calls: int, *, ok: int, errors: int, throttled: int) -> dict[str, int]:
    """The simulator's ``/stats`` after ``calls`` chat calls and no batch."""
    return {"calls": calls, "ok": ok, "errors": errors, "throttled": throttled, **NO_BATCHES}


async def call_stats(client: Client) -> Any:
    """The simulator's ``/stats``."""
    async with client.get("/stats") as response:
        return await response.json()


class SleepRecorder:
    """A stand-in for asyncio.sleep that records the durations and returns at once."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
async def make_client() -> AsyncIterator[MakeClient]:
    """Start simulator apps on free ports; close every client (and server) afterwards."""
    clients: list[Client] = []

    async def make(
        config: SimConfig | None = None,
        *,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.time,
    ) -> Client:
        app = build_app(config or SimConfig(), sleep=sleep, clock=clock)
        client: Client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
async def client(make_client: MakeClient) -> Client:
    """A simulator with default settings and instant sleeps."""
    return await make_client(sleep=SleepRecorder())


def chat(*contents: str, roles: tuple[str, ...] | None = None, model: str = "m-1") -> dict:
    """A chat completions body; every message is a user message unless ``roles`` says."""
    roles = roles or ("user",) * len(contents)
    messages = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)]
    return {"model": model, "messages": messages}


async def post_statuses(client: Client, body: dict, times: int) -> list[int]:
    """POST ``body`` ``times`` times in sequence; return the statuses."""
    statuses = []
    for _ in range(times):
        async with client.post(CHAT, json=body) as response:
            await response.read()
            statuses.append(response.status)
    return statuses


def sim_error(status: int) -> dict:
    return {"error": {"message": f"simulated status {status}", "type": "sim_error"}}


# --- pure functions ----------------------------------------------------------------------


def test_parse_triggers_without_marker_is_the_shared_empty_value() -> None:
    assert parse_triggers("hello [sim no marker") is NO_TRIGGERS
    assert parse_triggers("[sim:unknown=3] [sim:status]") is NO_TRIGGERS
    assert NO_TRIGGERS.present is False


def test_parse_triggers_reads_every_kind() -> None:
    text = "a [sim:status=502] b [sim:fail-first=3][sim:delay-ms=40] [sim:retry-after=7] [sim:hang]"
    assert parse_triggers(text) == Triggers(
        status=502, fail_first=3, delay_ms=40, retry_after=7, hang=True
    )


def test_parse_triggers_ignores_status_outside_400_599_and_first_wins() -> None:
    assert parse_triggers("[sim:status=302]") is NO_TRIGGERS
    assert parse_triggers("[sim:status=600]") is NO_TRIGGERS
    assert parse_triggers("[sim:status=200][sim:status=418][sim:status=500]").status == 418
    assert parse_triggers("[sim:delay-ms=0]") == Triggers(delay_ms=0)
    assert parse_triggers("[sim:delay-ms=0]").present is True


def test_failure_limit() -> None:
    assert Triggers(fail_first=2).failure_limit == 2
    assert Triggers(fail_first=2, retry_after=5).failure_limit == 2
    assert Triggers(retry_after=5).failure_limit == 1
    assert Triggers(status=500, fail_first=2).failure_limit is None
    assert Triggers(delay_ms=5).failure_limit is None


def test_estimate_tokens() -> None:
    assert [estimate_tokens("x" * n) for n in (0, 1, 4, 5, 8, 9)] == [1, 1, 1, 2, 2, 3]


def test_sim_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="error_rate"):
        SimConfig(error_rate=1.5)
    with pytest.raises(ValueError, match="latency_ms"):
        SimConfig(latency_ms=-1)
    with pytest.raises(ValueError, match="rpm and tpm"):
        SimConfig(rpm=-1)
    with pytest.raises(ValueError, match="batch_delay_s"):
        SimConfig(batch_delay_s=-0.5)
    with pytest.raises(ValueError, match="batch_results_pause_s"):
        SimConfig(batch_results_pause_s=-1)


def test_options_from_env() -> None:
    options = options_from_env(
        {
            "RELAY_SIM_LATENCY_MS": "12.5",
            "RELAY_SIM_ERROR_RATE": "0.25",
            "RELAY_SIM_PORT": "9001",
            "RELAY_SIM_HOST": "0.0.0.0",
            "RELAY_SIM_RPM": "600",
            "RELAY_SIM_TPM": "90000",
            "RELAY_SIM_RATE_COUNTING": "sliding",
            "RELAY_SIM_BATCH_DELAY_S": "2.5",
            "RELAY_SIM_BATCH_INPUT_DELAY_S": "4",
            "RELAY_SIM_BATCH_RESULTS_PAUSE_S": "0.5",
        }
    )
    assert options.config == SimConfig(
        latency_ms=12.5,
        error_rate=0.25,
        rpm=600,
        tpm=90000,
        rate_counting="sliding",
        batch_delay_s=2.5,
        batch_input_delay_s=4,
        batch_results_pause_s=0.5,
    )
    assert (options.host, options.port) == ("0.0.0.0", 9001)
    defaults = options_from_env({})
    assert defaults.config == SimConfig()
    assert (defaults.host, defaults.port) == ("127.0.0.1", 8090)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RELAY_SIM_ERROR_RATE", "2"),
        ("RELAY_SIM_ERROR_RATE", "lots"),
        ("RELAY_SIM_LATENCY_MS", "-5"),
        ("RELAY_SIM_RPM", "-1"),
        ("RELAY_SIM_TPM", "many"),
        ("RELAY_SIM_RATE_COUNTING", "hourly"),
        ("RELAY_SIM_BATCH_DELAY_S", "-1"),
        ("RELAY_SIM_BATCH_INPUT_DELAY_S", "-1"),
        ("RELAY_SIM_BATCH_RESULTS_PAUSE_S", "soon"),
        ("RELAY_SIM_PORT", "http"),
        ("RELAY_SIM_PORT", "70000"),
    ],
)
def test_options_from_env_rejects_bad_values(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        options_from_env({name: value})


def test_main_exits_2_with_one_line_on_bad_env(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RELAY_SIM_ERROR_RATE", "1.5")
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "RELAY_SIM_ERROR_RATE" in err


# --- plain endpoints ---------------------------------------------------------------------


async def test_healthz_and_models(client: Client) -> None:
    async with client.get("/healthz") as response:
        assert response.status == 200
        assert await response.json() == {"status": "ok"}
    async with client.get("/v1/models") as response:
        assert response.status == 200
        assert await response.json() == {
            "object": "list",
            "data": [{"id": "sim-echo", "object": "model"}],
        }


def test_reply_bytes_is_parsed_capped_and_not_a_behaviour_trigger() -> None:
    assert parse_triggers("[sim:reply-bytes=1048576]") == Triggers(reply_bytes=1048576)
    assert parse_triggers("[sim:reply-bytes=999999999]").reply_bytes == 16 * 1024 * 1024
    assert parse_triggers("[sim:reply-bytes=10]").present is False


# --- success -----------------------------------------------------------------------------


async def test_success_reply_shape(client: Client) -> None:
    body = chat(
        "be brief",
        "first question",
        "an answer",
        "second",
        roles=("system", "user", "assistant", "user"),
    )
    before = int(time.time())
    async with client.post(CHAT, json=body, headers={"Authorization": "Bearer x"}) as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        reply = await response.json()
    assert re.fullmatch(r"chatcmpl-[0-9a-f]+", reply.pop("id"))
    assert before <= reply.pop("created") <= int(time.time())
    # prompt: "be brief"=2, "first question"=4, "an answer"=3, "second"=2; "echo: second"=3
    assert reply == {
        "object": "chat.completion",
        "model": "m-1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "echo: second"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    }


async def test_reply_bytes_pads_the_echo_to_that_size(client: Client) -> None:
    body = chat("big one [sim:reply-bytes=100000]")
    async with client.post(CHAT, json=body, headers={"Authorization": "Bearer x"}) as response:
        assert response.status == 200
        reply = await response.json()
    content = reply["choices"][0]["message"]["content"]
    assert content.startswith("echo: big one [sim:reply-bytes=100000]")
    assert len(content) == 100_000 and content.endswith("...")


async def test_reply_ids_differ(client: Client) -> None:
    ids = set()
    for _ in range(3):
        async with client.post(CHAT, json=chat("hi")) as response:
            ids.add((await response.json())["id"])
    assert len(ids) == 3


async def test_no_user_message_echoes_empty_and_empty_content_counts_one_token(
    client: Client,
) -> None:
    async with client.post(CHAT, json=chat("", roles=("system",))) as response:
        reply = await response.json()
    assert reply["choices"][0]["message"]["content"] == "echo: "
    assert reply["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


async def test_content_parts_are_read_as_text(client: Client) -> None:
    parts = [{"type": "text", "text": "ab"}, {"type": "image_url"}, {"type": "text", "text": "cd"}]
    body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    async with client.post(CHAT, json=body) as response:
        reply = await response.json()
    assert reply["choices"][0]["message"]["content"] == "echo: abcd"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"{not json", "request body is not valid JSON"),
        (b"[1, 2]", "request body must be a JSON object"),
        (b'{"model": "m"}', "'messages' must be a non-empty list"),
        (b'{"model": "m", "messages": []}', "'messages' must be a non-empty list"),
        (b'{"model": "m", "messages": "hi"}', "'messages' must be a non-empty list"),
        (b'{"model": "m", "messages": ["hi"]}', "every message must be an object"),
    ],
)
async def test_invalid_body_is_400(client: Client, payload: bytes, message: str) -> None:
    async with client.post(CHAT, data=payload) as response:
        assert response.status == 400
        assert await response.json() == {
            "error": {"message": message, "type": "invalid_request_error"}
        }
    assert await call_stats(client) == calls_counted(1, ok=0, errors=1, throttled=0)


# --- triggers ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 418, 500, 503, 599])
async def test_status_trigger_always_answers_that_status(client: Client, status: int) -> None:
    body = chat(f"system says [sim:status={status}]", "hello", roles=("system", "user"))
    for _ in range(2):
        async with client.post(CHAT, json=body) as response:
            assert response.status == status
            assert "Retry-After" not in response.headers
            assert await response.json() == sim_error(status)


@pytest.mark.parametrize("status", [200, 302, 399, 600])
async def test_status_trigger_out_of_range_is_ignored(client: Client, status: int) -> None:
    assert await post_statuses(client, chat(f"x [sim:status={status}]"), 1) == [200]


async def test_fail_first_answers_503_then_succeeds_per_content(client: Client) -> None:
    body = chat("a [sim:fail-first=2]")
    async with client.post(CHAT, json=body) as response:
        assert response.status == 503
        assert "Retry-After" not in response.headers
        assert await response.json() == sim_error(503)
    assert await post_statuses(client, body, 3) == [503, 200, 200]
    assert await post_statuses(client, chat("b [sim:fail-first=2]"), 3) == [503, 503, 200]


async def test_fail_first_is_keyed_by_last_user_message(client: Client) -> None:
    first = chat("[sim:fail-first=1]", "row 1", roles=("system", "user"))
    second = chat("[sim:fail-first=1]", "row 2", roles=("system", "user"))
    assert await post_statuses(client, first, 2) == [503, 200]
    assert await post_statuses(client, second, 2) == [503, 200]


async def test_retry_after_alone_is_one_429(client: Client) -> None:
    body = chat("c [sim:retry-after=7]")
    async with client.post(CHAT, json=body) as response:
        assert response.status == 429
        assert response.headers["Retry-After"] == "7"
        assert await response.json() == sim_error(429)
    assert await post_statuses(client, body, 2) == [200, 200]


async def test_retry_after_with_fail_first_answers_429(client: Client) -> None:
    body = chat("d [sim:fail-first=2] [sim:retry-after=3]")
    for _ in range(2):
        async with client.post(CHAT, json=body) as response:
            assert response.status == 429
            assert response.headers["Retry-After"] == "3"
    assert await post_statuses(client, body, 1) == [200]


async def test_retry_after_with_status_keeps_status_and_adds_header(client: Client) -> None:
    body = chat("e [sim:status=503] [sim:retry-after=2]")
    for _ in range(2):
        async with client.post(CHAT, json=body) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "2"


async def test_delay_adds_to_global_latency(make_client: MakeClient) -> None:
    sleeps = SleepRecorder()
    client = await make_client(SimConfig(latency_ms=25), sleep=sleeps)
    assert await post_statuses(client, chat("plain"), 1) == [200]
    assert await post_statuses(client, chat("slow [sim:delay-ms=40]"), 1) == [200]
    async with client.post(CHAT, data=b"nope") as response:
        assert response.status == 400
    assert sleeps.calls == [0.025, 0.065, 0.025]


async def test_no_sleep_without_latency(make_client: MakeClient) -> None:
    sleeps = SleepRecorder()
    fresh = await make_client(sleep=sleeps)
    assert await post_statuses(fresh, chat("plain"), 1) == [200]
    assert sleeps.calls == []


async def test_real_latency_is_waited(make_client: MakeClient) -> None:
    client = await make_client(SimConfig(latency_ms=30))
    started = time.monotonic()
    assert await post_statuses(client, chat("plain"), 1) == [200]
    assert time.monotonic() - started >= 0.03


async def test_hang_sleeps_an_hour_then_answers(make_client: MakeClient) -> None:
    sleeps = SleepRecorder()
    client = await make_client(SimConfig(latency_ms=5), sleep=sleeps)
    assert await post_statuses(client, chat("[sim:hang]"), 1) == [200]
    assert sleeps.calls == [0.005, HANG_SECONDS]


async def test_hang_is_cancelled_when_the_client_gives_up(make_client: MakeClient) -> None:
    client = await make_client()
    state: SimState = client.app[STATE_KEY]
    timeout = aiohttp.ClientTimeout(total=0.2)
    with pytest.raises(TimeoutError):
        async with client.post(CHAT, json=chat("[sim:hang]"), timeout=timeout) as response:
            await response.read()
    await asyncio.wait_for(state.wait_idle(), timeout=5)
    assert state.in_flight == 0
    assert await call_stats(client) == calls_counted(1, ok=0, errors=0, throttled=0)


# --- error rate --------------------------------------------------------------------------


async def test_error_rate_one_fails_every_untriggered_call(make_client: MakeClient) -> None:
    client = await make_client(SimConfig(error_rate=1.0), sleep=SleepRecorder())
    async with client.post(CHAT, json=chat("plain")) as response:
        assert response.status == 503
        assert await response.json() == sim_error(503)
    assert await post_statuses(client, chat("plain"), 2) == [503, 503]
    assert await post_statuses(client, chat("x [sim:delay-ms=0]"), 2) == [200, 200]
    assert await post_statuses(client, chat("y [sim:fail-first=1]"), 2) == [503, 200]


async def test_error_rate_is_seeded_and_reset_reseeds(make_client: MakeClient) -> None:
    client = await make_client(SimConfig(error_rate=0.5, seed=7), sleep=SleepRecorder())
    dice = random.Random(7)
    expected = [503 if dice.random() < 0.5 else 200 for _ in range(20)]
    assert 200 in expected and 503 in expected
    assert await post_statuses(client, chat("plain"), 20) == expected
    async with client.post("/reset") as response:
        assert await response.json() == {"ok": True}
    assert await post_statuses(client, chat("plain"), 20) == expected


# --- stats, reset, memory ----------------------------------------------------------------


async def test_stats_count_calls_and_reset_zeroes_everything(client: Client) -> None:
    assert await call_stats(client) == calls_counted(0, ok=0, errors=0, throttled=0)
    assert await post_statuses(client, chat("[sim:fail-first=1]"), 2) == [503, 200]
    assert await post_statuses(client, chat("ok"), 1) == [200]
    assert await call_stats(client) == calls_counted(3, ok=2, errors=1, throttled=0)
    async with client.post("/reset") as response:
        assert response.status == 200
        assert await response.json() == {"ok": True}
    assert await call_stats(client) == calls_counted(0, ok=0, errors=0, throttled=0)
    assert client.app[STATE_KEY].tracked_contents == 0
    assert await post_statuses(client, chat("[sim:fail-first=1]"), 2) == [503, 200]


async def test_only_triggered_contents_are_remembered(client: Client) -> None:
    state: SimState = client.app[STATE_KEY]
    for n in range(20):
        assert await post_statuses(client, chat(f"row {n} [sim:delay-ms=1]"), 1) == [200]
        assert await post_statuses(client, chat(f"plain row {n}"), 1) == [200]
        assert await post_statuses(client, chat(f"z {n} [sim:status=500]"), 1) == [500]
        assert await post_statuses(client, chat(f"w {n} [sim:fail-first=0]"), 1) == [200]
    assert state.tracked_contents == 0
    assert await post_statuses(client, chat("keep [sim:fail-first=1]"), 3) == [503, 200, 200]
    assert state.tracked_contents == 1


# --- tool calls --------------------------------------------------------------------------


def tool(name: str) -> dict:
    """A chat-completions function tool."""
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def tool_call_digest(text: str, name: str) -> str:
    """The 24 hex digits the simulator derives a call's id from."""
    return hashlib.blake2b(f"{name}\n{text}".encode(), digest_size=12).hexdigest()


async def chat_reply(client: Client, body: dict) -> dict:
    async with client.post(CHAT, json=body) as response:
        assert response.status == 200
        return await response.json()


OSLO = "weather in Oslo? [sim:tool-call]"


async def test_tool_call_trigger_calls_the_first_tool(client: Client) -> None:
    body = {**chat(OSLO), "tools": [tool("get_weather"), tool("other")]}
    reply = await chat_reply(client, body)
    assert reply["choices"] == [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_" + tool_call_digest(OSLO, "get_weather"),
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"text":"' + OSLO + '"}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ]
    # prompt: 32 characters = 8 tokens; arguments: 43 characters = 11 tokens
    assert reply["usage"] == {"prompt_tokens": 8, "completion_tokens": 11, "total_tokens": 19}


async def test_tool_choice_picks_the_tool_or_forbids_the_call(client: Client) -> None:
    tools = [tool("get_weather"), tool("other")]
    named = {"type": "function", "function": {"name": "other"}}
    reply = await chat_reply(client, {**chat(OSLO), "tools": tools, "tool_choice": named})
    assert reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "other"
    for body in ({**chat(OSLO), "tools": tools, "tool_choice": "none"}, chat(OSLO)):
        reply = await chat_reply(client, body)
        assert reply["choices"][0]["message"] == {"role": "assistant", "content": "echo: " + OSLO}
        assert reply["choices"][0]["finish_reason"] == "stop"


async def test_a_tool_turn_is_echoed_as_the_last_user_message(client: Client) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": OSLO},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "snow"}]},
    ]
    reply = await chat_reply(client, {"model": "m", "messages": messages, "tools": [tool("w")]})
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "echo: snow"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"messages": [{"role": "tool", "tool_call_id": "call_1", "content": "x"}]},
            "messages[0] answers no earlier assistant tool call",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"function": {}}]},
                    {"role": "user", "content": "x"},
                ]
            },
            "messages[0].tool_calls must be a list of calls with ids",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            "'tools' must be a list of function tools with names",
        ),
    ],
)
async def test_invalid_tool_requests_are_400(client: Client, body: dict, message: str) -> None:
    async with client.post(CHAT, json={"model": "m", **body}) as response:
        assert response.status == 400
        assert await response.json() == {
            "error": {"message": message, "type": "invalid_request_error"}
        }
