"""The upstream simulator: OpenAI-compatible chat completions and Anthropic-shaped
Messages endpoints that echo.

``POST /v1/chat/completions`` replies with deterministic ``"echo: <last user message>"``
completions; ``POST /v1/messages`` does the same in the Anthropic Messages shape (content
blocks, ``stop_reason``, ``usage`` in input/output tokens) after validating the request as
the Messages API does: ``x-api-key`` (any value, else 401) and ``anthropic-version``
headers, ``model``, ``max_tokens``, user/assistant turns of text, image, ``tool_use`` and
``tool_result`` blocks (each tool result answering a ``tool_use`` of the assistant turn
right before it, each tool use answered in the next turn), ``tools``, ``tool_choice`` and
no unknown top-level field; errors there have Anthropic's ``{type: "error", error}`` shape.

The echoed text is the text of the last user message (content parts: their text parts
joined); a ``tool`` message (chat) or a user turn of tool results (Messages) counts as a
user message, its result text echoed, so a conversation answering a tool call gets text.

``[sim:tool-call]`` in that last user text, on a request with ``tools``, answers with a
call of the first tool instead (or of the tool ``tool_choice`` names; none when
``tool_choice`` is ``none``): arguments ``{"text": <the last user text>}``, id
``call_<24 hex>`` (Messages: ``toolu_<24 hex>``) derived from that text and the tool's
name, no content, ``finish_reason: "tool_calls"`` (Messages: a ``tool_use`` block,
``stop_reason: "tool_use"``).

Markers in the message contents make a call misbehave on purpose, so tests and benchmarks
can exercise retries, rate limits and timeouts without a real model (on both endpoints):

``[sim:status=NNN]``     always answer HTTP NNN (400..599; other values are ignored)
``[sim:fail-first=N]``   answer 503 to the first N calls with the same last user message
``[sim:retry-after=S]``  failing calls answer 429 with ``Retry-After: S`` instead of 503;
                         alone it means ``fail-first=1``
``[sim:delay-ms=N]``     add N ms to this call, on top of the global latency
``[sim:hang]``           sleep an hour before answering (the client's timeout cuts it)
``[sim:reply-bytes=N]``  pad a successful reply's content to N bytes (at most 16 MiB), so
                         tests and benchmarks get big outputs from small requests

On top of that every call waits ``SimConfig.latency_ms`` and a ``SimConfig.error_rate``
fraction of the untriggered calls answers 503.

Rate limits, as providers enforce them (:class:`RateWindows`), for each requested model
on its own: with ``SimConfig.rpm`` a calendar second admits at most ``rpm / 60`` calls
(the remainder spread over the minute, :func:`per_second`), and with ``SimConfig.tpm`` at
most ``tpm / 60`` tokens, a call counting its prompt tokens plus its
``max_tokens`` (``max_completion_tokens``; without either, its reply's tokens); a call over
either answers 429 at once with ``Retry-After: 1`` and the provider's error shape, and is
not counted in the window. ``GET /stats`` counts those answers as ``throttled``.

Provider batch APIs (:mod:`.openai_batches`, :mod:`.anthropic_batches`): OpenAI's
``/v1/files`` and ``/v1/batches`` and Anthropic's ``/v1/messages/batches`` (the headers
of ``/v1/messages``, or ``Authorization: Bearer`` as the official SDK sends), each batched
request answered exactly as its realtime call would be (the markers above included; no
latency, rate limit or hang, and not counted as ``calls``). A batch is done at the first
poll at least ``SimConfig.batch_delay_s`` after its creation; ``batch_input_delay_s``
holds the answer to an input (upload or create) and ``batch_results_pause_s`` stops a
results download halfway, so a test can meet a client mid-transfer. Markers in a batched
request's last user text (the realtime endpoints ignore them):

``[sim:batch-error]``    that request fails inside the batch (OpenAI: error file, status
                         500; Anthropic: ``errored`` with an ``api_error``)
``[sim:batch-expire]``   that request is left expired (OpenAI: error file with
                         ``batch_expired``, the batch ends ``expired``; Anthropic:
                         ``expired``)
``[sim:batch-fail]``     (OpenAI) the whole batch ends ``failed``, naming that line

``GET /stats`` adds ``batches_created``, ``batch_rows`` (requests submitted in batches)
and ``batch_rows_repeated`` (of those, custom_ids an earlier batch already submitted);
``POST /reset`` also forgets every file and batch.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

Sleep = Callable[[float], Awaitable[None]]

HANG_SECONDS = 3600.0
MODEL_ID = "sim-echo"
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_REPLY_BYTES = 16 * 1024 * 1024

_MARKER = "[sim:"
TOOL_CALL_MARKER = "[sim:tool-call]"
ANTHROPIC_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
MESSAGES_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "stream",
    }
)
_TRIGGER_RE = re.compile(
    r"\[sim:(?:(status|fail-first|delay-ms|retry-after|reply-bytes)=(\d{1,9})|(hang))\]"
)


@dataclass(frozen=True)
class SimConfig:
    """How the simulator behaves on every call."""

    latency_ms: float = 0
    error_rate: float = 0.0
    seed: int | None = None
    rpm: int = 0  # requests per minute, enforced per second (0: unlimited)
    tpm: int = 0  # tokens per minute, enforced per second (0: unlimited)
    batch_delay_s: float = 0  # a provider batch ends at the first poll this long after creation
    # A provider batch's input (OpenAI's file upload, Anthropic's create) is answered this
    # long after it is read, before the file or batch is made.
    batch_input_delay_s: float = 0
    # A provider batch's results download stops this long halfway through its lines.
    batch_results_pause_s: float = 0

    def __post_init__(self) -> None:
        if not self.latency_ms >= 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms!r}")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate must be within 0..1, got {self.error_rate!r}")
        if self.rpm < 0 or self.tpm < 0:
            raise ValueError(f"rpm and tpm must be >= 0, got {self.rpm!r} and {self.tpm!r}")
        for name in ("batch_delay_s", "batch_input_delay_s", "batch_results_pause_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")


# --- pure parsing ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Triggers:
    """The ``[sim:...]`` markers found in a request; ``None`` means absent."""

    status: int | None = None
    fail_first: int | None = None
    delay_ms: int | None = None
    retry_after: int | None = None
    hang: bool = False
    reply_bytes: int | None = None

    @property
    def present(self) -> bool:
        """True when the request carries at least one trigger of how the call behaves
        (``reply-bytes`` only shapes a success and does not count)."""
        return self.hang or any(
            value is not None
            for value in (self.status, self.fail_first, self.delay_ms, self.retry_after)
        )

    @property
    def failure_limit(self) -> int | None:
        """How many first calls fail (fail-first / retry-after); ``None`` if not counted."""
        if self.status is not None:
            return None
        if self.fail_first is not None:
            return self.fail_first
        return 1 if self.retry_after is not None else None


NO_TRIGGERS = Triggers()


def parse_triggers(text: str) -> Triggers:
    """Find the ``[sim:...]`` markers in ``text``; the first valid one of each kind wins."""
    if _MARKER not in text:
        return NO_TRIGGERS
    values: dict[str, int] = {}
    hang = False
    for name, number, hang_word in _TRIGGER_RE.findall(text):
        if hang_word:
            hang = True
        elif name != "status" or 400 <= int(number) <= 599:
            values.setdefault(name, int(number))
    if not values and not hang:
        return NO_TRIGGERS
    return Triggers(
        status=values.get("status"),
        fail_first=values.get("fail-first"),
        delay_ms=values.get("delay-ms"),
        retry_after=values.get("retry-after"),
        hang=hang,
        reply_bytes=_capped(values.get("reply-bytes"), MAX_REPLY_BYTES),
    )


def _capped(value: int | None, cap: int) -> int | None:
    return None if value is None else min(value, cap)


def estimate_tokens(text: str) -> int:
    """A rough token count: one per four characters, at least one."""
    return max(1, (len(text) + 3) // 4)


class InvalidRequest(ValueError):
    """The request is not one the endpoint takes; ``status`` is the HTTP answer (400,
    or 401 for a Messages call without ``x-api-key``)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What the simulator needs from a chat completions or Messages request; ``tool`` is
    the name of the tool a ``[sim:tool-call]`` calls (None: no tool may be called)."""

    model: str
    contents: tuple[str, ...]
    last_user: str
    tool: str | None = None
    max_tokens: int | None = None

    @property
    def calls_tool(self) -> bool:
        """True when the reply is a tool call rather than the echo."""
        return self.tool is not None and TOOL_CALL_MARKER in self.last_user

    def triggers(self) -> Triggers:
        """The triggers found anywhere in the message contents."""
        if not any(_MARKER in content for content in self.contents):
            return NO_TRIGGERS
        return parse_triggers("\n".join(self.contents))


def _content_text(content: Any) -> str:
    """The text of a message content: a string, or the text parts of a parts list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidRequest("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    return data


def parse_chat_request(body: bytes) -> ChatRequest:
    """Decode a chat completions body; raise :class:`InvalidRequest` when it is not one
    (besides the shape of ``messages``: ``tools`` that are not function tools, or a
    ``tool`` message answering no earlier assistant tool call)."""
    return chat_request_from(_json_object(body))


def chat_request_from(data: Mapping[str, Any]) -> ChatRequest:
    """Read a decoded chat completions body (a batch line's ``body``) as
    :func:`parse_chat_request` does."""
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list")
    if not all(isinstance(message, dict) for message in messages):
        raise InvalidRequest("every message must be an object")
    contents = tuple(_content_text(message.get("content")) for message in messages)
    last_user = ""
    call_ids: set[Any] = set()
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            call_ids.update(_chat_call_ids(message["tool_calls"], index))
        elif role == "tool" and message.get("tool_call_id") not in call_ids:
            raise InvalidRequest(f"messages[{index}] answers no earlier assistant tool call")
        if role in ("user", "tool"):
            last_user = contents[index]
    model = data.get("model")
    return ChatRequest(
        model=model if isinstance(model, str) else MODEL_ID,
        contents=contents,
        last_user=last_user,
        tool=_chat_tool(data.get("tools"), data.get("tool_choice")),
        max_tokens=_max_tokens(data.get("max_completion_tokens", data.get("max_tokens"))),
    )


def _max_tokens(value: Any) -> int | None:
    """A request's completion-token cap, when it gives a positive integer one."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def _chat_call_ids(calls: Any, index: int) -> list[Any]:
    if not isinstance(calls, list) or not all(
        isinstance(call, dict) and isinstance(call.get("id"), str) for call in calls
    ):
        raise InvalidRequest(f"messages[{index}].tool_calls must be a list of calls with ids")
    return [call["id"] for call in calls]


def _chat_tool(tools: Any, choice: Any) -> str | None:
    """The tool a chat request's ``[sim:tool-call]`` calls."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(tool, dict)
        and tool.get("type") == "function"
        and isinstance(tool.get("function"), dict)
        and isinstance(tool["function"].get("name"), str)
        for tool in tools
    ):
        raise InvalidRequest("'tools' must be a list of function tools with names")
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if isinstance(name, str):
            return name
    name = tools[0]["function"]["name"]
    return name if isinstance(name, str) else None


