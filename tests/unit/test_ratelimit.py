"""Unit tests of the rate-limit arithmetic: routes keys, estimates, the Pacer, the Budget,
and the keeper on a fake bus with its real interface (grants split per call, a failing
deployment alone, the tick through the drain)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable
from pathlib import Path

import orjson
import pytest

from relay_batches.bus.topology import GRANT_MESSAGES_PER_TICK, Names
from relay_batches.dialects.anthropic import upstream as anthropic
from relay_batches.dialects.openai import upstream as openai
from relay_batches.kit.periodic import Periodic
from relay_batches.kit.tasks import Tasks
from relay_batches.messages import GrantMessage
from relay_batches.ratelimit.budget import Budget
from relay_batches.ratelimit.estimate import (
    IMAGE_TOKENS,
    completion_cap,
    counted_tokens,
    estimate_tokens,
)
from relay_batches.ratelimit.keeper import Keeper, split_grant
from relay_batches.ratelimit.limits import RateLimit
from relay_batches.ratelimit.pacing import F_MIN, Grant, Pacer, quantum_of
from relay_batches.ratelimit.parts import DrainingTicks
from relay_batches.router.aliases import Deployment, load_aliases
from relay_batches.settings import ConfigError

ROUTES = """
[aliases.m]
deployments = ["d"]

