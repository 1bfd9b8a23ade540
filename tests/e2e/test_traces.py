"""Traces end to end: every service a real process exporting OTLP/HTTP to a receiver in
the test (:mod:`tests.helpers.otlp`, decoding with the official protobuf definitions).

A sampled job (ratio 1) with a webhook is one trace from its submit to its webhook POST:
ingest-api's submit, the dispatcher's claim and each slice's release, a span per row in
the row-worker with the GenAI attributes, the aggregator's recording and the notifier's
POST, whose ``traceparent`` header the receiver sees. A job submitted through an
ingest-api that samples nothing (ratio 0) exports no span from any service, and its
webhook carries no trace context. The sampled job's trace is drawn as text in
``test-output/traces/sampled-job.txt``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.helpers.otlp import OtlpReceiver, ReceivedSpan, drawn
from tests.helpers.processes import System, running_system, signed_in
from tests.helpers.support import ApiClient, WebhookReceiver, free_port, rows, wait_until

ROWS = 40
TRACED = {
    "relay-ingest-api",
    "relay-dispatcher",
    "relay-row-worker",
    "relay-aggregator",
    "relay-notifier",
}
SERVER, CLIENT, PRODUCER, CONSUMER = 2, 3, 4, 5  # OTLP span kinds


@pytest.fixture(scope="module")
async def receiver() -> AsyncIterator[OtlpReceiver]:
    """The OTLP receiver every service exports to."""
    async with OtlpReceiver() as otlp:
        yield otlp


@pytest.fixture(scope="module")
async def traced(
    receiver: OtlpReceiver, output_dir: Path, http: aiohttp.ClientSession
) -> AsyncIterator[System]:
    """The system with tracing on, every job sampled, spans exported within ~0.1 s."""
    async with running_system(
        "traces",
        output_dir / "e2e-traces",
        http,
        fresh_logs=True,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_TRACES_SAMPLER="parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG="1",
        OTEL_BSP_SCHEDULE_DELAY="100",
    ) as system:
        yield system


@pytest.fixture(scope="module")
async def hooks() -> AsyncIterator[WebhookReceiver]:
    """Where the jobs' webhooks go."""
    async with WebhookReceiver() as receiver:
        yield receiver


async def finished(api: ApiClient, hooks: WebhookReceiver, batch_id: str) -> dict[str, Any]:
    """Wait for the job to complete and its webhook to arrive; the webhook's headers."""
    batch = await api.wait_status(batch_id, {"completed"}, timeout=60)
    assert batch["completed"] == ROWS, batch

    async def hook() -> dict[str, str] | None:
        for body, headers in zip(hooks.bodies, hooks.headers, strict=True):
            if body.get("id") == batch_id:
                return headers
        return None

    return dict(await wait_until(hook, 30, f"the webhook of {batch_id}"))


async def whole_trace(receiver: OtlpReceiver, batch_id: str) -> list[ReceivedSpan]:
    """Wait until the job's trace holds a span of every traced service and one per row."""

    async def complete() -> list[ReceivedSpan] | None:
        submits = [s for s in receiver.naming(batch_id) if s.name == "submit"]
        if not submits:
            return None
        spans = receiver.of_trace(submits[0].trace_id)
        rows_seen = {s.attributes.get("relay.row") for s in spans if s.kind == CLIENT}
        services = {s.service for s in spans}
        return spans if services == TRACED and len(rows_seen - {None}) == ROWS else None

    return list(await wait_until(complete, 30, f"every service's spans of {batch_id}"))