# --- the Messages (Anthropic) request ---------------------------------------------------


def parse_messages_request(body: bytes, headers: Mapping[str, str]) -> ChatRequest:
    """Decode and validate a Messages body and its headers; raise :class:`InvalidRequest`
    as the Messages API would refuse it."""
    check_messages_headers(headers)
    return messages_request_from(_json_object(body))


def check_messages_headers(headers: Mapping[str, str], *, bearer: bool = False) -> None:
    """Raise :class:`InvalidRequest` when the Messages API's headers are missing; with
    ``bearer`` an ``Authorization: Bearer`` key (what the current official SDK sends)
    stands for ``x-api-key``."""
    keyed = bool(headers.get("x-api-key"))
    if bearer and headers.get("Authorization", "").startswith("Bearer "):
        keyed = True
    if not keyed:
        raise InvalidRequest("x-api-key header is required", status=401)
    if not headers.get("anthropic-version"):
        raise InvalidRequest("anthropic-version: header is required")


def messages_request_from(data: Mapping[str, Any]) -> ChatRequest:
    """Validate a decoded Messages body (a batch request's ``params``) as
    :func:`parse_messages_request` does, headers aside."""
    for key in data:
        if key not in MESSAGES_FIELDS:
            raise InvalidRequest(f"{key}: Extra inputs are not permitted")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: Field required")
    max_tokens = data.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidRequest("max_tokens: Field required (an integer of at least 1)")
    if data.get("stream"):
        raise InvalidRequest("stream: the simulator does not stream")
    _check_sampling(data)
    system = _system_text(data.get("system"))
    contents, last_user = _check_turns(data.get("messages"))
    return ChatRequest(
        model=model,
        contents=(system, *contents) if system else contents,
        last_user=last_user,
        tool=_messages_tool(data.get("tools"), data.get("tool_choice")),
        max_tokens=max_tokens,
    )


