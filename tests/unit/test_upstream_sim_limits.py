"""Unit tests of the upstream simulator's rate limits, per model and per calendar second
(the windows alone, and over real HTTP with aiohttp TestServer + TestClient)."""

from __future__ import annotations

import orjson
import pytest

from relay_batches.services.upstream_sim.config import SimConfig
from relay_batches.services.upstream_sim.echo import call_tokens, estimate_tokens
from relay_batches.services.upstream_sim.openai_chat import parse_chat_request
from relay_batches.services.upstream_sim.rate_limits import (
    RateWindows,
    per_second,
    sliding_span,
)
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


@pytest.mark.parametrize("counting", ["calendar", "sliding", "bucket"])
def test_rate_windows_count_tokens_and_a_refused_call_costs_nothing(counting: str) -> None:
    clock = Clock(5.0)
    windows = RateWindows(rpm=0, tpm=6000, clock=clock, counting=counting)  # 100 a second
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


def test_a_sliding_window_admits_the_limit_in_any_second_wherever_it_starts() -> None:
    clock = Clock(100.5)
    windows = RateWindows(rpm=600, tpm=0, clock=clock, counting="sliding")
    assert [windows.admit(1) for _ in range(11)] == [True] * 10 + [False]
    clock.now = 101.2  # a new calendar second, but the ten of 100.5 are within one second
    assert not windows.admit(1)
    clock.now = 101.5  # (100.5, 101.5] no longer holds them
    assert [windows.admit(1) for _ in range(11)] == [True] * 10 + [False]


def test_a_sliding_window_refuses_ten_late_calls_and_ten_early_ones() -> None:
    clock = Clock(10.9)  # the pattern a calendar second admits: 10 at its end, 10 at the next start
    sliding = RateWindows(rpm=600, tpm=0, clock=clock, counting="sliding")
    calendar = RateWindows(rpm=600, tpm=0, clock=clock)
    assert all(sliding.admit(1) and calendar.admit(1) for _ in range(10))
    clock.now = 11.05
    assert [calendar.admit(1) for _ in range(10)] == [True] * 10
    assert [sliding.admit(1) for _ in range(10)] == [False] * 10
    clock.now = 11.9  # 10.9 has left the window
    assert sliding.admit(1)


def test_a_sliding_window_spans_the_time_a_burst_takes_to_earn() -> None:
    assert (sliding_span(600), sliding_span(3000), sliding_span(90)) == (1.0, 1.0, 4 / 3)
    clock = Clock(0.0)
    windows = RateWindows(rpm=90, tpm=0, clock=clock, counting="sliding")  # 2 per 1.33 s
    assert [windows.admit(1) for _ in range(3)] == [True, True, False]
    clock.now = 1.3
    assert not windows.admit(1)
    clock.now = 1.34
    assert windows.admit(1)


def test_a_token_bucket_holds_a_second_and_refills_evenly() -> None:
    clock = Clock(50.0)
    windows = RateWindows(rpm=600, tpm=0, clock=clock, counting="bucket")
    assert [windows.admit(1) for _ in range(11)] == [True] * 10 + [False]  # full at first
    clock.now = 50.25  # 2.5 calls refilled
    assert [windows.admit(1) for _ in range(3)] == [True, True, False]
    clock.now = 60.0  # never more than a second's worth
    assert [windows.admit(1) for _ in range(11)] == [True] * 10 + [False]
    # Even spacing at the limit never runs dry.
    paced = RateWindows(rpm=600, tpm=0, clock=clock, counting="bucket")
    for i in range(100):
        clock.now = 70.0 + i / 10
        assert paced.admit(1)


def test_an_unknown_counting_is_refused() -> None:
    with pytest.raises(ValueError, match="calendar, sliding, bucket"):
        RateWindows(rpm=60, tpm=0, counting="hourly")
    with pytest.raises(ValueError, match="rate_counting"):
        SimConfig(rate_counting="hourly")


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


async def test_a_sliding_simulator_answers_429_to_a_burst_across_seconds(
    make_client: MakeClient,
) -> None:
    clock = Clock(20.7)
    config = SimConfig(rpm=120, rate_counting="sliding")  # 2 calls in any second
    client = await make_client(config, sleep=SleepRecorder(), clock=clock)
    assert await post_statuses(client, chat("a"), 2) == [200, 200]
    clock.now = 21.1
    assert await post_statuses(client, chat("b"), 1) == [429]
    clock.now = 21.71
    assert await post_statuses(client, chat("c"), 3) == [200, 200, 429]


async def test_a_status_trigger_answers_before_the_rate_limit(make_client: MakeClient) -> None:
    client = await make_client(SimConfig(rpm=60), sleep=SleepRecorder(), clock=Clock())
    assert await post_statuses(client, chat("[sim:status=500]"), 2) == [500, 500]
    assert await post_statuses(client, chat("ok"), 2) == [200, 429]
