"""Counting a job's rows and tokens before it runs, a page of stored requests at a time.

Prompt tokens: :func:`relay_batches.ratelimit.estimate.prompt_tokens`, the tokenizer
approximation the rate limiter uses (a token per four characters of each message's text,
rounded up; a flat count per image; the JSON of tools and tool calls at four characters
a token). Completion tokens per row: the alias's observed mean completion tokens per
answered row when the workspace has answered rows of it, else as many as the row's
prompt (the budget's estimate before a job has costs), in both cases at most the row's
completion cap (``max_completion_tokens`` or ``max_tokens``, the row's over the job's
``params``). A body of another endpoint (embeddings, …) counts its ``input`` or
``prompt`` text and no completion. CPU-bound: callers run :meth:`Tally.add_page` in a
worker thread, one bounded page at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from relay_batches.messages import row_request
from relay_batches.ratelimit.estimate import CHARS_PER_TOKEN, completion_cap, prompt_tokens


def _text_tokens(value: Any) -> int:
    """Tokens of a body's ``input``/``prompt``: its text at four characters a token."""
    if isinstance(value, str):
        return -(-len(value) // CHARS_PER_TOKEN)
    if isinstance(value, list):
        return sum(_text_tokens(v) for v in value)
    return 0


@dataclass(slots=True)
class Tally:
    """Rows and estimated tokens so far; ``mean_completion`` is the alias's observed mean
    completion tokens per answered row (None: none observed, a row's prompt stands in)."""

    job_params: Mapping[str, Any]
    mean_completion: float | None = None
    rows: int = 0
    prompt_tokens: int = 0
    completion_tokens: float = 0.0

    def add_page(self, requests: Iterable[str]) -> None:
        """Count a page of stored row requests (``batch_rows.request`` JSON text)."""
        for text in requests:
            self.add(text)

    def add(self, text: str) -> None:
        """Count one stored row request; one that does not decode counts as a row of no
        tokens (the create refuses such rows before they are stored)."""
        self.rows += 1
        try:
            request = row_request(orjson.loads(text))
        except (orjson.JSONDecodeError, TypeError, ValueError):
            return
        params = {**self.job_params, **(request.params or {})}
        if request.endpoint is not None:
            body = request.params or {}
            self.prompt_tokens += _text_tokens(body.get("input", body.get("prompt")))
            return
        prompt = prompt_tokens(request.messages, params)
        self.prompt_tokens += prompt
        completion = self.mean_completion if self.mean_completion is not None else prompt
        cap = completion_cap(params)
        self.completion_tokens += min(completion, cap) if cap else completion

    @property
    def completion_basis(self) -> str:
        """Where the completion estimate comes from: ``observed`` or ``prompt``."""
        return "prompt" if self.mean_completion is None else "observed"