def _check_sampling(data: Mapping[str, Any]) -> None:
    for key in ("temperature", "top_p"):
        value = data.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1
        ):
            raise InvalidRequest(f"{key}: Input should be a number from 0 to 1")
    stops = data.get("stop_sequences")
    if stops is not None and (
        not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)
    ):
        raise InvalidRequest("stop_sequences: Input should be a list of strings")


def _system_text(system: Any) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    if isinstance(system, list) and all(_is_text_block(b) for b in system):
        return "".join(block["text"] for block in system)
    raise InvalidRequest("system: Input should be a string or a list of text blocks")


def _is_text_block(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )


def _check_turns(messages: Any) -> tuple[tuple[str, ...], str]:
    """The text of every turn and of the last user turn, once the turns are checked."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: Input should be a non-empty list")
    texts: list[str] = []
    last_user = ""
    pending: set[str] = set()  # tool_use ids of the turn before, to be answered now
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise InvalidRequest(f"{where}.role: Input should be 'user' or 'assistant'")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            raise InvalidRequest(f"{where}.content: Input should be a string or a list of blocks")
        answered = {
            block.get("tool_use_id")
            for block in blocks
            if isinstance(block, dict) and block.get("type") == "tool_result"
        }
        if pending - answered:
            raise InvalidRequest(
                f"{where}: tool_use ids were found without tool_result blocks immediately"
                f" after: {', '.join(sorted(pending - answered))}"
            )
        if answered - pending:
            raise InvalidRequest(
                f"{where}: unexpected tool_use_id found in tool_result blocks:"
                f" {', '.join(sorted(str(i) for i in answered - pending))}"
            )
        pending = set()
        parts = []
        for j, block in enumerate(blocks):
            text, tool_use = _check_block(block, role, f"{where}.content.{j}")
            parts.append(text)
            if tool_use is not None:
                pending.add(tool_use)
        texts.append("".join(parts))
        if role == "user":
            last_user = texts[-1]
    return tuple(texts), last_user


def _check_block(block: Any, role: str, where: str) -> tuple[str, str | None]:
    """The text a content block carries and, for a ``tool_use``, its id."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        return block["text"], None
    if kind == "image" and _is_image_source(block.get("source")):
        return "", None
    if kind == "tool_use" and role == "assistant":
        if not (
            isinstance(block.get("id"), str)
            and isinstance(block.get("name"), str)
            and isinstance(block.get("input"), dict)
        ):
            raise InvalidRequest(f"{where}: a tool_use block needs id, name and an input object")
        return "", block["id"]
    if kind == "tool_result" and role == "user":
        content = block.get("content", "")
        if isinstance(content, str):
            return content, None
        if isinstance(content, list) and all(_is_text_block(b) for b in content):
            return "".join(b["text"] for b in content), None
        raise InvalidRequest(f"{where}.content: a tool result holds a string or text blocks")
    raise InvalidRequest(f"{where}: not a valid {role} content block")


