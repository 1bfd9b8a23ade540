"""The upstream simulator's app: OpenAI-compatible chat completions and Anthropic-shaped
Messages endpoints that echo, the providers' batch APIs, and the routes wiring them.

``POST /v1/embeddings``, ``/v1/completions``, ``/v1/moderations`` and ``/v1/responses``
(:mod:`.openai_endpoints`) answer deterministically in their own shapes.
``POST /v1/chat/completions`` (:mod:`.openai_chat`) replies with deterministic
``"echo: <last user message>"`` completions (:mod:`.echo`); ``POST /v1/messages``
(:mod:`.anthropic_messages`) does the same in the Anthropic Messages shape after
validating the request as the Messages API does; errors there have Anthropic's
``{type: "error", error}`` shape.

Every call can be made to misbehave on purpose (:mod:`.faults`: ``[sim:...]`` markers,
the global latency and error rate) and meets per-model rate limits (:mod:`.rate_limits`).

Provider batch APIs (:mod:`.openai_batches`, :mod:`.anthropic_batches`, what they share
in :mod:`.batches`): OpenAI's ``/v1/files`` and ``/v1/batches`` and Anthropic's
``/v1/messages/batches``, each batched request answered exactly as its realtime call would
be.

``GET /stats`` serves the counters of :class:`~.state.SimState`, ``GET /stats/answers``
the calls answered per distinct request (:mod:`.answers`); ``POST /reset`` zeroes
them and forgets every file and batch; ``GET /v1/models`` names the one model,
``GET /healthz`` is always healthy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from relay_batches.services.upstream_sim.anthropic_batches import AnthropicBatches
from relay_batches.services.upstream_sim.anthropic_messages import (
    anthropic_error_response,
    message_payload,
    parse_messages_request,
)
from relay_batches.services.upstream_sim.config import (
    HANG_SECONDS,
    MAX_BODY_BYTES,
    MODEL_ID,
    SimConfig,
    Sleep,
)
from relay_batches.services.upstream_sim.echo import (
    ChatRequest,
    InvalidRequest,
    call_tokens,
    estimate_tokens,
    json_object,
    json_response,
)
from relay_batches.services.upstream_sim.faults import SUCCESS, decide_outcome
from relay_batches.services.upstream_sim.openai_batches import OpenAIBatches
from relay_batches.services.upstream_sim.openai_chat import (
    completion_payload,
    error_response,
    parse_chat_request,
)
from relay_batches.services.upstream_sim.openai_endpoints import ENDPOINTS, Answer, Read
from relay_batches.services.upstream_sim.prompt_cache import (
    PromptCache,
    anthropic_cached,
    openai_cached,
)
from relay_batches.services.upstream_sim.rate_limits import THROTTLE_RETRY_AFTER_S, RateWindows
from relay_batches.services.upstream_sim.state import SimState


@dataclass(frozen=True)
class _Dialect:
    """How one endpoint reads a request and writes its answers."""

    parse: Callable[[web.Request, bytes], ChatRequest]
    success: Callable[[ChatRequest, int | None], dict[str, object]]
    error: Callable[[int, str, str, int | None], web.Response]
    cached: Callable[[dict[str, object], int], None] | None = None  # notes cache reads


CHAT_DIALECT = _Dialect(
    parse=lambda _request, body: parse_chat_request(body),
    success=completion_payload,
    error=error_response,
    cached=openai_cached,
)


# The endpoints besides chat (:mod:`.openai_endpoints`), by path, each with OpenAI errors.
def _body_dialect(read: Read, answer: Answer) -> _Dialect:
    return _Dialect(
        parse=lambda _request, body: read(json_object(body)), success=answer, error=error_response
    )


BODY_DIALECTS = {
    path: _body_dialect(read, answer)
    for path, (read, answer) in ENDPOINTS.items()
    if path != "/v1/chat/completions"
}
MESSAGES_DIALECT = _Dialect(
    parse=lambda request, body: parse_messages_request(body, request.headers),
    success=message_payload,
    error=lambda status, message, _kind, retry_after: anthropic_error_response(
        status, message, retry_after
    ),
    cached=anthropic_cached,
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

    async def body_endpoint(self, request: web.Request) -> web.Response:
        """``POST /v1/embeddings``, ``/v1/completions``, ``/v1/moderations`` and
        ``/v1/responses``: counted and answered as chat is."""
        return await self._counted(request, BODY_DIALECTS[request.path])

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
        if chat.flex and self._state.refuse_flex(self._config.flex_refusal):
            await self._pause(self._config.latency_ms)
            message = "flex capacity is short, try again later (simulated)"
            return dialect.error(429, message, "resource_unavailable", None)
        outcome = decide_outcome(triggers, chat.last_user, self._state, self._config.error_rate)
        if outcome is SUCCESS and self._windows.active:
            if not self._windows.admit(call_tokens(chat, triggers.reply_bytes), chat.model):
                self._state.throttled += 1
                message = "rate limit reached (simulated requests or tokens per minute)"
                return dialect.error(429, message, "rate_limit_error", THROTTLE_RETRY_AFTER_S)
        if outcome.status == 200:
            self._state.answers.begin(chat)
        flex_ms = self._config.flex_latency_ms if chat.flex else 0
        await self._pause(self._config.latency_ms + flex_ms + (triggers.delay_ms or 0))
        if triggers.hang:
            await self._sleep(HANG_SECONDS)
        if outcome.status != 200:
            message = f"simulated status {outcome.status}"
            return dialect.error(outcome.status, message, "sim_error", outcome.retry_after)
        self._state.answers.answer(chat)
        payload = dialect.success(chat, triggers.reply_bytes)
        if dialect.cached is not None:
            cached = self._state.prompt_cache.cached(chat.contents, estimate_tokens)
            if cached:
                dialect.cached(payload, cached)
        return json_response(payload)

    async def _pause(self, milliseconds: float) -> None:
        if milliseconds > 0:
            await self._sleep(milliseconds / 1000)

    async def stats(self, _request: web.Request) -> web.Response:
        """``GET /stats``: call counters."""
        return json_response(self._state.stats())

    async def answers(self, _request: web.Request) -> web.Response:
        """``GET /stats/answers``: calls answered and begun per distinct request."""
        return json_response(self._state.answers.summary())

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
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    state = SimState(config.seed, PromptCache(config.cache_prefixes, config.cache_ttl_s))
    app[STATE_KEY] = state
    openai_batches = OpenAIBatches(config, state, clock, sleep)
    anthropic_batches = AnthropicBatches(config, state, clock, sleep)
    windows = RateWindows(config.rpm, config.tpm, clock, config.rate_counting)
    resets = (openai_batches.reset, anthropic_batches.reset)
    routes = _Routes(config, state, sleep, windows, resets)
    app.router.add_post("/v1/chat/completions", routes.chat_completions)
    app.router.add_post("/v1/messages", routes.messages)
    for path in BODY_DIALECTS:
        app.router.add_post(path, routes.body_endpoint)
    app.router.add_get("/v1/models", routes.models)
    app.router.add_get("/stats", routes.stats)
    app.router.add_get("/stats/answers", routes.answers)
    app.router.add_post("/reset", routes.reset)
    app.router.add_get("/healthz", routes.healthz)
    openai_batches.add_routes(app.router)
    anthropic_batches.add_routes(app.router)
    return app
