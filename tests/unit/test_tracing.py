"""Tracing (relay_batches.tracing): off by default and then inert, the standard OTEL_*
variables read as the specification says (one line for a value Relay cannot honour), a
job's span only under its stored, sampled context, and a row's span with the GenAI
attributes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from relay_batches.router.aliases import AliasTable, Deployment
from relay_batches.router.types import Completion, RowResult
from relay_batches.services.row_worker.traced import RowSpans, row_spans
from relay_batches.settings import ConfigError
from relay_batches.tracing import (
    attach_delivered,
    child_span,
    current_traceparent,
    detach,
    enabled,
    finished_span,
    job_span,
    root_span,
    setup_tracing,
    tracing_wanted,
    with_trace,
)
from relay_batches.tracing.setup import sampler_from
from relay_batches.tracing.spans import install

UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Tracing on, every root sampled, spans kept in memory; off again afterwards."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON, shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    install(provider.get_tracer("test"))
    yield exporter
    install(None)
    provider.shutdown()


def test_tracing_is_off_unless_an_exporter_or_endpoint_is_named() -> None:
    assert not tracing_wanted({})
    assert tracing_wanted(ENDPOINT)
    assert tracing_wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert tracing_wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing_wanted({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"})
    assert not tracing_wanted({**ENDPOINT, "OTEL_SDK_DISABLED": "true"})


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER"),
        ({**ENDPOINT, "OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        ({**ENDPOINT, "OTEL_TRACES_SAMPLER_ARG": "1.5"}, "OTEL_TRACES_SAMPLER_ARG"),
        ({**ENDPOINT, "OTEL_TRACES_SAMPLER_ARG": "half"}, "OTEL_TRACES_SAMPLER_ARG"),
        ({**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ],
)
def test_a_value_relay_cannot_honour_is_one_config_line(
    environ: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        setup_tracing("dispatcher", environ)
    assert not enabled()


def test_the_default_sampler_is_parent_based_at_the_default_ratio() -> None:
    assert "TraceIdRatioBased{0.1}" in sampler_from({}).get_description()
    assert (
        "TraceIdRatioBased{0.5}"
        in sampler_from({"OTEL_TRACES_SAMPLER_ARG": "0.5"}).get_description()
    )
    named = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio"}
    assert "TraceIdRatioBased{1.0}" in sampler_from(named).get_description()
    assert (
        sampler_from({"OTEL_TRACES_SAMPLER": "always_off"}).get_description() == "AlwaysOffSampler"
    )


def test_off_nothing_of_the_sdk_is_imported_and_every_helper_is_inert() -> None:
    script = (
        "import sys\n"
        "from relay_batches.runtime import run_service\n"
        "from relay_batches.tracing import setup_tracing, job_span, current_traceparent\n"
        "assert setup_tracing('row-worker', {}) is None\n"
        f"with job_span('x', {UNSAMPLED.replace('-00', '-01')!r}) as span:\n"
        "    assert span is None and current_traceparent() is None\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def test_a_submit_starts_the_trace_its_job_stores_and_spans_follow_it(
    exported: InMemorySpanExporter,
) -> None:
    with root_span("submit", {}) as submit:
        assert submit is not None
        stored = current_traceparent()
    assert stored is not None
    with job_span("claim", stored) as claim:
        assert claim is not None
    recorded = finished_span("record", stored, 1_000, 2_000)
    assert recorded is not None and recorded.split("-")[1] == stored.split("-")[1]
    spans: dict[str, ReadableSpan] = {s.name: s for s in exported.get_finished_spans()}
    root = spans["submit"].context
    assert spans["claim"].parent is not None and spans["claim"].parent.span_id == root.span_id
    assert (spans["record"].start_time, spans["record"].end_time) == (1_000, 2_000)
    assert {s.context.trace_id for s in spans.values()} == {root.trace_id}


def test_an_untraced_or_unsampled_job_makes_no_span(exported: InMemorySpanExporter) -> None:
    for traceparent in (None, UNSAMPLED, "not a traceparent"):
        with job_span("claim", traceparent) as span:
            assert span is None
        assert finished_span("record", traceparent, 1, 2) is None
        assert attach_delivered({"traceparent": traceparent}) is None
    with child_span("row") as span:  # nothing delivered: no current job
        assert span is None
    assert exported.get_finished_spans() == ()
    assert with_trace({"a": "b"}, None) == {"a": "b"}
    assert with_trace(None, "tp") == {"traceparent": "tp"}


def test_a_delivery_carrying_a_sampled_context_makes_it_current(
    exported: InMemorySpanExporter,
) -> None:
    with root_span("submit", {}):
        carried = current_traceparent()
    token = attach_delivered({"traceparent": (carried or "").encode()})
    try:
        with child_span("row") as span:
            assert span is not None
    finally:
        detach(token)
    (_, row) = exported.get_finished_spans()
    assert row.parent is not None and f"{row.parent.span_id:016x}" == (carried or "").split("-")[2]


async def test_a_row_span_has_the_genai_attributes(exported: InMemorySpanExporter) -> None:
    deployment = Deployment("sim", "openai", "http://127.0.0.1/v1", "sim-echo")
    spans = row_spans(AliasTable({"gpt-4o-mini": (deployment,)}))
    assert isinstance(spans, RowSpans)
    result = RowResult(
        Completion("hi", 7, 3, finish_reason="stop", model="sim-echo-1"), None, 2, "sim"
    )

    async def call() -> RowResult:
        return result

    with root_span("release", {}):
        carried = current_traceparent()
    token = attach_delivered({"traceparent": carried})
    try:
        assert (
            await spans.traced(call(), "batch_1", 4, "gpt-4o-mini", "/v1/chat/completions")
            is result
        )
    finally:
        detach(token)
    row = next(s for s in exported.get_finished_spans() if s.name != "release")
    assert row.name == "chat sim-echo"
    assert dict(row.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "sim-echo",
        "gen_ai.response.model": "sim-echo-1",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": 3,
        "relay.batch_id": "batch_1",
        "relay.row": 4,
        "relay.alias": "gpt-4o-mini",
        "relay.deployment": "sim",
        "relay.attempts": 2,
        "relay.dead_letter": False,
    }


def test_row_spans_are_none_while_tracing_is_off() -> None:
    assert row_spans(AliasTable({})) is None