def _is_image_source(source: Any) -> bool:
    if not isinstance(source, dict):
        return False
    if source.get("type") == "base64":
        return source.get("media_type") in ANTHROPIC_IMAGE_TYPES and isinstance(
            source.get("data"), str
        )
    return source.get("type") == "url" and isinstance(source.get("url"), str)


def _messages_tool(tools: Any, choice: Any) -> str | None:
    """The tool a Messages request's ``[sim:tool-call]`` calls."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(tool, dict)
        and isinstance(tool.get("name"), str)
        and isinstance(tool.get("input_schema"), dict)
        and tool["input_schema"].get("type") == "object"
        for tool in tools
    ):
        raise InvalidRequest("tools: each tool needs a name and an object input_schema")
    if choice is not None and not (
        isinstance(choice, dict)
        and choice.get("type") in ("auto", "any", "tool", "none")
        and (choice.get("type") != "tool" or isinstance(choice.get("name"), str))
    ):
        raise InvalidRequest("tool_choice: Input should be auto, any, tool (with a name) or none")
    if not tools or (choice or {}).get("type") == "none":
        return None
    if choice is not None and choice.get("type") == "tool":
        name: str = choice["name"]
        return name
    first: str = tools[0]["name"]
    return first


# --- state and decisions ---------------------------------------------------------------


THROTTLE_RETRY_AFTER_S = 1  # a throttled call may come back with the next second


MAX_RATE_MODELS = 1024  # models with a window of their own; beyond, the oldest is forgotten


def per_second(per_minute: int, second: int) -> int:
    """What calendar second ``second`` admits of a per-minute limit: ``per_minute / 60``
    with the remainder spread evenly (90 rpm: 1, 2, 1, 2, …; 30 rpm: one call every
    other second), so any 60 consecutive seconds admit exactly ``per_minute``."""
    return (second + 1) * per_minute // 60 - second * per_minute // 60


class RateWindows:
    """Per-model, per-calendar-second windows of calls and tokens, as a provider
    quantizes its per-minute limits (each model has its own, as providers limit each
    model): a second admits :func:`per_second` of ``rpm`` calls and of ``tpm`` tokens;
    0 means that limit is off."""

    def __init__(self, rpm: int, tpm: int, clock: Callable[[], float] = time.time) -> None:
        self._rpm = rpm
        self._tpm = tpm
        self._clock = clock
        self._windows: dict[str, list[int]] = {}  # model -> [second, calls, tokens]

    @property
    def active(self) -> bool:
        """Whether any limit is on."""
        return bool(self._rpm or self._tpm)

    def admit(self, tokens: int, model: str = "") -> bool:
        """Count a call of ``tokens`` to ``model`` in this second's window if it fits;
        False if over."""
        second = int(self._clock())
        window = self._windows.get(model)
        if window is None:
            if len(self._windows) >= MAX_RATE_MODELS:
                del self._windows[next(iter(self._windows))]
            window = self._windows[model] = [second, 0, 0]
        if window[0] != second:
            window[:] = [second, 0, 0]
        if self._rpm and window[1] + 1 > per_second(self._rpm, second):
            return False
        if self._tpm and window[2] + tokens > per_second(self._tpm, second):
            return False
        window[1] += 1
        window[2] += tokens
        return True


class SimState:
    """Call counters, fail-first counters and the error-rate dice of one simulator."""

    def __init__(self, seed: int | None = None) -> None:
        self._seed = seed
        self._rng = random.Random(seed)
        self._failures: dict[str, int] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self.calls = 0
        self.ok = 0
        self.errors = 0
        self.throttled = 0  # of errors: 429s of the rate limits (RateWindows)
        self.in_flight = 0
        self.batches_created = 0  # provider batches, both APIs
        self.batch_rows = 0  # lines / requests submitted in them
        self.batch_rows_repeated = 0  # of those: custom_ids submitted in an earlier batch
        self._batch_ids: set[str] = set()

    def stats(self) -> dict[str, int]:
        """The counters served by ``GET /stats``."""
        return {
            "calls": self.calls,
            "ok": self.ok,
            "errors": self.errors,
            "throttled": self.throttled,
            "batches_created": self.batches_created,
            "batch_rows": self.batch_rows,
            "batch_rows_repeated": self.batch_rows_repeated,
        }

    def count_batch(self, rows: int, custom_ids: set[str]) -> None:
        """Count a provider batch of ``rows`` lines and the ``custom_ids`` it submits
        that an earlier batch already submitted."""
        self.batches_created += 1
        self.batch_rows += rows
        self.batch_rows_repeated += len(custom_ids & self._batch_ids)
        self._batch_ids |= custom_ids

    def reset(self) -> None:
        """Zero every counter, forget fail-first contents and re-seed the dice."""
        self.calls = self.ok = self.errors = self.throttled = 0
        self.batches_created = self.batch_rows = self.batch_rows_repeated = 0
        self._batch_ids.clear()
        self._failures.clear()
        self._rng = random.Random(self._seed)

    @property
    def tracked_contents(self) -> int:
        """How many distinct contents the fail-first counters remember."""
        return len(self._failures)

    def take_failure(self, key: str, limit: int) -> bool:
        """True if this call is one of the first ``limit`` calls for ``key`` (and count it)."""
        seen = self._failures.get(key, 0)
        if seen >= limit:
            return False
        self._failures[key] = seen + 1
        return True

    def roll(self) -> float:
        """A uniform number in [0, 1) from the (optionally seeded) dice."""
        return self._rng.random()

    def enter(self) -> None:
        """Count a call and mark it in flight."""
        self.calls += 1
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        """Mark a call (answered or cancelled) as no longer in flight."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no call is in flight."""
        await self._idle.wait()


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a call will be answered: 200, or an error status with an optional Retry-After."""

    status: int = 200
    retry_after: int | None = None


SUCCESS = Outcome()


def decide_outcome(triggers: Triggers, key: str, state: SimState, error_rate: float) -> Outcome:
    """Decide the answer of a call when it arrives (fail-first counters move here)."""
    if triggers.status is not None:
        return Outcome(triggers.status, triggers.retry_after)
    limit = triggers.failure_limit
    if limit is not None:
        if not state.take_failure(key, limit):
            return SUCCESS
        return Outcome(503 if triggers.retry_after is None else 429, triggers.retry_after)
    if not triggers.present and error_rate > 0 and state.roll() < error_rate:
        return Outcome(503)
    return SUCCESS


# --- HTTP ------------------------------------------------------------------------------


def json_response(
    payload: object, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """An ``application/json`` response encoded with orjson."""
    return web.Response(
        body=orjson.dumps(payload), status=status, content_type="application/json", headers=headers
    )


def error_response(
    status: int, message: str, error_type: str, retry_after: int | None = None
) -> web.Response:
    """An OpenAI-style error object, with ``Retry-After`` when given."""
    headers = None if retry_after is None else {"Retry-After": str(retry_after)}
    return json_response(error_payload(message, error_type), status=status, headers=headers)


def error_payload(message: str, error_type: str) -> dict[str, object]:
    """The body of an OpenAI-style error answer."""
    return {"error": {"message": message, "type": error_type}}


def _reply_text(chat: ChatRequest, reply_bytes: int | None) -> str:
    reply = "echo: " + chat.last_user
    if reply_bytes is not None:
        reply += "." * (reply_bytes - len(reply.encode()))
    return reply


def _tool_call(chat: ChatRequest) -> tuple[str, str, dict[str, str]]:
    """The 24-hex id, tool name and arguments of the call ``chat`` triggers."""
    name = chat.tool or ""
    digest = hashlib.blake2b(f"{name}\n{chat.last_user}".encode(), digest_size=12).hexdigest()
    return digest, name, {"text": chat.last_user}


def _prompt_tokens(chat: ChatRequest) -> int:
    return sum(estimate_tokens(content) for content in chat.contents)


def call_tokens(chat: ChatRequest, reply_bytes: int | None = None) -> int:
    """What a call counts against a tokens-per-minute limit: its prompt tokens plus its
    ``max_tokens``, or without one the tokens of the reply it gets."""
    if chat.max_tokens is not None:
        return _prompt_tokens(chat) + chat.max_tokens
    return _prompt_tokens(chat) + estimate_tokens(_reply_text(chat, reply_bytes))


def completion_payload(chat: ChatRequest, reply_bytes: int | None = None) -> dict[str, object]:
    """The ``chat.completion`` object answering ``chat``: the echo, its content padded
    with dots to ``reply_bytes`` when given, or the tool call it triggers."""
    if chat.calls_tool:
        digest, name, arguments = _tool_call(chat)
        encoded = orjson.dumps(arguments).decode()
        function = {"name": name, "arguments": encoded}
        call: dict[str, object] = {"id": "call_" + digest, "type": "function", "function": function}
        message: dict[str, object] = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish_reason, completion_tokens = "tool_calls", estimate_tokens(encoded)
    else:
        reply = _reply_text(chat, reply_bytes)
        message = {"role": "assistant", "content": reply}
        finish_reason, completion_tokens = "stop", estimate_tokens(reply)
    prompt_tokens = _prompt_tokens(chat)
    return {
        "id": "chatcmpl-" + os.urandom(12).hex(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": chat.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def message_payload(chat: ChatRequest, reply_bytes: int | None = None) -> dict[str, object]:
    """The Messages ``message`` object answering ``chat``: a text block with the echo
    (padded to ``reply_bytes`` when given), or a ``tool_use`` block for the call it
    triggers."""
    block: dict[str, object]
    if chat.calls_tool:
        digest, name, arguments = _tool_call(chat)
        block = {"type": "tool_use", "id": "toolu_" + digest, "name": name, "input": arguments}
        stop_reason, output_tokens = "tool_use", estimate_tokens(orjson.dumps(arguments).decode())
    else:
        reply = _reply_text(chat, reply_bytes)
        block = {"type": "text", "text": reply}
        stop_reason, output_tokens = "end_turn", estimate_tokens(reply)
    return {
        "id": "msg_" + os.urandom(12).hex(),
        "type": "message",
        "role": "assistant",
        "model": chat.model,
        "content": [block],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": _prompt_tokens(chat), "output_tokens": output_tokens},
    }


def anthropic_error_type(status: int) -> str:
    """The Messages API's error ``type`` for an HTTP status."""
    named = {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        529: "overloaded_error",
    }
    return named.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_error_response(
    status: int, message: str, retry_after: int | None = None
) -> web.Response:
    """A Messages API error object, with ``Retry-After`` when given."""
    headers = None if retry_after is None else {"Retry-After": str(retry_after)}
    payload = anthropic_error_payload(status, message)
    return json_response(payload, status=status, headers=headers)


