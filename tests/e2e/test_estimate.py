"""The estimate before submit, end to end (every service its own process): what
``POST /v1/batches/estimate`` says a job costs comes within 10% of what it then costs on
the simulator, for a realtime-only job and for one planned in the batch lane; the job
reports its cached prompt tokens and its saving against all-realtime (API and webhook);
a bad body is refused naming the field."""

from __future__ import annotations

import io
from typing import Any

import aiohttp
import orjson
import pytest

from relay_batches.ids import new_id
from tests.helpers.processes import System, signed_in, system_fixture
from tests.helpers.support import ApiClient, WebhookReceiver, rows, wait_until

TOLERANCE = 0.10  # the bound on estimate vs actual cost
PROMPT = "Summarise item {i} in one line: " + "the quick brown fox jumps over a lazy dog " * 4

# Systems whose simulator has a prompt cache of 8 prefixes, with and without grouping.
CACHE = {"RELAY_SIM_CACHE_PREFIXES": "8"}
cached = system_fixture("estimate", sim_env=CACHE)
ungrouped = system_fixture("estimate-ungrouped", sim_env=CACHE, RELAY_PREFIX_GROUPING="off")


async def estimate(api: ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/batches/estimate``; insists on 200."""
    status, data = await api.request("POST", "/v1/batches/estimate", json=body)
    assert status == 200, data
    return dict(data)


def within(estimated: float, actual: float) -> bool:
    """Whether the estimate is within :data:`TOLERANCE` of the actual cost."""
    return abs(estimated - actual) <= TOLERANCE * actual


async def fresh(system: System, http: aiohttp.ClientSession) -> ApiClient:
    """A client of a new workspace (no observed completions yet)."""
    return await signed_in(system, http, f"estimate-{new_id()[:12]}")


async def test_a_realtime_job_costs_what_its_estimate_said(
    system: System, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    api = await fresh(system, http)
    body = {"model": "sim-priced", "requests": rows(40, PROMPT), "webhookUrl": webhooks.url}
    guess = await estimate(api, body)
    assert guess["object"] == "batch.estimate"
    assert guess["rows"] == 40 and guess["prompt_tokens"] > 40 * 40
    assert guess["completion_basis"] == "prompt"
    assert [lane["lane"] for lane in guess["lanes"]] == ["realtime"]
    assert [step["lane"] for step in guess["plan"]["steps"]] == ["realtime"]
    assert guess["cost_usd"] == guess["lanes"][0]["cost_usd"] > 0
    assert guess["expected_finish_at"].endswith("Z")

    created = await api.submit(body)
    batch = await api.wait_status(created["id"], {"completed"}, timeout=60)
    assert within(guess["cost_usd"], batch["cost_usd"]), (guess["cost_usd"], batch["cost_usd"])
    assert within(guess["prompt_tokens"], batch["usage"]["prompt_tokens"])
    # all realtime: nothing saved, and the realtime reference is what it cost
    assert batch["saving"]["all_realtime_usd"] == pytest.approx(batch["cost_usd"], rel=1e-3)
    assert batch["saving"]["saved_usd"] == pytest.approx(0, abs=1e-6)

    await wait_until(lambda: _hook(webhooks, created["id"]), 15, "the completion webhook")
    [hook] = webhooks.for_batch(created["id"])
    assert hook["saving"] == batch["saving"] and hook["cached_tokens"] == 0

    # once the workspace has answers of the alias, the completion estimate is observed
    again = await estimate(api, body)
    assert again["completion_basis"] == "observed"
    assert within(again["cost_usd"], batch["cost_usd"])


async def _hook(webhooks: WebhookReceiver, batch_id: str) -> list[dict[str, Any]]:
    return webhooks.for_batch(batch_id)


async def test_a_job_planned_in_the_batch_lane_costs_what_its_estimate_said(
    system: System, http: aiohttp.ClientSession
) -> None:
    api = await fresh(system, http)
    body = {"model": "sim-half", "requests": rows(30, PROMPT)}
    guess = await estimate(api, body)
    lanes = {lane["lane"]: lane["cost_usd"] for lane in guess["lanes"]}
    assert set(lanes) == {"batch", "realtime"}
    assert lanes["batch"] == pytest.approx(lanes["realtime"] / 2, rel=1e-3)
    assert [step["lane"] for step in guess["plan"]["steps"]] == ["batch"]  # no deadline
    assert guess["cost_usd"] == lanes["batch"]

    created = await api.submit(body)
    batch = await api.wait_status(created["id"], {"completed"}, timeout=90)
    assert within(guess["cost_usd"], batch["cost_usd"]), (guess["cost_usd"], batch["cost_usd"])
    # the batch lane's half price: half of all-realtime saved
    assert batch["saving"]["saved_fraction"] == pytest.approx(0.5, abs=0.01)
    assert within(lanes["realtime"], batch["saving"]["all_realtime_usd"])

    # a window the batch lane cannot meet: the plan is realtime
    short = await estimate(api, {**body, "completion_window": "1h"})
    assert [step["lane"] for step in short["plan"]["steps"]] == ["realtime"]
    short_lanes = {lane["lane"]: lane["cost_usd"] for lane in short["lanes"]}
    assert short["cost_usd"] == short_lanes["realtime"]
    assert short["plan"]["fits"] and short["completion_basis"] == "observed"


async def test_a_job_on_three_lanes_records_its_plan_and_cost_per_lane_as_estimated(
    system: System, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    api = await fresh(system, http)
    body = {"model": "sim-lanes", "requests": rows(200, PROMPT), "webhookUrl": webhooks.url}
    guess = await estimate(api, body)
    assert [lane["lane"] for lane in guess["lanes"]] == ["batch", "flex", "realtime"]
    assert [step["lane"] for step in guess["plan"]["steps"]] == ["batch"]  # no deadline

    created = await api.submit(body)
    batch = await api.wait_status(created["id"], {"completed"}, timeout=90)
    assert within(guess["cost_usd"], batch["cost_usd"]), (guess["cost_usd"], batch["cost_usd"])
    assert batch["lanes"]["batch"]["rows"] == 200
    assert batch["lanes"]["batch"]["cost_usd"] == batch["cost_usd"]
    assert batch["lanes"]["flex"]["rows"] == batch["lanes"]["realtime"]["rows"] == 0
    assert [step["lane"] for step in batch["plan"]["steps"]] == ["batch"]
    assert batch["saving"]["saved_fraction"] == pytest.approx(0.5, abs=0.01)
    await wait_until(lambda: _hook(webhooks, created["id"]), 15, "the completion webhook")
    [hook] = webhooks.for_batch(created["id"])
    assert hook["lanes"] == batch["lanes"] and hook["saving"] == batch["saving"]


async def test_an_uploaded_file_is_estimated_by_its_id(
    system: System, http: aiohttp.ClientSession
) -> None:
    api = await fresh(system, http)
    lines = b"".join(
        orjson.dumps(
            {
                "custom_id": f"f-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "sim-priced", "messages": row["messages"]},
            }
        )
        + b"\n"
        for i, row in enumerate(rows(25, PROMPT))
    )
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", io.BytesIO(lines), filename="in.jsonl", content_type="application/jsonl")
    status, uploaded = await api.request("POST", "/openai/v1/files", data=form)
    assert status == 200, uploaded
    by_file = await estimate(api, {"input_file_id": uploaded["id"], "model": "sim-priced"})
    by_body = await estimate(api, {"model": "sim-priced", "requests": rows(25, PROMPT)})
    assert by_file["rows"] == 25
    assert by_file["prompt_tokens"] == by_body["prompt_tokens"]
    assert by_file["cost_usd"] == by_body["cost_usd"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "no-such-model", "requests": rows(1)}, 400, "model"),
        ({"model": "sim-priced", "requests": []}, 400, "requests"),
        ({"model": "sim-priced", "requests": rows(1), "budget_usd": -1}, 400, "budget_usd"),
        ({"input_file_id": "file-" + "0" * 32, "model": "sim-priced"}, 404, "input_file_id"),
        ({"input_file_id": 7}, 404, "input_file_id"),
    ],
)
async def test_a_bad_body_is_refused_naming_the_field(
    api: ApiClient, body: dict[str, Any], status: int, param: str
) -> None:
    got, data = await api.request("POST", "/v1/batches/estimate", json=body)
    assert got == status, data
    assert data["error"]["param"] == param


async def test_cached_prompt_tokens_are_read_priced_and_reported(
    cached: System, http: aiohttp.ClientSession
) -> None:
    api = await signed_in(cached, http, "estimate-cache")
    system_prompt = "You are a careful assistant. " * 40  # about 290 tokens, shared
    requests = [
        {
            "custom_id": f"c-{i}",
            "messages": [
                {"role": "system", "content": system_prompt},
                {"role": "user", "content": f"question {i}"},
            ],
        }
        for i in range(30)
    ]
    created = await api.submit({"model": "sim-cached", "requests": requests})
    batch = await api.wait_status(created["id"], {"completed"}, timeout=60)
    cached_tokens = batch["usage"]["cached_tokens"]
    # every row after the first of its prefix reads the system prompt from the cache
    assert cached_tokens >= 20 * 290
    prompt, completion = batch["usage"]["prompt_tokens"], batch["usage"]["completion_tokens"]
    expected = ((prompt - cached_tokens) * 1000 + cached_tokens * 100 + completion * 2000) / 1e6
    assert batch["cost_usd"] == pytest.approx(expected, rel=1e-3)
    # the realtime reference is the same deployment, cache included: nothing saved
    assert batch["saving"]["saved_usd"] == pytest.approx(0, abs=1e-6)


def interleaved(n: int, prefixes: int) -> list[dict[str, Any]]:
    """``n`` rows cycling through ``prefixes`` system prompts (more than the cache holds)."""
    return [
        {
            "custom_id": f"i-{i}",
            "messages": [
                {"role": "system", "content": f"prompt {i % prefixes}: " + "be brief. " * 60},
                {"role": "user", "content": f"question {i}"},
            ],
        }
        for i in range(n)
    ]


async def _cache_share(system: System, http: aiohttp.ClientSession) -> float:
    api = await fresh(system, http)
    created = await api.submit({"model": "sim-cached", "requests": interleaved(200, 20)})
    batch = await api.wait_status(created["id"], {"completed"}, timeout=60)
    return float(batch["usage"]["cached_tokens"] / batch["usage"]["prompt_tokens"])


async def test_rows_grouped_by_prefix_read_the_cache_and_interleaved_ones_do_not(
    cached: System, ungrouped: System, http: aiohttp.ClientSession
) -> None:
    # 20 prefixes cycled through, a cache of 8: only grouping keeps a prefix cached
    grouped, interleaved_share = (
        await _cache_share(cached, http),
        await _cache_share(ungrouped, http),
    )
    assert grouped > 0.5, grouped
    assert interleaved_share < 0.1, interleaved_share
