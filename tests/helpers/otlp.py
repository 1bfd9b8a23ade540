"""A receiver of OTLP/HTTP traces for the tests: what a collector would get.

It listens on loopback, accepts ``POST /v1/traces`` (``application/x-protobuf``, gzip or
not), decodes each body with the official protobuf definitions
(``opentelemetry-proto``'s ``ExportTraceServiceRequest``) and keeps every span with the
``service.name`` of the resource that sent it; then answers as a collector does. A body
that does not decode fails the test that reads the spans (it is kept as an error)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.helpers.support import free_port


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received: its service, ids (hex), name, kind, times and attributes."""

    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int

    @property
    def duration_ms(self) -> float:
        """How long it lasted, in milliseconds."""
        return (self.end_ns - self.start_ns) / 1e6


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return None if which is None else getattr(value, which)


def _spans(request: ExportTraceServiceRequest) -> Iterator[ReceivedSpan]:
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield ReceivedSpan(
                    service,
                    span.trace_id.hex(),
                    span.span_id.hex(),
                    span.parent_span_id.hex(),
                    span.name,
                    int(span.kind),
                    int(span.start_time_unix_nano),
                    int(span.end_time_unix_nano),
                    {a.key: _value(a.value) for a in span.attributes},
                    int(span.status.code),
                )


@dataclass
class OtlpReceiver:
    """The receiver (:meth:`start` it, or use it as an async context manager)."""

    port: int = field(default_factory=free_port)
    spans: list[ReceivedSpan] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: int = 0
    _runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        """``OTEL_EXPORTER_OTLP_ENDPOINT`` for the services (the exporter adds /v1/traces)."""
        return f"http://127.0.0.1:{self.port}"

    async def _traces(self, request: web.Request) -> web.Response:
        self.requests += 1
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if request.content_type != "application/x-protobuf":
            self.errors.append(f"content type {request.content_type!r}")
            return web.Response(status=415)
        message = ExportTraceServiceRequest()
        try:
            message.ParseFromString(body)
        except DecodeError as exc:
            self.errors.append(f"undecodable body: {exc}")
            return web.Response(status=400)
        self.spans.extend(_spans(message))
        reply = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=reply, content_type="application/x-protobuf")

    async def start(self) -> None:
        """Listen on :attr:`port`."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> OtlpReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans received of one trace, by start time."""
        return sorted((s for s in self.spans if s.trace_id == trace_id), key=lambda s: s.start_ns)

    def naming(self, batch_id: str) -> list[ReceivedSpan]:
        """The spans received that name job ``batch_id`` (``relay.batch_id``)."""
        return [s for s in self.spans if s.attributes.get("relay.batch_id") == batch_id]


def drawn(spans: list[ReceivedSpan]) -> str:
    """One trace drawn as text: a line per span (service, span, duration), indented under
    its parent, children by start time; offsets from the trace's first span."""
    by_parent: dict[str, list[ReceivedSpan]] = {}
    ids = {s.span_id for s in spans}
    for span in sorted(spans, key=lambda s: s.start_ns):
        parent = span.parent_id if span.parent_id in ids else ""
        by_parent.setdefault(parent, []).append(span)
    start = min(s.start_ns for s in spans)
    lines = [f"{'offset ms':>10}  {'duration ms':>11}  service / span"]

    def walk(parent: str, depth: int) -> None:
        for span in by_parent.get(parent, []):
            detail = _detail(span)
            lines.append(
                f"{(span.start_ns - start) / 1e6:10.1f}  {span.duration_ms:11.2f}  "
                f"{'  ' * depth}{span.service} / {span.name}{detail}"
            )
            walk(span.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines) + "\n"


def _detail(span: ReceivedSpan) -> str:
    a = span.attributes
    if "gen_ai.request.model" in a:
        return (
            f"  [row {a.get('relay.row')}, {a.get('gen_ai.provider.name')}"
            f" {a.get('relay.deployment')}, tokens {a.get('gen_ai.usage.input_tokens')}"
            f"/{a.get('gen_ai.usage.output_tokens')}, attempts {a.get('relay.attempts')}]"
        )
    if span.name == "release":
        return f"  [rows {a.get('relay.first_row')}-{a.get('relay.last_row')}]"
    if span.name == "record":
        return f"  [{a.get('relay.rows')} rows, finished={a.get('relay.finished')}]"
    if "http.response.status_code" in a:
        return f"  [HTTP {a['http.response.status_code']}]"
    return ""
