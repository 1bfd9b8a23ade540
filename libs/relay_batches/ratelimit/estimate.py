"""What a call counts against a tokens-per-minute limit, before and after the call.

Before: :func:`estimate_tokens`, the prompt (one token per four characters of each
message's text, rounded up; :data:`IMAGE_TOKENS` per image part; the JSON of ``tools``
and of assistant ``tool_calls`` at four characters a token) plus the completion cap the
call will send (the provider module's ``token_cap``: the row's, else the deployment's,
else, for Anthropic, its default; 0 without one). After: :func:`counted_tokens`, what the
provider counts by the reply's usage: its prompt tokens plus the cap when one was sent
(providers count the cap, not what was written), else the completion tokens written;
a reply without usage keeps the estimate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

CHARS_PER_TOKEN = 4
CAP_KEYS = ("max_completion_tokens", "max_tokens")
IMAGE_TOKENS = 765  # a 1024 x 1024 image at high detail (OpenAI's tile arithmetic)
IMAGE_PARTS = frozenset({"image_url", "image", "input_image"})


def _tokens_of(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)


def _content_tokens(content: Any) -> int:
    """A message content's tokens: its text, and a flat count per image part."""
    if isinstance(content, str):
        return _tokens_of(len(content))
    if not isinstance(content, list):
        return 0
    chars = images = 0
    for part in content:
        if not isinstance(part, Mapping):
            continue
        if isinstance(part.get("text"), str):
            chars += len(part["text"])
        elif part.get("type") in IMAGE_PARTS:
            images += 1
    return _tokens_of(chars) + images * IMAGE_TOKENS


def completion_cap(params: Mapping[str, Any]) -> int:
    """The completion-token cap in ``params`` (``max_completion_tokens``, else
    ``max_tokens``), 0 when they give no positive integer one."""
    for key in CAP_KEYS:
        value = params.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def prompt_tokens(
    messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any] | None = None
) -> int:
    """The prompt's estimated tokens: each message's content, its tool calls, and the
    request's ``tools``."""
    total = 0
    for message in messages:
        total += _content_tokens(message.get("content"))
        if message.get("tool_calls"):
            total += _tokens_of(len(orjson.dumps(message["tool_calls"])))
    tools = None if params is None else params.get("tools")
    if tools:
        total += _tokens_of(len(orjson.dumps(tools)))
    return total


def estimate_tokens(
    messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any], cap: int
) -> int:
    """The tokens a call is expected to count: prompt estimate plus the cap it sends."""
    return prompt_tokens(messages, params) + cap


def counted_tokens(cap: int, prompt: int, completion: int, estimate: int) -> int:
    """The tokens a finished call counted by its reply's usage: ``prompt`` plus the cap
    sent (what providers count), else ``completion``; ``estimate`` when the reply gave no
    usage at all (both 0)."""
    if prompt == 0 and completion == 0:
        return estimate
    return prompt + (cap if cap else completion)
