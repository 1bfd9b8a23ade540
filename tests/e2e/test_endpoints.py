"""Endpoints beyond chat end to end, through every service as its own process: the
official ``openai`` SDK's batch workflow on ``/v1/embeddings``, ``/v1/completions``,
``/v1/moderations`` and ``/v1/responses`` (each output line's body read by the SDK's own
type), the native API's ``endpoint`` field, and Responses rows on an Anthropic
deployment (translated where they fit, failed by name where they do not)."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest
from openai.types import Completion, CreateEmbeddingResponse, ModerationCreateResponse
from openai.types.responses import Response

from relay_batches.services.relay_cli import admin
from tests.helpers.processes import System
from tests.helpers.support import ApiClient, wait_until

EMBEDDING_MODEL = "text-embedding-3-small"


def jsonl(url: str, bodies: list[dict[str, Any]]) -> bytes:
    """A batch input file: one line per body, all to ``url``."""
    lines = [
        {"custom_id": f"r{n}", "method": "POST", "url": url, "body": body}
        for n, body in enumerate(bodies)
    ]
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


@pytest.fixture
async def client(system: System) -> AsyncIterator[openai.AsyncOpenAI]:
    """The SDK as a user sets it up, pointed at Relay, in a workspace of its own."""
    key = (await admin.create_key(system.iso.database_url, "endpoints")).key
    created = openai.AsyncOpenAI(base_url=f"{system.api_url}/openai/v1", api_key=key, max_retries=0)
    yield created
    await created.close()


async def run_file(
    client: openai.AsyncOpenAI, url: str, bodies: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Upload, create a batch on ``url``, poll it to completion; its output lines."""
    uploaded = await client.files.create(file=("in.jsonl", jsonl(url, bodies)), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id,
        endpoint=url,  # type: ignore[arg-type]  # the SDK's literal lists a subset
        completion_window="24h",
    )
    assert batch.endpoint == url

    async def ended() -> bool:
        nonlocal batch
        batch = await client.batches.retrieve(batch.id)
        return batch.status in ("completed", "failed")

    await wait_until(ended, 90, f"batch {batch.id} to end")
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (len(bodies), 0)
    assert batch.output_file_id is not None
    content = await client.files.content(batch.output_file_id)
    lines = [orjson.loads(x) for x in content.content.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == [f"r{n}" for n in range(len(bodies))]
    assert all(line["response"]["status_code"] == 200 for line in lines)
    return sorted(lines, key=lambda line: line["custom_id"])


async def test_embeddings_file_batch_output_is_the_sdk_type(client: openai.AsyncOpenAI) -> None:
    bodies: list[dict[str, Any]] = [
        {"model": EMBEDDING_MODEL, "input": "the quick brown fox"},
        {"model": EMBEDDING_MODEL, "input": ["a", "b"], "dimensions": 8},
        {"model": EMBEDDING_MODEL, "input": "the quick brown fox", "encoding_format": "base64"},
    ]
    lines = await run_file(client, "/v1/embeddings", bodies)
    # A base64 answer is what OpenAI sends too: the SDK's type holds it decoded, so it is
    # read with its vector (a string) set aside.
    packed_body = lines[2]["response"]["body"]
    encoded = packed_body["data"][0].pop("embedding")
    packed_body["data"][0]["embedding"] = []
    answers = [CreateEmbeddingResponse.model_validate(x["response"]["body"]) for x in lines]
    default, small, packed = answers
    assert len(default.data) == 1 and len(default.data[0].embedding) == 1536
    assert [len(item.embedding) for item in small.data] == [8, 8]
    assert small.data[0].embedding != small.data[1].embedding
    assert default.usage.prompt_tokens > 0 and default.usage.total_tokens > 0
    # base64: the same vector as float32 bytes (the same input gives the same vector).
    raw = base64.b64decode(encoded)
    unpacked = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(unpacked) == 1536
    assert unpacked == pytest.approx(default.data[0].embedding, abs=1e-6)
    assert packed.model == "sim-echo"


async def test_completions_moderations_responses_files(client: openai.AsyncOpenAI) -> None:
    completions = await run_file(
        client, "/v1/completions", [{"model": "gpt-4o-mini", "prompt": "say hi", "max_tokens": 5}]
    )
    completion = Completion.model_validate(completions[0]["response"]["body"])
    assert completion.choices[0].text == "echo: say hi"
    moderations = await run_file(
        client, "/v1/moderations", [{"model": "gpt-4o-mini", "input": ["one", "two"]}]
    )
    moderation = ModerationCreateResponse.model_validate(moderations[0]["response"]["body"])
    assert [result.flagged for result in moderation.results] == [False, False]
    responses = await run_file(
        client,
        "/v1/responses",
        [{"model": "gpt-4o-mini", "input": "hello there", "instructions": "be brief"}],
    )
    response = Response.model_validate(responses[0]["response"]["body"])
    assert response.output_text == "echo: hello there"
    assert response.usage is not None and response.usage.input_tokens > 0


async def test_unserved_endpoint_and_mismatched_file(client: openai.AsyncOpenAI) -> None:
    data = jsonl("/v1/embeddings", [{"model": EMBEDDING_MODEL, "input": "x"}])
    uploaded = await client.files.create(file=("in.jsonl", data), purpose="batch")
    with pytest.raises(openai.BadRequestError) as refused:
        await client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/images/generations",  # type: ignore[arg-type]
            completion_window="24h",
        )
    assert refused.value.param == "endpoint"
    # A file of embeddings lines under a chat batch: the batch fails, naming the url.
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "failed"
    assert batch.errors is not None and batch.errors.data
    assert batch.errors.data[0].param == "url"
    # An unknown key in a line's body fails the file naming the path.
    bad = jsonl("/v1/embeddings", [{"model": EMBEDDING_MODEL, "input": "x", "colour": 1}])
    uploaded = await client.files.create(file=("bad.jsonl", bad), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/embeddings",  # type: ignore[arg-type]
        completion_window="24h",
    )
    assert batch.status == "failed"
    assert batch.errors is not None and batch.errors.data[0].param == "body.colour"


