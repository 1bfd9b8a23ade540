"""What a call counts against a tokens-per-minute limit, before and after the call.

Before: :func:`estimate_tokens`, the prompt (one token per four characters of each
message's text, rounded up) plus the row's completion cap (``max_completion_tokens`` or
``max_tokens``; without one, 0). After: :func:`counted_tokens`, what the provider counts
by the reply's usage: its prompt tokens plus the cap when one was given (providers count
the cap, not what was written), else the completion tokens written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CHARS_PER_TOKEN = 4
CAP_KEYS = ("max_completion_tokens", "max_tokens")


def _text(content: Any) -> str:
    """A message content's text: a string, or the text parts of a parts list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def completion_cap(params: Mapping[str, Any]) -> int:
    """The row's completion-token cap (``max_completion_tokens``, else ``max_tokens``),
    0 when it gives no positive integer one."""
    for key in CAP_KEYS:
        value = params.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """The prompt's estimated tokens: ceil(characters / 4) of each message's text."""
    total = 0
    for message in messages:
        text = _text(message.get("content")) if isinstance(message, Mapping) else ""
        total += -(-len(text) // CHARS_PER_TOKEN)
    return total


def estimate_tokens(messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]) -> int:
    """The tokens a call is expected to count: prompt estimate plus completion cap."""
    return prompt_tokens(messages) + completion_cap(params)


def counted_tokens(params: Mapping[str, Any], prompt: int, completion: int) -> int:
    """The tokens a finished call counted by its reply's usage: ``prompt`` plus the cap
    when the row gave one (what providers count), else ``completion``."""
    cap = completion_cap(params)
    return prompt + (cap if cap else completion)
