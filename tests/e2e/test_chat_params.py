"""Issue 28 end to end through real processes, driven by the official SDKs: a batch file
with one line per chat-completions parameter runs every line (``n`` returns every
choice, ``logprobs`` the log probabilities, a dated snapshot name routes to its alias),
and the one line its only deployment cannot take (``logit_bias`` to an Anthropic-speaking
deployment) fails alone, its error naming the parameter and the deployment; and
``client.models.list()`` / ``retrieve()`` on both provider surfaces."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import anthropic
import openai
import pytest
from openai.types.chat import ChatCompletion

from relay_batches.services.relay_cli import admin
from tests.e2e.test_openai_sdk import content_lines, jsonl, line, wait_batch
from tests.helpers.anthropic_sdk import sdk_client
from tests.helpers.chat_params import SAMPLES
from tests.helpers.processes import System
from tests.helpers.support import ApiClient

# Every alias of the test routes (tests/helpers/processes.py), sorted as the lists are.
ALIASES = [
    "gpt-4o-mini",
    "sim-cached",
    "sim-claude",
    "sim-claude-half",
    "sim-endpoints-half",
    "sim-fallback",
    "sim-half",
    "sim-held-half",
    "sim-lanes",
    "sim-pair-half",
    "sim-priced",
    "text-embedding-3-small",
]


@pytest.fixture(scope="module")
async def params_key(system: System) -> str:
    """A key of these tests' own workspace."""
    return (await admin.create_key(system.iso.database_url, "chat-params")).key


@pytest.fixture
async def client(system: System, params_key: str) -> AsyncIterator[openai.AsyncOpenAI]:
    """The OpenAI SDK as a user sets it up, pointed at Relay."""
    created = openai.AsyncOpenAI(
        base_url=f"{system.api_url}/openai/v1", api_key=params_key, max_retries=0
    )
    yield created
    await created.close()


async def test_one_line_per_parameter_runs_and_a_refused_line_fails_alone(
    client: openai.AsyncOpenAI,
) -> None:
    lines = [line(f"p-{key}", f"about {key}", **{key: value}) for key, value in SAMPLES.items()]
    dated = line("dated", "a dated snapshot name")
    dated["body"]["model"] = "gpt-4o-mini-2024-07-18"
    refused = line("refused", "biased", logit_bias={"50256": -100})
    refused["body"]["model"] = "sim-claude"
    data = jsonl([*lines, dated, refused])
    uploaded = await client.files.create(file=("params.jsonl", data), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await wait_batch(client, batch.id, {"completed", "failed"})
    assert done.status == "completed", done.errors
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (len(SAMPLES) + 1, 1)

    assert done.output_file_id is not None and done.error_file_id is not None
    output = {x["custom_id"]: x for x in await content_lines(client, done.output_file_id)}
    assert set(output) == {f"p-{key}" for key in SAMPLES} | {"dated"}
    bodies = {
        custom_id: ChatCompletion.model_validate(x["response"]["body"])
        for custom_id, x in output.items()
    }
    for custom_id, body in bodies.items():
        assert body.choices[0].message.content, custom_id
    assert [c.index for c in bodies["p-n"].choices] == [0, 1, 2]
    assert all(c.message.content == "echo: about n" for c in bodies["p-n"].choices)
    assert len(bodies["p-temperature"].choices) == 1
    logprobs = bodies["p-logprobs"].choices[0].logprobs
    assert logprobs is not None and logprobs.content, "the provider's log probabilities"
    assert bodies["dated"].choices[0].message.content == "echo: a dated snapshot name"

    (error,) = await content_lines(client, done.error_file_id)
    assert error["custom_id"] == "refused"
    message = error["response"]["body"]["error"]["message"]
    assert message == ("upstream_error: sim-claude: anthropic deployments cannot take logit_bias")


async def test_the_openai_sdk_lists_and_retrieves_the_aliases(
    client: openai.AsyncOpenAI,
) -> None:
    models = [model async for model in client.models.list()]
    assert [m.id for m in models] == ALIASES
    assert {(m.object, m.owned_by) for m in models} == {("model", "relay")}
    assert all(type(m.created) is int and m.created > 0 for m in models)
    dated = await client.models.retrieve("gpt-4o-mini-2024-07-18")
    assert (dated.id, dated.object) == ("gpt-4o-mini-2024-07-18", "model")
    with pytest.raises(openai.NotFoundError) as missing:
        await client.models.retrieve("gpt-5-nowhere")
    assert "gpt-5-nowhere" in str(missing.value)


async def test_the_anthropic_sdk_pages_through_the_aliases(system: System, params_key: str) -> None:
    client = sdk_client(system.api_url, params_key)
    try:
        models = [model async for model in client.models.list(limit=3)]
        assert [m.id for m in models] == ALIASES
        assert {(m.type, m.display_name == m.id, m.lifecycle) for m in models} == {
            ("model", True, "active")
        }
        first = await client.models.list(limit=3)
        assert (first.has_more, first.first_id, first.last_id) == (True, ALIASES[0], ALIASES[2])
        back = await client.models.list(limit=2, before_id=ALIASES[3])
        assert [m.id for m in back.data] == ALIASES[1:3]
        one = await client.models.retrieve("sim-claude")
        assert (one.id, one.type) == ("sim-claude", "model")
        with pytest.raises(anthropic.NotFoundError):
            await client.models.retrieve("claude-nowhere")
    finally:
        await client.close()


async def test_native_results_show_the_first_choice_and_usage_counts_every_one(
    system: System, params_key: str, http: aiohttp.ClientSession
) -> None:
    api = ApiClient(system.api_url, params_key, http)
    rows = [
        {"custom_id": "one", "messages": [{"role": "user", "content": "count me"}]},
        {"custom_id": "three", "messages": [{"role": "user", "content": "count me"}], "n": 3},
        {
            "custom_id": "biased",
            "model": "sim-claude",
            "messages": [{"role": "user", "content": "x"}],
            "logit_bias": {"1": 5},
        },
    ]
    batch = await api.submit({"model": "gpt-4o-mini-2024-07-18", "requests": rows})
    done = await api.wait_status(batch["id"], {"completed", "failed"}, 60)
    assert (done["status"], done["completed"], done["failed"]) == ("completed", 2, 1)
    status, results = await api.request("GET", f"/v1/batches/{batch['id']}/results?include=details")
    assert status == 200, results
    one, three, biased = results["data"]
    assert one["content"] == three["content"] == "echo: count me"
    assert three["usage"]["completion_tokens"] == 3 * one["usage"]["completion_tokens"]
    assert biased["error"] == (
        "upstream_error: sim-claude: anthropic deployments cannot take logit_bias"
    )