async def test_native_embeddings_job_results_carry_the_answer(api: ApiClient) -> None:
    created = await api.submit(
        {
            "model": EMBEDDING_MODEL,
            "endpoint": "/v1/embeddings",
            "requests": [
                {"custom_id": "a", "input": "alpha", "dimensions": 4},
                {"custom_id": "b", "input": ["beta", "gamma"], "dimensions": 4},
            ],
        }
    )
    assert created["endpoint"] == "/v1/embeddings"
    done = await api.wait_status(created["id"], {"completed"}, 60)
    assert (done["completed"], done["failed"]) == (2, 0)
    assert done["usage"]["prompt_tokens"] > 0
    status, body = await api.request("GET", f"/v1/batches/{created['id']}/results")
    assert status == 200, body
    rows = {row["custom_id"]: row for row in body["data"]}
    first = CreateEmbeddingResponse.model_validate(rows["a"]["response"])
    assert len(first.data[0].embedding) == 4
    assert len(CreateEmbeddingResponse.model_validate(rows["b"]["response"]).data) == 2


async def test_native_rows_are_checked_by_the_endpoint_model(api: ApiClient) -> None:
    status, body = await api.request(
        "POST",
        "/v1/batches",
        json={
            "model": EMBEDDING_MODEL,
            "endpoint": "/v1/embeddings",
            "requests": [{"input": "x"}, {"input": "y", "messages": []}],
        },
    )
    assert status == 400 and body["error"]["param"] == "requests[1].messages", body
    status, body = await api.request(
        "POST",
        "/v1/batches",
        json={
            "model": EMBEDDING_MODEL,
            "endpoint": "/v1/audio/speech",
            "requests": [{"input": "x"}],
        },
    )
    assert status == 400 and body["error"]["param"] == "endpoint", body


async def test_a_deployment_without_the_endpoint_falls_through(api: ApiClient) -> None:
    created = await api.submit(
        {"model": "sim-fallback", "endpoint": "/v1/embeddings", "requests": [{"input": "x"}]}
    )
    done = await api.wait_status(created["id"], {"completed"}, 60)
    assert done["completed"] == 1
    status, body = await api.request("GET", f"/v1/batches/{created['id']}/results?include=details")
    assert status == 200
    assert body["data"][0]["deployment"] == "sim"
    assert body["data"][0]["attempts"] == 1


async def test_responses_rows_on_an_anthropic_deployment(api: ApiClient) -> None:
    created = await api.submit(
        {
            "model": "sim-claude",
            "endpoint": "/v1/responses",
            "requests": [
                {"custom_id": "fits", "input": "hello", "instructions": "be kind"},
                {
                    "custom_id": "items",
                    "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                    "max_output_tokens": 50,
                },
                {"custom_id": "tools", "input": "x", "tools": [{"type": "web_search"}]},
            ],
        }
    )
    done = await api.wait_status(created["id"], {"completed", "failed"}, 60)
    assert (done["completed"], done["failed"]) == (2, 1)
    status, body = await api.request("GET", f"/v1/batches/{created['id']}/results")
    assert status == 200
    rows = {row["custom_id"]: row for row in body["data"]}
    fits = Response.model_validate(rows["fits"]["response"])
    assert fits.output_text.startswith("echo: hello")
    assert Response.model_validate(rows["items"]["response"]).output_text.startswith("echo: hi")
    assert "cannot translate tools" in rows["tools"]["error"]
