"""A ``/v1/responses`` row on an Anthropic deployment: translated to a Messages call
where the request fits, and the Messages reply given back as an OpenAI ``response``.

What fits: ``input`` as a string (one user message) or a list of messages (``role``
user, assistant, system or developer; ``content`` a string or ``input_text`` /
``output_text`` parts), ``instructions`` (a leading system message),
``max_output_tokens`` (``max_tokens``), ``temperature``, ``top_p``, ``metadata``
(echoed in the answer, never sent) and ``store`` (nothing is stored either way). Anything
else (tools, ``text`` formats, ``reasoning``, ``previous_response_id``, an image or file
item, …) raises :class:`~relay_batches.router.types.UnsupportedRequest` naming it, so the
row falls through to the alias's next deployment or fails with that reason.

The answer is a ``response`` object: one ``message`` output item holding the reply's
text as ``output_text``, ``status`` ``incomplete`` (``max_output_tokens``) when the
reply was cut by its token cap, usage as ``input_tokens``/``output_tokens``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from relay_batches.dialects.anthropic import upstream
from relay_batches.dialects.endpoints import RESPONSES, input_estimate
from relay_batches.router.aliases import Deployment
from relay_batches.router.types import Completion, ProviderReply, UnsupportedRequest

ROLES = frozenset({"user", "assistant", "system", "developer"})
TEXT_PARTS = frozenset({"input_text", "output_text"})
KEPT = frozenset({"input", "instructions", "model", "metadata", "store"})
SAMPLING = {"max_output_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p"}


def _refuse(what: str) -> UnsupportedRequest:
    return UnsupportedRequest(
        f"an anthropic deployment cannot translate {what} of a /v1/responses request"
    )


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _refuse(f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") not in TEXT_PARTS:
            raise _refuse(f"{where}.content[{j}] (only text parts translate)")
        if not isinstance(part.get("text"), str):
            raise _refuse(f"{where}.content[{j}].text")
        texts.append(part["text"])
    return "".join(texts)


def chat_of(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The chat messages and parameters of a Responses body; UnsupportedRequest naming
    the first field that does not translate."""
    params: dict[str, Any] = {}
    for key, value in body.items():
        if value is None or key in KEPT:
            continue
        if key not in SAMPLING:
            raise _refuse(key)
        params[SAMPLING[key]] = value
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    else:
        for i, item in enumerate(given if isinstance(given, list) else ()):
            where = f"input[{i}]"
            if not isinstance(item, Mapping) or item.get("type", "message") != "message":
                raise _refuse(f"{where} (only messages translate)")
            role = item.get("role")
            if role not in ROLES:
                raise _refuse(f"{where}.role")
            messages.append({"role": role, "content": _content(item.get("content"), where)})
    return messages, params


def response_object(completion: Completion) -> dict[str, Any]:
    """The ``response`` object of a translated call's answer."""
    cut = completion.finish_reason == "length"
    prompt, written = completion.prompt_tokens, completion.completion_tokens
    text = {"type": "output_text", "text": completion.content, "annotations": []}
    message = {
        "type": "message",
        "id": "msg_" + os.urandom(12).hex(),
        "status": "incomplete" if cut else "completed",
        "role": "assistant",
        "content": [text],
    }
    return {
        "id": "resp_" + os.urandom(12).hex(),
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": None,
        "metadata": {},
        "model": completion.model or "",
        "output": [message],
        "parallel_tool_calls": False,
        "temperature": None,
        "tool_choice": "none",
        "tools": [],
        "top_p": None,
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": written,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + written,
        },
    }


class ResponsesWire:
    """The router's provider interface for Responses rows on an Anthropic deployment."""

    endpoint = RESPONSES

    def build_request(
        self,
        deployment: Deployment,
        _messages: Sequence[Mapping[str, Any]],
        body: Mapping[str, Any],
    ) -> tuple[str, dict[str, str], bytes]:
        """The Messages call of a Responses body (UnsupportedRequest if it does not fit)."""
        messages, params = chat_of(body)
        return upstream.build_request(deployment, messages, params)

    def token_cap(self, deployment: Deployment, body: Mapping[str, Any]) -> int:
        """The ``max_tokens`` the Messages call sends."""
        cap = body.get("max_output_tokens")
        return upstream.token_cap(deployment, {"max_tokens": cap})

    def estimate(self, body: Mapping[str, Any], cap: int) -> int:
        """The tokens the call is expected to count: its input text plus the cap."""
        return input_estimate(RESPONSES, body, cap)

    def parse_reply(self, raw: bytes) -> ProviderReply:
        """The Messages reply as a ``response`` object (text only: a tool call is not
        an answer a translated request can have)."""
        reply = upstream.parse_reply(raw)
        completion = reply.completion
        if completion is None:
            return reply
        answer = orjson.dumps(response_object(completion)).decode()
        return ProviderReply(
            Completion(
                answer,
                completion.prompt_tokens,
                completion.completion_tokens,
                model=completion.model,
            )
        )
