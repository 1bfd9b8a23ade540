"""A row's outcome as the bus carries it, from what the router (or a provider batch)
made of the row: storable text, clamped token counts, the cost at the answering
deployment's price. The row-worker and the offloader build outcomes here alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from relay_batches.messages import RowOutcome
from relay_batches.router.aliases import Price
from relay_batches.router.types import RowResult

INT32_MAX = 2**31 - 1


def storable_text(text: str) -> str:
    """``text`` as the ledger can store it: NUL (which Postgres text refuses) becomes U+FFFD."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def _tokens(count: int) -> int:
    return count if 0 <= count <= INT32_MAX else max(0, min(INT32_MAX, count))


def to_outcome(
    batch_id: str,
    index: int,
    result: RowResult,
    latency_ms: int | None = None,
    price: Price | None = None,
    reference: Price | None = None,
) -> RowOutcome:
    """The bus outcome of one row's router result, made storable by the ledger.

    ``latency_ms`` is the row's time in the router; ``price`` the answering deployment's
    (None: unpriced), which makes the answer's ``cost_usd`` (None for an error: no
    deployment answered); ``reference`` its realtime reference price
    (:meth:`~relay_batches.router.aliases.AliasTable.realtime_references`), which makes
    ``all_realtime_usd``, what the same tokens would have cost realtime.
    """
    completion = result.completion
    latency = None if latency_ms is None else min(max(0, latency_ms), INT32_MAX)
    if completion is None:  # no deployment answered: no tokens, no cost
        return RowOutcome(
            batch_id=batch_id,
            row_index=index,
            content=None,
            error=storable_text(result.error or "upstream_error: unknown"),
            attempts=result.attempts,
            dead_letter=result.dead_letter,
            deployment=result.deployment,
            latency_ms=latency,
        )
    prompt_tokens = _tokens(completion.prompt_tokens)
    completion_tokens = _tokens(completion.completion_tokens)
    cached = min(_tokens(completion.cached_tokens), prompt_tokens)
    return RowOutcome(
        batch_id=batch_id,
        row_index=index,
        content=storable_text(completion.content),
        error=None,
        attempts=result.attempts,
        dead_letter=False,
        deployment=result.deployment,
        lane=result.lane,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        tool_calls=_tool_calls_json(completion.tool_calls),
        finish_reason=completion.finish_reason,
        model=completion.model,
        latency_ms=latency,
        cost_usd=(
            None if price is None else price.cost_usd(prompt_tokens, completion_tokens, cached)
        ),
        body=completion.body,
        cached_tokens=cached,
        all_realtime_usd=(
            None
            if reference is None
            else reference.cost_usd(prompt_tokens, completion_tokens, cached)
        ),
    )


def _tool_calls_json(tool_calls: Sequence[Any] | None) -> str | None:
    """The tool calls as the ledger stores them: compact JSON text, None for none."""
    if not tool_calls:
        return None
    return storable_text(orjson.dumps(tool_calls).decode())