async def test_a_sampled_job_is_one_trace_from_submit_to_webhook(
    traced: System,
    receiver: OtlpReceiver,
    hooks: WebhookReceiver,
    http: aiohttp.ClientSession,
    output_dir: Path,
) -> None:
    api = await signed_in(traced, http, "traced")
    created = await api.submit(
        {"model": "gpt-4o-mini", "requests": rows(ROWS), "webhookUrl": hooks.url}
    )
    webhook_headers = await finished(api, hooks, created["id"])
    spans = await whole_trace(receiver, created["id"])
    trace_id = spans[0].trace_id
    by_id = {s.span_id: s for s in spans}
    out = output_dir / "traces"
    out.mkdir(parents=True, exist_ok=True)
    (out / "sampled-job.txt").write_text(drawn(spans))

    # Every span naming the job is in this one trace.
    assert {s.trace_id for s in receiver.naming(created["id"])} == {trace_id}
    assert receiver.errors == []

    # The submit is the trace's root, a SERVER span of ingest-api.
    (submit,) = [s for s in spans if s.name == "submit"]
    assert (submit.service, submit.kind, submit.parent_id) == ("relay-ingest-api", SERVER, "")
    assert submit.attributes["relay.rows"] == ROWS
    assert submit.attributes["http.response.status_code"] == 201

    # The dispatcher's claim and releases hang under the submit; the releases cover the rows.
    claims = [s for s in spans if s.name == "claim"]
    assert [(c.service, c.parent_id) for c in claims] == [("relay-dispatcher", submit.span_id)]
    releases = [s for s in spans if s.name == "release"]
    assert releases and all(r.kind == PRODUCER and r.parent_id == submit.span_id for r in releases)

    # One CLIENT span per row, under the release of its slice, with the GenAI attributes.
    calls = sorted(
        (s for s in spans if s.kind == CLIENT and s.name != "webhook POST"),
        key=lambda s: s.attributes["relay.row"],
    )
    assert [s.attributes["relay.row"] for s in calls] == list(range(ROWS))
    for call in calls:
        a = call.attributes
        assert call.service == "relay-row-worker"
        assert call.name == "chat sim-echo"
        release = by_id[call.parent_id]
        assert release.name == "release"
        assert (
            release.attributes["relay.first_row"]
            <= a["relay.row"]
            <= release.attributes["relay.last_row"]
        )
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "openai"
        assert a["gen_ai.request.model"] == "sim-echo"
        assert a["gen_ai.usage.input_tokens"] > 0
        assert a["gen_ai.usage.output_tokens"] > 0
        assert (a["relay.deployment"], a["relay.attempts"], a["relay.alias"]) == (
            "sim",
            1,
            "gpt-4o-mini",
        )

    # The aggregator's recordings add up to the rows; the last one finished the job.
    records = [s for s in spans if s.name == "record"]
    assert all(r.service == "relay-aggregator" and r.kind == CONSUMER for r in records)
    assert sum(r.attributes["relay.rows"] for r in records) == ROWS
    assert [r.attributes["relay.finished"] for r in records].count(True) == 1

    # The webhook POST is the notifier's CLIENT span, under the recording that ended the
    # job (whose context job.finished carried); the receiver got the POST's traceparent.
    (post,) = [s for s in spans if s.name == "webhook POST"]
    (ended,) = [r for r in records if r.attributes["relay.finished"]]
    assert (post.service, post.kind, post.parent_id) == ("relay-notifier", CLIENT, ended.span_id)
    assert post.attributes["http.response.status_code"] == 204
    assert webhook_headers["traceparent"].split("-")[1:3] == [trace_id, post.span_id]

    # In time, each service's spans follow the one before.
    def first(service: str) -> int:
        return min(s.start_ns for s in spans if s.service == service)

    assert first("relay-ingest-api") <= first("relay-dispatcher") <= first("relay-row-worker")
    assert max(s.end_ns for s in records) <= post.start_ns


async def test_an_unsampled_job_exports_no_span_anywhere(
    traced: System,
    receiver: OtlpReceiver,
    hooks: WebhookReceiver,
    http: aiohttp.ClientSession,
) -> None:
    # A second ingest-api on the same system that samples no job (ratio 0): the decision
    # is made once, at the submit, and every other service follows it.
    port = free_port()
    unsampling = traced.add("ingest-api#2", RELAY_API_PORT=str(port), OTEL_TRACES_SAMPLER_ARG="0")
    unsampling.start()
    await unsampling.wait_ready(http)
    api = await signed_in(traced, http, "untraced")
    quiet = ApiClient(f"http://127.0.0.1:{port}", api.key, http)
    unsampled = await quiet.submit(
        {"model": "gpt-4o-mini", "requests": rows(ROWS), "webhookUrl": hooks.url}
    )
    unsampled_headers = await finished(api, hooks, unsampled["id"])

    # A sampled job after it: once every service's spans of that one are in, each has
    # exported whatever it made before (a batch span processor exports in order).
    after = await api.submit(
        {"model": "gpt-4o-mini", "requests": rows(ROWS), "webhookUrl": hooks.url}
    )
    await finished(api, hooks, after["id"])
    await whole_trace(receiver, after["id"])

    assert receiver.naming(unsampled["id"]) == []
    assert "traceparent" not in {name.lower() for name in unsampled_headers}
    conn = await asyncpg.connect(traced.iso.database_url)
    try:
        stored = await conn.fetch(
            "SELECT id, traceparent IS NOT NULL AS traced FROM batches WHERE id = ANY($1)",
            [unsampled["id"], after["id"]],
        )
    finally:
        await conn.close()
    assert {r["id"]: r["traced"] for r in stored} == {unsampled["id"]: False, after["id"]: True}
    assert receiver.errors == []