def anthropic_error_payload(status: int, message: str) -> dict[str, object]:
    """The body of a Messages API error answer for an HTTP status."""
    return {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}


@dataclass(frozen=True)
class _Dialect:
    """How one endpoint reads a request and writes its answers."""

    parse: Callable[[web.Request, bytes], ChatRequest]
    success: Callable[[ChatRequest, int | None], dict[str, object]]
    error: Callable[[int, str, str, int | None], web.Response]


CHAT_DIALECT = _Dialect(
    parse=lambda _request, body: parse_chat_request(body),
    success=completion_payload,
    error=error_response,
)
MESSAGES_DIALECT = _Dialect(
    parse=lambda request, body: parse_messages_request(body, request.headers),
    success=message_payload,
    error=lambda status, message, _kind, retry_after: anthropic_error_response(
        status, message, retry_after
    ),
)


STATE_KEY: web.AppKey[SimState] = web.AppKey("upstream_sim_state", SimState)


class _Routes:
    """The request handlers of one simulator app."""

    def __init__(
        self,
        config: SimConfig,
        state: SimState,
        sleep: Sleep,
        windows: RateWindows,
        resets: tuple[Callable[[], None], ...] = (),
    ) -> None:
        self._config = config
        self._state = state
        self._sleep = sleep
        self._windows = windows
        self._resets = resets

    async def chat_completions(self, request: web.Request) -> web.Response:
        """``POST /v1/chat/completions``: count the call, then answer it."""
        return await self._counted(request, CHAT_DIALECT)

    async def messages(self, request: web.Request) -> web.Response:
        """``POST /v1/messages``: the same, in the Anthropic Messages shape."""
        return await self._counted(request, MESSAGES_DIALECT)

    async def _counted(self, request: web.Request, dialect: _Dialect) -> web.Response:
        self._state.enter()
        try:
            response = await self._answer(request, dialect)
        finally:
            self._state.leave()
        if response.status == 200:
            self._state.ok += 1
        else:
            self._state.errors += 1
        return response

    async def _answer(self, request: web.Request, dialect: _Dialect) -> web.Response:
        try:
            chat = dialect.parse(request, await request.read())
        except InvalidRequest as exc:
            await self._pause(self._config.latency_ms)
            kind = "authentication_error" if exc.status == 401 else "invalid_request_error"
            return dialect.error(exc.status, str(exc), kind, None)
        triggers = chat.triggers()
        outcome = decide_outcome(triggers, chat.last_user, self._state, self._config.error_rate)
        if outcome is SUCCESS and self._windows.active:
            if not self._windows.admit(call_tokens(chat, triggers.reply_bytes), chat.model):
                self._state.throttled += 1
                message = "rate limit reached (simulated requests or tokens per minute)"
                return dialect.error(429, message, "rate_limit_error", THROTTLE_RETRY_AFTER_S)
        await self._pause(self._config.latency_ms + (triggers.delay_ms or 0))
        if triggers.hang:
            await self._sleep(HANG_SECONDS)
        if outcome.status != 200:
            message = f"simulated status {outcome.status}"
            return dialect.error(outcome.status, message, "sim_error", outcome.retry_after)
        return json_response(dialect.success(chat, triggers.reply_bytes))

    async def _pause(self, milliseconds: float) -> None:
        if milliseconds > 0:
            await self._sleep(milliseconds / 1000)

    async def stats(self, _request: web.Request) -> web.Response:
        """``GET /stats``: call counters."""
        return json_response(self._state.stats())

    async def reset(self, _request: web.Request) -> web.Response:
        """``POST /reset``: zero every counter and forget every file and batch."""
        self._state.reset()
        for reset in self._resets:
            reset()
        return json_response({"ok": True})

    async def healthz(self, _request: web.Request) -> web.Response:
        """``GET /healthz``: always healthy."""
        return json_response({"status": "ok"})

    async def models(self, _request: web.Request) -> web.Response:
        """``GET /v1/models``: the one model the simulator serves."""
        return json_response({"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})


def build_app(
    config: SimConfig, *, sleep: Sleep = asyncio.sleep, clock: Callable[[], float] = time.time
) -> web.Application:
    """The simulator app; its :class:`SimState` is ``app[STATE_KEY]``.

    ``sleep`` is what every latency, delay and hang waits with (tests pass a recorder);
    ``clock`` the wall clock of the rate windows and of the provider batches.
    Serve it with ``handler_cancellation=True`` so a hung call ends when its client leaves.
    """
    # The batch APIs answer each request with this module's realtime logic, so they
    # import it; importing them here, not at the top, keeps that one-way.
    from relay_batches.services.upstream_sim.anthropic_batches import AnthropicBatches
    from relay_batches.services.upstream_sim.openai_batches import OpenAIBatches

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    state = SimState(config.seed)
    app[STATE_KEY] = state
    openai_batches = OpenAIBatches(config, state, clock, sleep)
    anthropic_batches = AnthropicBatches(config, state, clock, sleep)
    windows = RateWindows(config.rpm, config.tpm, clock)
    resets = (openai_batches.reset, anthropic_batches.reset)
    routes = _Routes(config, state, sleep, windows, resets)
    app.router.add_post("/v1/chat/completions", routes.chat_completions)
    app.router.add_post("/v1/messages", routes.messages)
    app.router.add_get("/v1/models", routes.models)
    app.router.add_get("/stats", routes.stats)
    app.router.add_post("/reset", routes.reset)
    app.router.add_get("/healthz", routes.healthz)
    openai_batches.add_routes(app.router)
    anthropic_batches.add_routes(app.router)
    return app
