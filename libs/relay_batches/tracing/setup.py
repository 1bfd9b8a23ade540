"""Turning tracing on from the standard ``OTEL_*`` variables, once per process.

Tracing is on when an exporter is named (``OTEL_TRACES_EXPORTER``: ``otlp``, ``console``)
or an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), unless ``OTEL_TRACES_EXPORTER=none`` or
``OTEL_SDK_DISABLED=true``. Then the SDK is imported and set up: spans go through a batch
span processor (a thread of its own, ``OTEL_BSP_*``) to the OTLP/HTTP protobuf exporter
(its endpoint, headers, timeout and compression are the SDK's own ``OTEL_EXPORTER_OTLP_*``
reading). The service is named ``relay-<service>`` unless ``OTEL_SERVICE_NAME`` (or
``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``) names it.

Sampling is decided once per job, at its submit: ``OTEL_TRACES_SAMPLER`` with its
``OTEL_TRACES_SAMPLER_ARG``, as the specification reads them; unset, Relay samples
``parentbased_traceidratio`` at :data:`DEFAULT_RATIO` (or at ``OTEL_TRACES_SAMPLER_ARG``
if that alone is set). A value Relay cannot honour (an unknown sampler or exporter, a
ratio outside 0..1, the gRPC protocol) is a :class:`ConfigError`: one start-up line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from relay_batches.settings import ConfigError
from relay_batches.tracing.spans import install

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler

DEFAULT_RATIO = 0.1  # of jobs sampled when OTEL_TRACES_SAMPLER is unset
EXPORTERS = ("otlp", "console")
PROTOCOL = "http/protobuf"  # the one OTLP protocol of the exporter Relay ships
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
Shutdown = Callable[[], None]


def _exporters(environ: Mapping[str, str]) -> list[str]:
    """The exporters named (``OTEL_TRACES_EXPORTER``, a comma list); none: tracing off."""
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not named:
        return ["otlp"] if any(environ.get(name, "").strip() for name in ENDPOINTS) else []
    chosen = [name.strip() for name in named.split(",") if name.strip()]
    if chosen == ["none"]:
        return []
    for name in chosen:
        if name not in EXPORTERS:
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER names {name!r}: Relay exports traces with"
                f" {' or '.join(EXPORTERS)} (or none)"
            )
    return chosen


def tracing_wanted(environ: Mapping[str, str]) -> bool:
    """Whether the ``OTEL_*`` variables turn tracing on (:class:`ConfigError` for one
    Relay cannot honour)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(_exporters(environ))


def _ratio(environ: Mapping[str, str], default: float) -> float:
    raw = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if not raw:
        return default
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG must be a ratio from 0 to 1, not {raw!r}")
    return ratio


def sampler_from(environ: Mapping[str, str]) -> Sampler:
    """The sampler of the standard variables (module doc for the default)."""
    from opentelemetry.sdk.trace import sampling

    name = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not name:
        return sampling.ParentBased(sampling.TraceIdRatioBased(_ratio(environ, DEFAULT_RATIO)))
    if name not in SAMPLERS:
        raise ConfigError(f"OTEL_TRACES_SAMPLER must be one of {', '.join(SAMPLERS)}, not {name!r}")
    fixed: dict[str, Sampler] = {
        "always_on": sampling.ALWAYS_ON,
        "always_off": sampling.ALWAYS_OFF,
        "parentbased_always_on": sampling.ParentBased(sampling.ALWAYS_ON),
        "parentbased_always_off": sampling.ParentBased(sampling.ALWAYS_OFF),
    }
    if name in fixed:
        return fixed[name]
    ratio = sampling.TraceIdRatioBased(_ratio(environ, 1.0))
    return ratio if name == "traceidratio" else sampling.ParentBased(ratio)


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = environ.get(variable, "").strip().lower()
        if protocol and protocol != PROTOCOL:
            raise ConfigError(f"{variable} is {protocol!r}: Relay exports OTLP over {PROTOCOL}")
        if protocol:
            break
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def setup_tracing(service: str, environ: Mapping[str, str]) -> Shutdown | None:
    """Turn tracing on for ``relay-<service>`` when ``environ`` asks for it (module doc);
    return what flushes and stops it at exit, or None (off: nothing imported)."""
    if not tracing_wanted(environ):
        install(None)
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    sampler = sampler_from(environ)
    exporters = [_exporter(name, environ) for name in _exporters(environ)]
    named = environ.get("OTEL_SERVICE_NAME", "").strip()
    resource = Resource.create({} if named else {SERVICE_NAME: f"relay-{service}"})
    if not named and "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        resource = Resource.create()  # the variable's own service.name
    provider = TracerProvider(sampler=sampler, resource=resource, shutdown_on_exit=False)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    install(provider.get_tracer("relay_batches"))

    def shutdown() -> None:
        install(None)
        provider.shutdown()  # exports what is still queued (bounded by the exporter's timeout)

    return shutdown
