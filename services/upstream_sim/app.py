"""The upstream simulator: an OpenAI-compatible chat completions endpoint that echoes.

Replies are deterministic ``"echo: <last user message>"`` completions. Markers in the
message contents make a call misbehave on purpose, so tests and benchmarks can exercise
retries, rate limits and timeouts without a real model:

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
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
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
_TRIGGER_RE = re.compile(
    r"\[sim:(?:(status|fail-first|delay-ms|retry-after|reply-bytes)=(\d{1,9})|(hang))\]"
)


@dataclass(frozen=True)
class SimConfig:
    """How the simulator behaves on every call."""

    latency_ms: float = 0
    error_rate: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.latency_ms >= 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms!r}")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate must be within 0..1, got {self.error_rate!r}")


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
    """The request body is not a chat completions request."""


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What the simulator needs from a chat completions request."""

    model: str
    contents: tuple[str, ...]
    last_user: str

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


def parse_chat_request(body: bytes) -> ChatRequest:
    """Decode a chat completions body; raise :class:`InvalidRequest` when it is not one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidRequest("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list")
    if not all(isinstance(message, dict) for message in messages):
        raise InvalidRequest("every message must be an object")
    contents = tuple(_content_text(message.get("content")) for message in messages)
    last_user = next(
        (
            content
            for message, content in zip(reversed(messages), reversed(contents), strict=True)
            if message.get("role") == "user"
        ),
        "",
    )
    model = data.get("model")
    return ChatRequest(
        model=model if isinstance(model, str) else MODEL_ID,
        contents=contents,
        last_user=last_user,
    )


# --- state and decisions ---------------------------------------------------------------


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
        self.in_flight = 0

    def stats(self) -> dict[str, int]:
        """The counters served by ``GET /stats``."""
        return {"calls": self.calls, "ok": self.ok, "errors": self.errors}

    def reset(self) -> None:
        """Zero every counter, forget fail-first contents and re-seed the dice."""
        self.calls = self.ok = self.errors = 0
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
    payload = {"error": {"message": message, "type": error_type}}
    return json_response(payload, status=status, headers=headers)


def completion_payload(chat: ChatRequest, reply_bytes: int | None = None) -> dict[str, object]:
    """The ``chat.completion`` object answering ``chat``, its content padded with dots to
    ``reply_bytes`` when given."""
    reply = "echo: " + chat.last_user
    if reply_bytes is not None:
        reply += "." * (reply_bytes - len(reply.encode()))
    prompt_tokens = sum(estimate_tokens(content) for content in chat.contents)
    completion_tokens = estimate_tokens(reply)
    return {
        "id": "chatcmpl-" + os.urandom(12).hex(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": chat.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


STATE_KEY: web.AppKey[SimState] = web.AppKey("upstream_sim_state", SimState)


class _Routes:
    """The request handlers of one simulator app."""

    def __init__(self, config: SimConfig, state: SimState, sleep: Sleep) -> None:
        self._config = config
        self._state = state
        self._sleep = sleep

    async def chat_completions(self, request: web.Request) -> web.Response:
        """``POST /v1/chat/completions``: count the call, then answer it."""
        self._state.enter()
        try:
            response = await self._answer(await request.read())
        finally:
            self._state.leave()
        if response.status == 200:
            self._state.ok += 1
        else:
            self._state.errors += 1
        return response

    async def _answer(self, body: bytes) -> web.Response:
        try:
            chat = parse_chat_request(body)
        except InvalidRequest as exc:
            await self._pause(self._config.latency_ms)
            return error_response(400, str(exc), "invalid_request_error")
        triggers = chat.triggers()
        outcome = decide_outcome(triggers, chat.last_user, self._state, self._config.error_rate)
        await self._pause(self._config.latency_ms + (triggers.delay_ms or 0))
        if triggers.hang:
            await self._sleep(HANG_SECONDS)
        if outcome.status != 200:
            message = f"simulated status {outcome.status}"
            return error_response(outcome.status, message, "sim_error", outcome.retry_after)
        return json_response(completion_payload(chat, triggers.reply_bytes))

    async def _pause(self, milliseconds: float) -> None:
        if milliseconds > 0:
            await self._sleep(milliseconds / 1000)

    async def stats(self, _request: web.Request) -> web.Response:
        """``GET /stats``: call counters."""
        return json_response(self._state.stats())

    async def reset(self, _request: web.Request) -> web.Response:
        """``POST /reset``: zero every counter."""
        self._state.reset()
        return json_response({"ok": True})

    async def healthz(self, _request: web.Request) -> web.Response:
        """``GET /healthz``: always healthy."""
        return json_response({"status": "ok"})

    async def models(self, _request: web.Request) -> web.Response:
        """``GET /v1/models``: the one model the simulator serves."""
        return json_response({"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})


def build_app(config: SimConfig, *, sleep: Sleep = asyncio.sleep) -> web.Application:
    """The simulator app; its :class:`SimState` is ``app[STATE_KEY]``.

    ``sleep`` is what every latency, delay and hang waits with (tests pass a recorder).
    Serve it with ``handler_cancellation=True`` so a hung call ends when its client leaves.
    """
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    state = SimState(config.seed)
    app[STATE_KEY] = state
    routes = _Routes(config, state, sleep)
    app.router.add_post("/v1/chat/completions", routes.chat_completions)
    app.router.add_get("/v1/models", routes.models)
    app.router.add_get("/stats", routes.stats)
    app.router.add_post("/reset", routes.reset)
    app.router.add_get("/healthz", routes.healthz)
    return app
