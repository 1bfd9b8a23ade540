"""The estimate's counting and pricing, cached prompt tokens through price, outcome and
wire, the saving against all-realtime, prefix grouping and the simulator's prompt cache."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import orjson
import pytest

from relay_batches.dialects.endpoints import ENDPOINT_KEY
from relay_batches.estimate.pricing import lane_offers, price_estimate
from relay_batches.estimate.tally import Tally
from relay_batches.messages import OutcomesMessage, RowOutcome
from relay_batches.model import Job, JobStatus
from relay_batches.outcome import to_outcome
from relay_batches.prefixes import PREFIX_CHARS, grouped
from relay_batches.router.aliases import Price, parse_aliases
from relay_batches.router.types import Completion, RowResult, cached_tokens_of
from relay_batches.services.upstream_sim.echo import estimate_tokens
from relay_batches.services.upstream_sim.prompt_cache import PromptCache
from relay_batches.settings import ConfigError

NOW = datetime(2026, 10, 4, 9, 0, tzinfo=UTC)
ROUTES = {
    "aliases": {
        "half": {"deployments": ["batch", "flex", "rt", "unpriced"]},
        "rt-only": {"deployments": ["rt"]},
        "free": {"deployments": ["unpriced"]},
    },
    "deployments": {
        "batch": {
            "provider": "openai-batch",
            "base_url": "http://x/v1",
            "model": "m",
            "price": {"prompt_per_mtok": 0.5, "completion_per_mtok": 1.0},
        },
        "rt": {
            "provider": "openai",
            "base_url": "http://x/v1",
            "model": "m",
            "rpm": 600,
            "price": {
                "prompt_per_mtok": 1.0,
                "completion_per_mtok": 2.0,
                "cached_prompt_per_mtok": 0.1,
            },
        },
        "flex": {
            "provider": "openai",
            "base_url": "http://x/v1",
            "model": "m",
            "service_tier": "flex",
            "price": {"prompt_per_mtok": 0.5, "completion_per_mtok": 1.0},
        },
        "unpriced": {"provider": "openai", "base_url": "http://x/v1", "model": "m"},
    },
}
TABLE = parse_aliases(ROUTES, {})


def row(text: str, **fields: object) -> str:
    """A stored row request: its messages, or an object with its own fields."""
    messages = [{"content": text, "role": "user"}]
    return orjson.dumps({**fields, "messages": messages} if fields else messages).decode()


def test_the_tally_counts_prompt_tokens_four_characters_a_token() -> None:
    tally = Tally({})
    tally.add_page([row("x" * 40), row("x" * 41)])
    assert (tally.rows, tally.prompt_tokens) == (2, 10 + 11)
    # none observed: as many completion tokens as each row's prompt
    assert (tally.completion_tokens, tally.completion_basis) == (21, "prompt")


def test_the_observed_mean_completion_stands_in_and_max_tokens_caps_it() -> None:
    tally = Tally({"max_tokens": 30}, mean_completion=50.0)
    tally.add_page([row("x" * 40), row("x" * 40, max_tokens=8), row("x" * 40, max_tokens=100)])
    assert tally.completion_basis == "observed"
    assert tally.completion_tokens == 30 + 8 + 50  # the job's cap, the row's, the mean


def test_a_body_of_another_endpoint_counts_its_input_and_no_completion() -> None:
    tally = Tally({})
    body = {"input": ["x" * 8, "x" * 12], ENDPOINT_KEY: "/v1/embeddings"}
    tally.add(orjson.dumps(body).decode())
    assert (tally.rows, tally.prompt_tokens, tally.completion_tokens) == (1, 5, 0)


def test_a_row_that_does_not_decode_counts_as_a_row_of_no_tokens() -> None:
    tally = Tally({})
    tally.add("not json")
    assert (tally.rows, tally.prompt_tokens) == (1, 0)


def test_the_lanes_an_alias_offers_are_its_first_priced_deployment_of_each_lane() -> None:
    offers = lane_offers(TABLE, "half")
    assert [(o.lane, o.deployment) for o in offers] == [
        ("batch", "batch"),
        ("flex", "flex"),
        ("realtime", "rt"),
    ]
    assert offers[0].expected_turnaround_s == 12 * 3600  # the declared turnaround
    assert offers[2].rows_per_s == 10  # rpm 600
    assert lane_offers(TABLE, "half", {"realtime": 4.0})[2].rows_per_s == 4.0  # measured
    assert lane_offers(TABLE, "free") == []
    # the realtime reference is never the flex deployment
    assert TABLE.realtime_references()["flex"] == TABLE.prices()["rt"]


def test_the_estimate_prices_each_lane_and_plans_within_the_window() -> None:
    tally = Tally({})
    tally.add_page([row("x" * 400)] * 100)  # 100 prompt and 100 completion tokens a row
    offers = lane_offers(TABLE, "rt-only")
    realtime = price_estimate(tally, offers, None, None, NOW).to_api()
    assert realtime["lanes"] == [{"lane": "realtime", "deployment": "rt", "cost_usd": 0.03}]
    assert [s["lane"] for s in realtime["plan"]["steps"]] == ["realtime"]
    offers = [o for o in lane_offers(TABLE, "half") if o.lane != "flex"]
    unlimited = price_estimate(tally, offers, None, None, NOW).to_api()
    assert unlimited["lanes"] == [
        {"lane": "batch", "deployment": "batch", "cost_usd": 0.015},
        {"lane": "realtime", "deployment": "rt", "cost_usd": 0.03},
    ]
    assert [s["lane"] for s in unlimited["plan"]["steps"]] == ["batch"]
    assert unlimited["cost_usd"] == 0.015
    assert (unlimited["rows"], unlimited["prompt_tokens"], unlimited["completion_tokens"]) == (
        100,
        10_000,
        10_000,
    )
    hour = price_estimate(tally, offers, 3600, None, NOW).to_api()
    assert [s["lane"] for s in hour["plan"]["steps"]] == ["realtime"]
    assert hour["cost_usd"] == 0.03 and hour["plan"]["fits"]
    assert hour["expected_finish_s"] == 10.0  # 100 rows at rpm 600
    assert hour["expected_finish_at"] == "2026-10-04T09:00:10Z"


def test_a_cached_rate_prices_the_cached_prompt_tokens() -> None:
    price = Price(1.0, 2.0, 0.1)
    assert price.cost_usd(1000, 100, 600) == pytest.approx((400 + 60 + 200) / 1e6)
    assert Price(1.0, 2.0).cost_usd(1000, 100, 600) == Price(1.0, 2.0).cost_usd(1000, 100)
    assert price.cost_usd(10, 0, 600) == pytest.approx(1 / 1e6)  # never above the prompt
    assert TABLE.prices()["rt"] == price


def test_a_negative_cached_rate_stops_start_up_naming_the_key() -> None:
    bad = {**ROUTES["deployments"]["rt"], "price": {"cached_prompt_per_mtok": -1}}
    with pytest.raises(ConfigError, match=r"price\.cached_prompt_per_mtok must be a non-negative"):
        parse_aliases({**ROUTES, "deployments": {**ROUTES["deployments"], "rt": bad}}, {})


@pytest.mark.parametrize(
    ("usage", "cached"),
    [
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 6}}, 6),
        ({"input_tokens": 4, "cache_read_input_tokens": 6}, 6),
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": "6"}}, 0),
        ({"prompt_tokens": 10}, 0),
        (None, 0),
    ],
)
def test_cached_tokens_are_read_from_either_providers_usage(usage: object, cached: int) -> None:
    assert cached_tokens_of(usage) == cached


def test_the_realtime_reference_is_the_aliases_first_priced_realtime_deployment() -> None:
    # Batch and flex rows are priced at the alias's first priced realtime deployment; a
    # realtime row at its own price (it saved nothing), an unpriced one at none (a job
    # it answered on the simulator does not claim a saving).
    references = TABLE.realtime_references()
    rt = TABLE.prices()["rt"]
    assert references == {"batch": rt, "flex": rt, "rt": rt}


def test_an_outcome_carries_its_cached_tokens_and_all_realtime_cost_over_the_wire() -> None:
    result = RowResult(Completion("ok", 1000, 100, cached_tokens=600), None, 1, "batch")
    prices = TABLE.prices()
    outcome = to_outcome("b" * 32, 3, result, None, prices["batch"], prices["rt"])
    assert outcome.cached_tokens == 600
    assert outcome.cost_usd == pytest.approx((1000 * 0.5 + 100 * 1.0) / 1e6)
    assert outcome.all_realtime_usd == pytest.approx((400 + 60 + 200) / 1e6)
    decoded = OutcomesMessage.decode(OutcomesMessage((outcome,)).encode()).outcomes[0]
    assert decoded == outcome
    plain = RowOutcome("b" * 32, 1, "ok", None, 1, prompt_tokens=3, completion_tokens=4)
    assert len(plain.as_list()) == 14  # nothing cached, no reference: the older wire form
    assert OutcomesMessage.decode(OutcomesMessage((plain,)).encode()).outcomes[0] == plain


def test_a_job_reports_what_it_saved_against_all_realtime() -> None:
    job = Job(
        "a" * 32, "w", "n", "half", 0, JobStatus.COMPLETED, 2, 2, 0, 0, None, None, None,
        None, "a" * 32, "{}", None, NOW, NOW, NOW, cost_usd=0.5, all_realtime_usd=1.25,
        cached_tokens=7,
    )  # fmt: skip
    assert job.saving() == {"all_realtime_usd": 1.25, "saved_usd": 0.75, "saved_fraction": 0.6}
    assert job.to_api(NOW)["usage"]["cached_tokens"] == 7
    assert job.webhook_body()["saving"] == job.saving()
    none = replace(job, all_realtime_usd=0.0)
    assert none.saving() == {"all_realtime_usd": 0.0, "saved_usd": 0.0, "saved_fraction": None}


def test_rows_are_grouped_by_the_prefix_of_their_request_in_their_order() -> None:
    a, b = "system A " * 10, "system B " * 10
    rows = [(0, a + "q0"), (1, b + "q1"), (2, a + "q2"), (3, b + "q3"), (4, a + "q4")]
    order = [i for i, _ in grouped(rows, lambda r: r[1])]
    assert order == [0, 2, 4, 1, 3]
    # past PREFIX_CHARS only the order they came in counts
    long = [(0, "x" * PREFIX_CHARS + "b"), (1, "x" * PREFIX_CHARS + "a")]
    assert grouped(long, lambda r: r[1]) == long


def test_the_simulated_cache_reads_prefixes_seen_lately_least_recently_used_first_out() -> None:
    now = [0.0]
    cache = PromptCache(2, 10.0, clock=lambda: now[0])
    system = "s" * 40  # 10 tokens
    assert cache.cached((system, "q1"), estimate_tokens) == 0  # first sight primes it
    assert cache.cached((system, "q2"), estimate_tokens) == 10
    assert cache.cached(("only one message",), estimate_tokens) == 0  # no prefix
    cache.cached(("other 1", "q"), estimate_tokens)
    cache.cached(("other 2", "q"), estimate_tokens)  # the system prompt is pushed out
    assert cache.cached((system, "q3"), estimate_tokens) == 0
    now[0] = 11.0  # idle past its lifetime
    assert cache.cached((system, "q4"), estimate_tokens) == 0
    assert cache.stats()["cache_reads"] == 1 and cache.stats()["cached_tokens"] == 10
    assert PromptCache(0, 10.0).cached((system, "q"), estimate_tokens) == 0
    assert PromptCache(0, 10.0).stats() == {}
