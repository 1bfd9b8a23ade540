"""The OpenAI endpoints besides chat the simulator serves, each answered deterministically:

- ``POST /v1/embeddings``: one vector per input, of ``dimensions`` floats (default 1536,
  text-embedding-3-small's), unit length, derived from a hash of the input so the same
  text always gets the same vector; ``encoding_format`` ``float`` (arrays) or ``base64``
  (little-endian float32 bytes, as OpenAI sends them); usage ``prompt_tokens`` and
  ``total_tokens``.
- ``POST /v1/completions``: a ``text_completion`` whose text is ``"echo: <prompt>"``.
- ``POST /v1/moderations``: one unflagged result per input, every category false.
- ``POST /v1/responses``: a ``response`` with one ``output_text`` message echoing the
  last user text.

Each request is read as a :class:`BodyRequest` (the chat request the fault markers, rate
limits and answer counters read, plus the body), so ``[sim:...]`` markers in an input
work as in chat.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import random
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from relay_batches.services.upstream_sim.config import MODEL_ID
from relay_batches.services.upstream_sim.echo import (
    ChatRequest,
    InvalidRequest,
    content_text,
    estimate_tokens,
    prompt_tokens,
    reply_text,
)
from relay_batches.services.upstream_sim.openai_chat import chat_request_from, completion_payload

DEFAULT_DIMENSIONS = 1536
MAX_DIMENSIONS = 8192
MODERATION_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/instructions",
    "self-harm/intent",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)


@dataclass(frozen=True, slots=True)
class BodyRequest(ChatRequest):
    """A request of an endpoint besides chat: ``texts`` are its inputs, one per item."""

    body: dict[str, Any] = field(default_factory=dict)
    texts: tuple[str, ...] = ()


def _texts(value: Any, name: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value:
        return tuple(
            item
            if isinstance(item, str)
            else content_text(item.get("text") if isinstance(item, dict) else None)
            if not isinstance(item, list)
            else " ".join(str(token) for token in item)
            for item in value
        )
    raise InvalidRequest(f"'{name}' must be a string or a non-empty list")


def _request(data: dict[str, Any], key: str) -> BodyRequest:
    return _read(data, _texts(data.get(key), key))


def _read(data: dict[str, Any], texts: tuple[str, ...]) -> BodyRequest:
    model = data.get("model")
    max_tokens = data.get("max_tokens", data.get("max_output_tokens"))
    return BodyRequest(
        model=model if isinstance(model, str) else MODEL_ID,
        contents=texts,
        last_user=texts[-1],
        max_tokens=max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None,
        body=data,
        texts=texts,
    )


def _response_texts(data: dict[str, Any]) -> tuple[str, ...]:
    given = data.get("input")
    if isinstance(given, str):
        return (given,)
    if not isinstance(given, list) or not given:
        raise InvalidRequest("'input' must be a string or a non-empty list of items")
    texts = []
    for item in given:
        if isinstance(item, dict):
            content = item.get("content")
            if isinstance(content, list):
                content = [{"text": p.get("text")} if isinstance(p, dict) else p for p in content]
            texts.append(content_text(content))
    return tuple(texts) or ("",)


def read_embeddings(data: dict[str, Any]) -> BodyRequest:
    """An embeddings body; ``dimensions`` and ``encoding_format`` checked."""
    request = _request(data, "input")
    dimensions = request.body.get("dimensions", DEFAULT_DIMENSIONS)
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        raise InvalidRequest("'dimensions' must be an integer")
    if not 1 <= dimensions <= MAX_DIMENSIONS:
        raise InvalidRequest(f"'dimensions' must be from 1 to {MAX_DIMENSIONS}")
    if request.body.get("encoding_format", "float") not in ("float", "base64"):
        raise InvalidRequest("'encoding_format' must be float or base64")
    return request


def read_completions(data: dict[str, Any]) -> BodyRequest:
    """A (legacy) completions body."""
    return _request(data, "prompt")


def read_moderations(data: dict[str, Any]) -> BodyRequest:
    """A moderations body."""
    return _request(data, "input")


def read_responses(data: dict[str, Any]) -> BodyRequest:
    """A responses body: ``input`` text or message items."""
    return _read(data, _response_texts(data))


def vector(text: str, dimensions: int) -> list[float]:
    """A deterministic unit vector of ``dimensions`` floats for ``text`` (Mersenne
    Twister seeded by a hash of the text: the same on every run and platform)."""
    seed = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=16).digest()
    draw = random.Random(int.from_bytes(seed, "little")).random
    values = [draw() * 2.0 - 1.0 for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [round(v / norm, 8) for v in values]


def embeddings_payload(request: ChatRequest, _reply_bytes: int | None = None) -> dict[str, Any]:
    """The ``list`` of embeddings answering ``request``."""
    assert isinstance(request, BodyRequest)
    dimensions = request.body.get("dimensions", DEFAULT_DIMENSIONS)
    as_base64 = request.body.get("encoding_format") == "base64"
    data = []
    for index, text in enumerate(request.texts):
        values = vector(text, dimensions)
        embedding: Any = values
        if as_base64:
            embedding = base64.b64encode(struct.pack(f"<{dimensions}f", *values)).decode()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = prompt_tokens(request)
    return {
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def completions_payload(request: ChatRequest, reply_bytes: int | None = None) -> dict[str, Any]:
    """The ``text_completion`` answering ``request``: the echo of its prompt."""
    text = reply_text(request, reply_bytes)
    prompt, written = prompt_tokens(request), estimate_tokens(text)
    return {
        "id": "cmpl-" + os.urandom(12).hex(),
        "object": "text_completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": written,
            "total_tokens": prompt + written,
        },
    }


def moderations_payload(request: ChatRequest, _reply_bytes: int | None = None) -> dict[str, Any]:
    """One unflagged result per input."""
    assert isinstance(request, BodyRequest)
    result = {
        "flagged": False,
        "categories": dict.fromkeys(MODERATION_CATEGORIES, False),
        "category_scores": dict.fromkeys(MODERATION_CATEGORIES, 0.0),
        "category_applied_input_types": {name: ["text"] for name in MODERATION_CATEGORIES},
    }
    return {
        "id": "modr-" + os.urandom(12).hex(),
        "model": request.model,
        "results": [result for _ in request.texts],
    }


def responses_payload(request: ChatRequest, reply_bytes: int | None = None) -> dict[str, Any]:
    """The ``response`` answering ``request``: one message echoing its last text."""
    assert isinstance(request, BodyRequest)
    text = reply_text(request, reply_bytes)
    prompt, written = prompt_tokens(request), estimate_tokens(text)
    body = request.body
    return {
        "id": "resp_" + os.urandom(12).hex(),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "model": request.model,
        "output": [
            {
                "type": "message",
                "id": "msg_" + os.urandom(12).hex(),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature", 1.0),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": written,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + written,
        },
    }


Read = Callable[[dict[str, Any]], ChatRequest]
Answer = Callable[[ChatRequest, int | None], dict[str, Any]]
# Every OpenAI endpoint the simulator serves: how a decoded body is read, and answered.
ENDPOINTS: Mapping[str, tuple[Read, Answer]] = {
    "/v1/chat/completions": (chat_request_from, completion_payload),
    "/v1/embeddings": (read_embeddings, embeddings_payload),
    "/v1/completions": (read_completions, completions_payload),
    "/v1/moderations": (read_moderations, moderations_payload),
    "/v1/responses": (read_responses, responses_payload),
}


def usage_tokens(body: Mapping[str, Any]) -> tuple[int, int]:
    """An answer's input and output tokens, whichever endpoint's usage it carries."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return 0, 0
    given = usage.get("prompt_tokens", usage.get("input_tokens"))
    written = usage.get("completion_tokens", usage.get("output_tokens"))
    return (given if isinstance(given, int) else 0), (written if isinstance(written, int) else 0)
