"""Unit tests of the upstream simulator's rate limits, per model and per calendar second
(the windows alone, and over real HTTP with aiohttp TestServer + TestClient)."""

from __future__ import annotations

import orjson

from relay_batches.services.upstream_sim.config import SimConfig
from relay_batches.services.upstream_sim.echo import call_tokens, estimate_tokens
from relay_batches.services.upstream_sim.openai_chat import parse_chat_request
from relay_batches.services.upstream_sim.rate_limits import RateWindows, per_second
from tests.unit.test_upstream_sim import (
    CHAT,
    MakeClient,
    SleepRecorder,
    call_stats,
    calls_counted,
    chat,
    make_client,
    post_statuses,
)
from tests.unit.test_upstream_sim_messages import ANTHROPIC_HEADERS, MESSAGES, messages_body

__all__ = ["make_client"]  # the simulator fixture of the realtime tests, shared


class Clock:
    """A wall clock the test moves."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_rate_windows_admit_rpm_over_60_calls_per_second_then_the_next_second() -> None:
    clock = Clock(100.2)
    windows = RateWindows(rpm=600, tpm=0, clock=clock)
    assert [windows.admit(1) for _ in range(11)] == [True] * 10 + [False]
    clock.now = 100.99
    assert not windows.admit(1)
    clock.now = 101.0
    assert windows.admit(1)


def test_rate_windows_count_tokens_and_a_refused_call_costs_nothing() -> None:
    clock = Clock(5.0)
    windows = RateWindows(rpm=0, tpm=6000, clock=clock)  # 100 tokens a second
    assert windows.admit(60)
    assert not windows.admit(41)  # refused: not counted
    assert windows.admit(40)
    assert not windows.admit(1)
    assert windows.admit(100, model="other")  # each model has its own window
    assert not RateWindows(0, 0).active


def test_rate_windows_spread_the_remainder_over_the_minute() -> None:
    assert [per_second(90, k) for k in range(4)] == [1, 2, 1, 2]
    assert [per_second(30, k) for k in range(4)] == [0, 1, 0, 1]
    for rpm in (1, 59, 90, 119, 600, 650):
        assert sum(per_second(rpm, k) for k in range(1_000, 1_060)) == rpm
    clock = Clock(7.5)  # second 7 of 90 rpm admits 2, second 8 admits 1
    windows = RateWindows(rpm=90, tpm=0, clock=clock)
    assert [windows.admit(1) for _ in range(3)] == [True, True, False]
    clock.now = 8.0
    assert [windows.admit(1) for _ in range(2)] == [True, False]


def test_call_tokens_are_the_prompt_plus_max_tokens_or_the_reply() -> None:
    capped = parse_chat_request(orjson.dumps({**chat("abcdefgh"), "max_tokens": 50}))
    assert call_tokens(capped) == 2 + 50
    newer = parse_chat_request(orjson.dumps({**chat("abcdefgh"), "max_completion_tokens": 7}))
    assert call_tokens(newer) == 2 + 7
    uncapped = parse_chat_request(orjson.dumps(chat("abcdefgh")))
    assert call_tokens(uncapped) == 2 + estimate_tokens("echo: abcdefgh")


async def test_over_the_rpm_a_call_answers_429_with_retry_after_at_once(
    make_client: MakeClient,
) -> None:
    clock, sleep = Clock(50.5), SleepRecorder()
    client = await make_client(SimConfig(latency_ms=200, rpm=120), sleep=sleep, clock=clock)
    assert await post_statuses(client, chat("a"), 3) == [200, 200, 429]
    assert sleep.calls == [0.2, 0.2]  # the 429 answered without the latency
    async with client.post(CHAT, json=chat("b")) as response:
        assert (response.status, response.headers["Retry-After"]) == (429, "1")
        assert (await response.json())["error"]["type"] == "rate_limit_error"
    same_model = messages_body(model="m-1")  # the window is the model's, whichever endpoint
    async with client.post(MESSAGES, json=same_model, headers=ANTHROPIC_HEADERS) as response:
        assert response.status == 429
        assert (await response.json())["error"]["type"] == "rate_limit_error"
    clock.now = 51.0
    assert await post_statuses(client, chat("c"), 1) == [200]
    assert await call_stats(client) == calls_counted(6, ok=3, errors=3, throttled=3)


async def test_over_the_tpm_a_call_answers_429(make_client: MakeClient) -> None:
    client = await make_client(SimConfig(tpm=60 * 60), sleep=SleepRecorder(), clock=Clock())
    body = {**chat("abcd"), "max_tokens": 29}  # 1 + 29 tokens: two fit in a second's 60
    assert await post_statuses(client, body, 3) == [200, 200, 429]


async def test_a_status_trigger_answers_before_the_rate_limit(make_client: MakeClient) -> None:
    client = await make_client(SimConfig(rpm=60), sleep=SleepRecorder(), clock=Clock())
    assert await post_statuses(client, chat("[sim:status=500]"), 2) == [500, 500]
    assert await post_statuses(client, chat("ok"), 2) == [200, 429]
