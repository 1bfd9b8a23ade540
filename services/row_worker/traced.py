"""Each row's span, in its job's trace: the upstream call as the OpenTelemetry GenAI
semantic conventions name it (``chat <model>``, a CLIENT span with
``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.usage.input_tokens`` and
``output_tokens``) and Relay's own ``relay.deployment`` and ``relay.attempts``.

A row gets a span only when its slice's delivery carried a sampled trace context (the
kit makes it current: :func:`relay_batches.tracing.attach_delivered`), so the row hangs
under the release of its slice. Tracing off, the runner has no :class:`RowSpans` at all;
on, a row of an untraced job costs one context check.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping

from opentelemetry.trace import StatusCode

from relay_batches.dialects.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES
from relay_batches.router.aliases import AliasTable
from relay_batches.router.types import RowResult
from relay_batches.tracing import SpanKind, child_span, enabled, in_traced_job

# gen_ai.operation.name of each endpoint (the conventions' well-known values).
OPERATIONS: Mapping[str, str] = {
    CHAT: "chat",
    RESPONSES: "chat",
    COMPLETIONS: "text_completion",
    EMBEDDINGS: "embeddings",
}


class RowSpans:
    """Spans of the rows of traced jobs; ``deployments``: each deployment's provider kind
    and upstream model, by name (what the answering deployment of a row is looked up in)."""

    def __init__(self, deployments: Mapping[str, tuple[str, str]]) -> None:
        self._deployments = deployments

    async def traced(
        self, call: Awaitable[RowResult], batch_id: str, index: int, alias: str, endpoint: str
    ) -> RowResult:
        """Await one row's ``call``, in a span when its job is traced."""
        if not in_traced_job():
            return await call
        operation = OPERATIONS.get(endpoint, endpoint.rsplit("/", 1)[-1])
        with child_span(
            f"{operation} {alias}",
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": operation,
                "relay.batch_id": batch_id,
                "relay.row": index,
                "relay.alias": alias,
            },
        ) as span:
            result = await call
            if span is None:
                return result
            provider, model = self._deployments.get(result.deployment or "", ("", alias))
            span.update_name(f"{operation} {model}")
            span.set_attributes(
                {
                    "gen_ai.provider.name": provider,
                    "gen_ai.request.model": model,
                    "relay.deployment": result.deployment or "",
                    "relay.attempts": result.attempts,
                    "relay.dead_letter": result.dead_letter,
                }
            )
            if (completion := result.completion) is not None:
                span.set_attributes(
                    {
                        "gen_ai.usage.input_tokens": completion.prompt_tokens,
                        "gen_ai.usage.output_tokens": completion.completion_tokens,
                        "gen_ai.response.model": completion.model or model,
                        "gen_ai.response.finish_reasons": [completion.finish_reason or ""],
                    }
                )
            if result.error is not None:
                span.set_attribute("error.type", result.error.split(":", 1)[0])
                span.set_status(StatusCode.ERROR, result.error[:200])
            return result


def row_spans(aliases: AliasTable) -> RowSpans | None:
    """The row spans of a worker routing by ``aliases``; None while tracing is off."""
    if not enabled():
        return None
    return RowSpans({d.name: (d.provider, d.model) for ds in aliases.aliases.values() for d in ds})
