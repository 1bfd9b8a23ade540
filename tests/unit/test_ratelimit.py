"""Unit tests of the rate-limit arithmetic: routes keys, estimates, the Pacer, the Budget,
and the keeper on a fake bus with its real interface (a slot a message, a failing
deployment alone, the tick through the drain)."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterable
from pathlib import Path

import orjson
import pytest

from relay_batches.bus.topology import GRANT_MESSAGES_PER_TICK, GRANTS_MAX_LENGTH, Names
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
from relay_batches.ratelimit.keeper import Keeper
from relay_batches.ratelimit.limits import RateLimit
from relay_batches.ratelimit.pacing import (
    F_MIN,
    LATE_S,
    LEAD_S,
    MIN_LEAD_S,
    Grant,
    Pacer,
    quantum_of,
)
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


def run_pacer(
    pacer: Pacer, seconds: float, rng: random.Random, tokens_per_call: int = 1
) -> list[tuple[float, Grant]]:
    """Ticks every 100 ms in the middle of each tenth of a second, as the keeper's, each
    up to 45 ms early or late, and now and then one missed (a stalled loop)."""
    issued = []
    for k in range(round(seconds * 10) + 1):
        if rng.random() < 0.02:
            continue
        now = 1000.05 + 0.1 * k + rng.uniform(-0.045, 0.045)
        issued.extend((now, grant) for grant in pacer.issue(now, tokens_per_call))
    return issued


def late_calls_stay_within(issued: list[tuple[float, Grant]], most: int) -> bool:
    """Whether calls started anywhere between their slot and its expiry keep every window
    of one second (wherever it starts: a calendar second, a sliding one) to ``most``
    slots: any ``most + 1`` consecutive slots span more than a second and the lateness."""
    slots = sorted(g.at for _, g in issued)
    return all(b - a >= 1.0 + LATE_S - 1e-9 for a, b in zip(slots, slots[most:], strict=False))


def test_pacer_spaces_600_rpm_so_no_second_anywhere_holds_more_than_10() -> None:
    for seed in range(5):
        issued = run_pacer(Pacer(RateLimit(rpm=600)), 60.0, random.Random(seed))
        total = sum(g.requests for _, g in issued)
        assert 0.97 * 600 - 5 <= total <= 0.97 * 600 + 3  # the margin, and the lead at the end
        assert {g.requests for _, g in issued} == {1} and all(g.tokens == 0 for _, g in issued)
        assert late_calls_stay_within(issued, 10)
        # ahead of its time, never too little (a worker has it before the slot comes)
        assert all(MIN_LEAD_S - 1e-9 <= g.at - now <= LEAD_S + 0.1 + 1e-9 for now, g in issued)
        assert all(g.expires_at == pytest.approx(g.at + LATE_S) for _, g in issued)


def test_the_same_pacing_at_3000_rpm_and_past_the_messages_a_tick() -> None:
    issued = run_pacer(Pacer(RateLimit(rpm=3000)), 30.0, random.Random(3))
    assert late_calls_stay_within(issued, 50)
    assert 0.97 * 1500 - 10 <= sum(g.requests for _, g in issued) <= 0.97 * 1500 + 15
    fast = run_pacer(Pacer(RateLimit(rpm=60_000)), 10.0, random.Random(4))  # 100 a tick
    assert {g.requests for _, g in fast} == {5}  # 20 messages a tick
    ticks: dict[float, int] = {}
    for now, _ in fast:
        ticks[now] = ticks.get(now, 0) + 1
    # a tick issues a tick's worth, or the whole lead (the first, and after a missed tick):
    # never more than a grants queue holds
    assert max(ticks.values()) <= GRANT_MESSAGES_PER_TICK * (LEAD_S + 0.1) / 0.1 < GRANTS_MAX_LENGTH
    assert 0.97 * 10_000 - 120 <= sum(g.requests for _, g in fast) <= 0.97 * 10_000 + 300


def test_pacer_keeps_each_calendar_second_to_its_share_of_the_minute() -> None:
    for rpm in (90, 119, 650):
        issued = run_pacer(Pacer(RateLimit(rpm=rpm)), 60.0, random.Random(rpm))
        total = sum(g.requests for _, g in issued)
        assert rpm * 0.97 - 3 <= total <= rpm + 1, (rpm, total)
        seconds: dict[int, int] = {}
        for _, grant in issued:  # a call up to LATE_S late stays in its slot's second
            assert int(grant.at) == int(grant.expires_at)
            seconds[int(grant.at)] = seconds.get(int(grant.at), 0) + grant.requests
        assert all(n <= quantum_of(rpm, second) for second, n in seconds.items())
    assert [quantum_of(90, k) for k in range(4)] == [1, 2, 1, 2]
    assert sum(quantum_of(119, k) for k in range(60)) == 119


def test_pacer_spaces_tokens_in_whole_typical_calls() -> None:
    issued = run_pacer(Pacer(RateLimit(tpm=36_000)), 10.0, random.Random(7), 100)  # 6 calls/s
    assert {g.tokens for _, g in issued} == {100} and {g.requests for _, g in issued} == {0}
    assert 0.97 * 6000 - 300 <= sum(g.tokens for _, g in issued) <= 0.97 * 6000 + 300
    assert late_calls_stay_within(issued, 6)
    unknown = run_pacer(Pacer(RateLimit(rpm=600, tpm=60_000)), 2.0, random.Random(8), 0)
    assert {g.tokens for _, g in unknown} == {100}  # no typical call known: a request's share
    both = run_pacer(Pacer(RateLimit(rpm=600, tpm=30_000)), 10.0, random.Random(9), 100)
    assert late_calls_stay_within(both, 5)  # the tokens bind: 5 calls a second


def test_a_new_leader_starts_after_the_second_and_its_predecessors_slots() -> None:
    old, new = Pacer(RateLimit(rpm=600)), Pacer(RateLimit(rpm=600))
    issued = [(3.05, g) for g in old.issue(3.05)]
    issued += [(3.35, g) for g in old.issue(3.35)]
    new.restart(3.4)  # the old one died after its tick at 3.35
    assert new.issue(3.45) == []
    first = new.issue(3.95)
    assert min(g.at for g in first) >= 4.0  # not before the next second
    issued += [(3.95, g) for g in first]
    issued += [(now, g) for now in (4.05, 4.15, 4.25) for g in new.issue(now)]
    assert late_calls_stay_within(issued, 10)
    late = Pacer(RateLimit(rpm=600))
    late.restart(60.9)  # won late in a second: after the old one's lead, a spacing on
    first = late.issue(61.25)
    assert first and first[0].at >= 60.9 + LEAD_S + 0.1 + 0.1


def test_pacer_banks_nothing_while_idle() -> None:
    pacer = Pacer(RateLimit(rpm=600))
    pacer.issue(0.05)
    grants = pacer.issue(30.05)
    assert [g.at for g in grants] == pytest.approx(
        [30.1 + k / (0.97 * 10) for k in range(len(grants))]
    )
    assert len(grants) == 3  # slots from 30.1 to the horizon 30.35: spaced, no burst


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
    slots = [g.at for k in range(1, 41) for g in pacer.issue(0.05 + 0.1 * k)]
    # from 0.4 s on, fraction 0.8 growing 0.05 a second, less the margin: 32 slots
    assert 31 <= len([at for at in slots if at < 4.05]) <= 34


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
    assert [pacer.issue(1.05 + 0.1 * k) for k in range(0, 50)] == [[]] * 50
    after = pacer.issue(6.05)  # the pause banked nothing: spaced slots from then on
    assert after and after[0].at >= 6.0 and len(after) <= 4
    pacer.throttled(20.0, 3600.0)
    assert pacer.issue(79.95) == []
    assert pacer.issue(80.05) != []  # capped at 60 s


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


def test_a_grant_counts_from_its_slot_until_it_expires() -> None:
    budget = Budget(RateLimit(rpm=600))
    assert budget.add(Grant(1, 0, 5.03, at=5.0), 4.8)
    assert budget.add(Grant(1, 0, 5.13, at=5.1), 4.8)
    assert (budget.next_at(), budget.held(4.8)) == (5.0, 2)
    assert not budget.take(0, 4.99)  # pending: not before its slot
    assert budget.take(0, 5.0) and not budget.take(0, 5.01)
    assert budget.next_at() == 5.1
    assert not budget.take(0, 5.14)  # its slot came and went: expired unused
    assert (budget.held(5.14), budget.next_at()) == (0, None)
    budget.add(Grant(1, 0, 6.03, at=6.0), 5.5)
    budget.add(Grant(1, 0, 6.13, at=6.1), 5.5)
    assert budget.take(0, 6.11) and not budget.take(0, 6.11)  # each request expires with
    # its own grant: the one of 6.0 does not live on with the newer one (no banking)


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
    # a slot a message, one call each, 97 a second from the second after the election,
    # each stamped with its slot ahead of its issue
    starts = [m.start_at for m in bus.published]
    assert {m.requests for m in bus.published} == {1} and starts == sorted(starts)
    assert starts[0] >= 101.0 and all(m.start_at > m.issued_at for m in bus.published)
    assert all(b - a >= 1 / 97 - 1e-9 for a, b in itertools.pairwise(starts))
    assert 0.97 * 100 <= len(starts) <= 0.97 * 130  # a second, and the lead
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