[deployments.d]
provider = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "x"
{extra}
"""


def routes(tmp_path: Path, extra: str) -> str:
    path = tmp_path / "routes.toml"
    path.write_text(ROUTES.format(extra=extra), encoding="utf-8")
    return str(path)


def test_routes_rpm_and_tpm_make_the_deployment_limited(tmp_path: Path) -> None:
    table = load_aliases(routes(tmp_path, "rpm = 600\ntpm = 90000"), {})
    assert table.aliases["m"][0].limit == RateLimit(rpm=600, tpm=90000)
    assert table.limits() == {"d": RateLimit(rpm=600, tpm=90000)}
    only_tpm = load_aliases(routes(tmp_path, "tpm = 1000"), {})
    assert only_tpm.aliases["m"][0].limit == RateLimit(rpm=None, tpm=1000)


def test_routes_without_limits_have_none(tmp_path: Path) -> None:
    table = load_aliases(routes(tmp_path, ""), {})
    assert table.aliases["m"][0].limit is None
    assert table.limits() == {}


@pytest.mark.parametrize("value", ["0", '"x"', "1.5", "-3", "true"])
@pytest.mark.parametrize("key", ["rpm", "tpm"])
def test_routes_bad_limit_is_one_line(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_aliases(routes(tmp_path, f"{key} = {value}"), {})
    message = str(caught.value)
    assert "\n" not in message
    assert f"deployment 'd': {key} must be a positive integer" in message


def test_estimate_counts_text_images_tools_and_the_cap() -> None:
    messages = [
        {"role": "system", "content": "abcde"},  # 5 chars: 2 tokens
        {"role": "user", "content": [{"type": "text", "text": "abcd"}, {"type": "image_url"}]},
        {"role": "assistant", "content": None},
    ]
    assert estimate_tokens(messages, {}, 0) == 3 + IMAGE_TOKENS
    assert estimate_tokens(messages, {}, 100) == 103 + IMAGE_TOKENS
    tools = [{"type": "function", "function": {"name": "f"}}]
    with_tools = estimate_tokens(messages, {"tools": tools}, 0)
    assert with_tools == 3 + IMAGE_TOKENS + -(-len(orjson.dumps(tools)) // 4)
    called = [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}]
    assert estimate_tokens(called, {}, 0) == -(-len(orjson.dumps([{"id": "c1"}])) // 4)


def test_completion_cap_reads_either_key() -> None:
    assert completion_cap({"max_completion_tokens": 50, "max_tokens": 100}) == 50
    assert completion_cap({"max_tokens": 100}) == 100
    assert completion_cap({"max_tokens": True}) == 0
    assert completion_cap({}) == 0


def test_counted_tokens_take_the_cap_sent_and_keep_the_estimate_without_usage() -> None:
    assert counted_tokens(100, 7, 12, 50) == 107
    assert counted_tokens(0, 7, 12, 50) == 19
    assert counted_tokens(100, 0, 0, 50) == 50  # no usage in the reply: the estimate stands


def test_the_cap_is_the_one_the_provider_call_sends() -> None:
    plain = Deployment("d", "openai", "http://x/v1", "m")
    capped = Deployment("d", "openai", "http://x/v1", "m", params={"max_completion_tokens": 4096})
    assert openai.token_cap(plain, {}) == 0
    assert openai.token_cap(capped, {}) == 4096
    assert openai.token_cap(capped, {"max_tokens": 100}) == 100  # the row's replaces the default
    claude = Deployment("c", "anthropic", "http://x/v1", "m")
    assert anthropic.token_cap(claude, {}) == anthropic.DEFAULT_MAX_TOKENS
    assert anthropic.token_cap(claude, {"max_tokens": 10}) == 10
    claude_capped = Deployment("c", "anthropic", "http://x/v1", "m", params={"max_tokens": 300})
    assert anthropic.token_cap(claude_capped, {}) == 300
    assert anthropic.token_cap(claude_capped, {"max_completion_tokens": 20}) == 20


def run_pacer(pacer: Pacer, seconds: float, rng: random.Random) -> list[tuple[float, Grant]]:
    """Ticks every 100 ms in the middle of each tenth of a second, as the keeper's, each
    up to 45 ms early or late, and now and then one missed (a stalled loop)."""
    issued = []
    for k in range(round(seconds * 10) + 1):
        if rng.random() < 0.02:
            continue
        now = 1000.05 + 0.1 * k + rng.uniform(-0.045, 0.045)
        grant = pacer.issue(now)
        if grant is not None:
            issued.append((now, grant))
    return issued


def max_in_window(issued: list[tuple[float, Grant]], key: str) -> int:
    """The most issued in one calendar second (what providers count)."""
    seconds: dict[int, int] = {}
    for at, grant in issued:
        seconds[int(at)] = seconds.get(int(at), 0) + getattr(grant, key)
    return max(seconds.values())


def test_pacer_spreads_600_rpm_evenly_over_a_minute() -> None:
    for seed in range(5):
        issued = run_pacer(Pacer(RateLimit(rpm=600)), 60.0, random.Random(seed))
        total = sum(g.requests for _, g in issued)
        assert 594 <= total <= 601  # held back past a second's edge: late, not lost
        assert max_in_window(issued, "requests") == 10
        # a missed tick's due comes with the next ones, never more than the second's quantum
        assert max(g.requests for _, g in issued) <= 10
        assert all(g.tokens == 0 for _, g in issued)


def test_pacer_spreads_the_remainder_of_a_limit_over_the_minute() -> None:
    for rpm in (90, 119, 650):
        issued = run_pacer(Pacer(RateLimit(rpm=rpm)), 60.0, random.Random(rpm))
        total = sum(g.requests for _, g in issued)
        assert rpm * 0.99 - 1 <= total <= rpm + 1, (rpm, total)  # held back: late, not lost
        seconds: dict[int, int] = {}
        for at, grant in issued:
            seconds[int(at)] = seconds.get(int(at), 0) + grant.requests
        assert all(n <= quantum_of(rpm, second) for second, n in seconds.items())
    assert [quantum_of(90, k) for k in range(4)] == [1, 2, 1, 2]
    assert sum(quantum_of(119, k) for k in range(60)) == 119


def test_pacer_spreads_tokens_evenly() -> None:
    issued = run_pacer(Pacer(RateLimit(tpm=60_000)), 60.0, random.Random(7))
    total = sum(g.tokens for _, g in issued)
    assert 59_900 <= total <= 60_100
    assert max_in_window(issued, "tokens") == 1000


def test_pacer_issues_tokens_in_whole_calls() -> None:
    pacer = Pacer(RateLimit(tpm=36_000))  # 600 a second, 60 a tick
    issued = []
    for k in range(101):
        grant = pacer.issue(0.05 + 0.1 * k, tokens_per_call=100)
        if grant is not None:
            issued.append((0.05 + 0.1 * k, grant))
    assert all(g.tokens % 100 == 0 for _, g in issued)  # whole calls only
    assert sum(g.tokens for _, g in issued) == 6000  # 10 s at 600 a second
    assert max_in_window(issued, "tokens") == 600


def test_grants_expire_within_their_calendar_second() -> None:
    pacer = Pacer(RateLimit(rpm=600))
    pacer.issue(7.05)
    early = pacer.issue(7.15)
    late = pacer.issue(7.85)
    assert early is not None and early.expires_at == pytest.approx(7.65)
    assert late is not None and late.expires_at == pytest.approx(7.95)
    assert pacer.issue(7.96) is None  # it would be born expired: held for the next second


def test_a_new_leader_skips_the_rest_of_the_second() -> None:
    pacer = Pacer(RateLimit(rpm=600))
    pacer.issue(3.05)
    pacer.restart(3.4)
    assert [pacer.issue(3.05 + 0.1 * k) for k in range(4, 10)] == [None] * 6
    grant = pacer.issue(4.05)
    assert grant is not None and grant.requests == 1  # no credit from the skipped rest
    stale = Pacer(RateLimit(rpm=600))
    stale.issue(1.05)  # leader once, then not for a minute
    stale.restart(60.4)
    assert [stale.issue(60.45 + 0.1 * k) for k in range(5)] == [None] * 5
    assert [g.requests for g in (stale.issue(61.05), stale.issue(61.15)) if g] == [1, 1]


def test_a_slow_tick_still_issues_the_whole_rate() -> None:
    pacer = Pacer(RateLimit(rpm=600))  # a tick every 0.25 s (slow confirms), not 0.1 s
    issued = [(at, g) for k in range(241) if (g := pacer.issue(at := 1000.05 + 0.25 * k))]
    assert 598 <= sum(g.requests for _, g in issued) <= 601
    assert max_in_window(issued, "requests") == 10


def test_pacer_banks_nothing_while_idle() -> None:
    pacer = Pacer(RateLimit(rpm=600))
    pacer.issue(0.05)
    grant = pacer.issue(30.05)
    assert grant is not None and grant.requests == 10  # a second's worth at most
    assert grant.expires_at == pytest.approx(30.55)


def test_pacer_decreases_once_per_second_and_recovers() -> None:
    pacer = Pacer(RateLimit(rpm=600))
    pacer.issue(0.0)
    pacer.throttled(10.0, 1.0)
    assert pacer.fraction == pytest.approx(0.8)
    pacer.throttled(10.5, 1.0)  # the same congestion event: only the increase
    assert pacer.fraction == pytest.approx(0.825)
    pacer.throttled(11.0, None)
    assert pacer.fraction == pytest.approx(0.85 * 0.8)
    for t in (12.0, 13.0, 14.0, 15.0):
        pacer.issue(t)
    assert pacer.fraction == pytest.approx(0.68 + 0.2)
    pacer.issue(30.0)
    assert pacer.fraction == 1.0


def test_pacer_rate_follows_the_fraction() -> None:
    pacer = Pacer(RateLimit(rpm=600))
    pacer.issue(0.05)
    pacer.throttled(0.05, None)  # 0.8, recovering 0.05/s
    total = 0
    for k in range(1, 41):
        grant = pacer.issue(0.05 + 0.1 * k)
        total += 0 if grant is None else grant.requests
    # mean fraction over 4 s is 0.9: 36 requests
    assert 35 <= total <= 37


def test_pacer_under_throttles_every_second_settles_above_the_floor() -> None:
    pacer = Pacer(RateLimit(rpm=600))
    for second in range(100):
        pacer.throttled(float(second), None)
    # (f + 0.05) x 0.8 = f: a 429 every second holds a fifth of the limit
    assert pacer.fraction == pytest.approx(0.2, abs=1e-6)
    assert pacer.fraction >= F_MIN


def test_retry_after_pauses_issuing_until_then() -> None:
    pacer = Pacer(RateLimit(rpm=600))
    pacer.issue(0.05)
    pacer.throttled(1.0, 5.0)
    assert [pacer.issue(1.05 + 0.1 * k) for k in range(0, 50)] == [None] * 50
    after = pacer.issue(6.05)  # the pause banked nothing: one tick's accrual
    assert after is not None and after.requests == 1
    pacer.throttled(20.0, 3600.0)
    assert pacer.issue(79.95) is None
    assert pacer.issue(80.05) is not None  # capped at 60 s


def test_budget_takes_requests_and_expires_positive_balances() -> None:
    budget = Budget(RateLimit(rpm=600))
    assert not budget.take(0, 0.0)
    assert budget.add(Grant(2, 0, 1.0), 0.0)
    assert budget.take(0, 0.1) and budget.take(0, 0.2)
    assert not budget.take(0, 0.3)
    budget.add(Grant(3, 0, 2.0), 1.5)
    assert not budget.take(0, 2.0)  # expired with the newest grant
    assert not budget.add(Grant(1, 0, 2.5), 2.5)  # arrived expired


def test_budget_tokens_may_go_into_debt_which_never_expires() -> None:
    budget = Budget(RateLimit(tpm=6000))
    budget.add(Grant(0, 10, 1.0), 0.0)
    assert budget.take(150, 0.0)
    assert budget.tokens == -140
    assert not budget.take(1, 0.1)
    budget.add(Grant(0, 100, 5.0), 4.0)
    assert budget.tokens == -40  # the debt outlived its grant's expiry
    budget.settle(150, 100)  # the call counted 100
    assert budget.tokens == 10
    assert budget.take(1, 4.5)


def test_budget_with_both_limits_needs_both() -> None:
    budget = Budget(RateLimit(rpm=60, tpm=6000))
    budget.add(Grant(0, 50, 1.0), 0.0)
    assert not budget.take(10, 0.0)
    budget.add(Grant(1, 0, 1.0), 0.0)
    assert budget.take(10, 0.0)
    assert (budget.requests, budget.tokens) == (0, 40)


def test_a_grant_is_split_into_messages_of_about_one_call() -> None:
    assert split_grant(Grant(9, 0, 5.0), 0) == [Grant(1, 0, 5.0)] * 9
    assert split_grant(Grant(0, 1000, 5.0), 300) == [Grant(0, 400, 5.0)] + [Grant(0, 300, 5.0)] * 2
    # both limited: as many messages as the scarcer pays for, the rest spread on them
    assert split_grant(Grant(8, 900, 5.0), 300) == [Grant(3, 300, 5.0)] * 2 + [Grant(2, 300, 5.0)]
    assert split_grant(Grant(2, 50, 5.0), 300) == [Grant(1, 50, 5.0), Grant(1, 0, 5.0)]
    assert split_grant(Grant(0, 1000, 5.0), 0) == [Grant(0, 1000, 5.0)]  # no typical call
    assert split_grant(Grant(2, 1001, 5.0), 0) == [Grant(1, 501, 5.0), Grant(1, 500, 5.0)]
    many = split_grant(Grant(1000, 0, 5.0), 1)
    assert len(many) == GRANT_MESSAGES_PER_TICK and sum(g.requests for g in many) == 1000


class KeeperBus:
    def __init__(self, bad: str = "") -> None:
        self.names = Names("unit")
        self.bad = bad
        self.published: list[GrantMessage] = []

    async def claim_exclusive(self, queue: str) -> bool:
        return True

    async def release_exclusive(self) -> None:
        return None

    async def declare(self, queue: str) -> None:
        if queue == self.names.ratelimit_grants(self.bad):
            raise ValueError("Queue name too long")  # what pamqp raises

    async def queue_states(self, queues: Iterable[str]) -> list[tuple[int, int]]:
        return [(0, 0 if queue.endswith(".idle") else 1) for queue in queues]

    async def publish(self, queue: str, body: bytes, *, kind: str, persistent: bool = True) -> None:
        assert not persistent and queue == self.names.ratelimit_grants(
            GrantMessage.decode(body).deployment
        )
        self.published.append(GrantMessage.decode(body))


async def test_a_message_per_call_where_consumed_and_a_bad_deployment_alone_fails() -> None:
    bus = KeeperBus(bad="bad")
    clock = [100.4]
    limits = {n: RateLimit(rpm=6000) for n in ("bad", "good", "idle")}  # idle: no consumer
    keeper = Keeper(bus, limits, clock=lambda: clock[0], tokens_per_call=lambda _: 250, ident="w1")
    await keeper.elect()
    for k in range(10):
        clock[0] = 101.05 + 0.1 * k
        await keeper.tick()
    assert {m.deployment for m in bus.published} == {"good"}
    # 100 a second, one a message; the tick at .95 is within SECOND_EDGE_S of the second's
    # end, so its 10 wait for the next second
    assert [m.requests for m in bus.published] == [1] * 90
    assert {(m.call_tokens, m.leader) for m in bus.published} == {(250, "w1")}


async def test_the_tick_goes_on_through_the_drain_until_the_rest_is_done() -> None:
    passes = 0

    async def tick() -> float:
        nonlocal passes
        passes += 1
        return 0.001

    tasks = Tasks()
    halt = asyncio.Event()
    row_done = asyncio.Event()
    tasks.spawn(row_done.wait(), name="row")
    await DrainingTicks(Periodic("ratelimit-tick", 0.001, tick)).start(None, tasks, halt)  # type: ignore[arg-type]
    halt.set()  # the stop: the other loops end, the row is still waiting for budget
    before = passes
    for _ in range(50):
        await asyncio.sleep(0.001)
    assert passes > before  # still ticking for the row
    assert len(tasks.running()) == 2
    row_done.set()
    assert await tasks.wait(1.0) == set()  # then the tick ends with the rest


def test_a_deployment_name_too_long_for_its_grants_queue_is_a_config_error() -> None:
    from relay_batches.router.aliases import AliasTable, Deployment
    from relay_batches.services.row_worker.__main__ import shared_limits

    name = "d" * 240
    limited = Deployment(name, "openai", "http://127.0.0.1:9/v1", "x", limit=RateLimit(rpm=60))
    bus = KeeperBus()
    with pytest.raises(ConfigError) as caught:
        shared_limits(AliasTable({"m": (limited,)}), bus)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message and f"deployment {name!r}" in message and "255 bytes" in message
