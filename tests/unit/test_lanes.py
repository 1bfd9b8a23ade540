"""Lanes outside the plan: the routes' lane keys, the router's flex lane, the lane on
the wire, an alias's offers, and the simulator's flex refusals and stalled batches."""

from __future__ import annotations

import math
from typing import Any

import pytest

from relay_batches.lanes.offers import learned_turnaround, offers_for
from relay_batches.lanes.plan import fast_rate
from relay_batches.messages import OutcomesMessage, RowOutcome
from relay_batches.router.aliases import parse_aliases
from relay_batches.router.http1 import Http1Client
from relay_batches.router.types import Completion, RowResult
from relay_batches.services.upstream_sim.config import SimConfig
from relay_batches.settings import ConfigError
from tests.unit.test_router import (
    MESSAGES,
    SleepRecorder,
    Upstream,
    deployment,
    make_router,
    reply,
    status,
)
from tests.unit.test_routes import deployment as spec
from tests.unit.test_routes import routes_data
from tests.unit.test_upstream_sim import MakeClient
from tests.unit.test_upstream_sim_batches import line, poll, submit

__all__ = ["make_client", "session", "upstream"]  # fixtures shared with those modules
from tests.unit.test_router import session, upstream
from tests.unit.test_upstream_sim import make_client

BASE = "http://127.0.0.1:8090/v1"


def three_lanes(**flex: Any) -> dict[str, Any]:
    return {
        "deployments": {
            "b": {"provider": "openai-batch", "base_url": BASE, "model": "m", "turnaround": "2h"},
            "f": {"provider": "openai", "base_url": BASE, "model": "m", "service_tier": "flex"}
            | flex,
            "r": {"provider": "openai", "base_url": BASE, "model": "m", "rpm": 600},
        },
        "aliases": {"a": {"deployments": ["b", "f", "r"]}},
    }


def test_each_deployment_has_its_lane_and_its_keys_are_checked() -> None:
    table = parse_aliases(three_lanes(rows_per_s=20), {})
    lanes = [(d.name, d.lane) for d in table.resolve("a") or ()]
    assert lanes == [("b", "batch"), ("f", "flex"), ("r", "realtime")]
    batch = table.batch_lead("a")
    assert batch is not None and batch.batch is not None
    assert batch.batch.turnaround.total_seconds() == 7200
    for bad, key in [
        (spec(service_tier="priority"), "service_tier must be 'flex'"),
        (spec(provider="anthropic", service_tier="flex"), "only for OpenAI-compatible"),
        (spec(rows_per_s=0), "rows_per_s must be a number greater than 0"),
        (spec(provider="openai-batch", turnaround="25h"), "no longer than its window"),
        (spec(turnaround="1h"), "turnaround is only for batch providers"),
    ]:
        with pytest.raises(ConfigError, match=key):
            parse_aliases(routes_data(bad), {})


def test_offers_take_measured_then_declared_then_rpm_never_past_the_rpm() -> None:
    table = parse_aliases(three_lanes(rows_per_s=20), {})
    offers = {o.lane: o for o in offers_for(table, "a", {"b": 600.0})}
    assert offers["batch"].expected_turnaround_s == 600
    assert offers["flex"].rows_per_s == 20 and offers["realtime"].rows_per_s == 10
    measured = {o.lane: o for o in offers_for(table, "a", None, {"flex": 55, "realtime": 99})}
    assert measured["batch"].expected_turnaround_s == 7200
    assert measured["flex"].rows_per_s == 55
    assert measured["realtime"].rows_per_s == 10  # its rpm caps what was measured
    assert fast_rate(list(measured.values())) == 65
    unknown = parse_aliases(three_lanes(), {})
    assert fast_rate(offers_for(unknown, "a")) == 10  # flex unknown: not counted on


def test_the_turnaround_is_learned_after_three_batches() -> None:
    assert learned_turnaround(600, [10, 20]) == 600
    assert learned_turnaround(600, [10, 20, 900]) == 900
    assert math.isclose(learned_turnaround(600, [5, 6, 7]), 7)


async def test_flex_sends_its_tier_and_a_429_goes_to_the_next_lane_at_once(
    upstream: Upstream, session: Http1Client
) -> None:
    sleep = SleepRecorder()
    upstream.script("f", status(429, "flex capacity"))
    upstream.script("r", reply("realtime"))
    flex = deployment(upstream, "f", service_tier="flex", max_retries=3)
    router = make_router(session, sleep, flex, deployment(upstream, "r"))
    result = await router.complete("chat", MESSAGES, {"service_tier": "auto"})
    assert result == RowResult(Completion("realtime", 3, 5), None, 2, "r")
    assert [c.deployment for c in upstream.calls] == ["f", "r"]
    assert upstream.calls[0].body["service_tier"] == "flex"  # the deployment's, always
    assert sleep.delays == []  # no retry of the refusal
    upstream.script("f", reply("flex"))
    answered = await router.complete("chat", MESSAGES, {})
    assert (answered.deployment, answered.lane) == ("f", "flex")  # no cooldown either


def test_the_lane_rides_the_wire_only_when_not_realtime() -> None:
    plain = RowOutcome("b", 1, "x", None, 1, deployment="r", cost_usd=0.5)
    batch = RowOutcome("b", 2, "x", None, 1, deployment="bd", cost_usd=0.25, lane="batch")
    assert len(plain.as_list()) == 14
    decoded = OutcomesMessage.decode(OutcomesMessage((plain, batch)).encode())
    assert decoded.outcomes == (plain, batch)


async def test_the_simulator_refuses_its_flex_share_and_can_stall_batches(
    make_client: MakeClient,
) -> None:
    client = await make_client(SimConfig(flex_refusal=0.25))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    codes = []
    for _ in range(8):
        async with client.post("/v1/chat/completions", json=body | {"service_tier": "flex"}) as r:
            codes.append(r.status)
    assert codes == [200, 200, 200, 429] * 2
    async with client.post("/v1/chat/completions", json=body) as r:
        assert r.status == 200  # not flex: never refused
    async with client.get("/stats") as r:
        stats = await r.json()
    assert (stats["flex_calls"], stats["flex_refused"]) == (8, 2)

    stalled = await make_client(SimConfig(batch_stall=1))
    created = await submit(stalled, [line("a", "x")])
    for _ in range(3):
        running = await poll(stalled, created["id"])
        assert running["status"] == "in_progress"
        assert running["request_counts"]["completed"] == 0
    async with stalled.post(f"/v1/batches/{created['id']}/cancel"):
        pass
    done = await poll(stalled, created["id"])
    assert done["status"] == "cancelled" and done["output_file_id"] is None
