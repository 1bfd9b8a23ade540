"""Unit tests of the model router against a scripted local upstream (aiohttp TestServer).

Every test scripts what each deployment answers, call by call; backoff sleeps go to a
recorder that returns at once, and jitter comes from a seeded ``random.Random``.
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from relay_batches.metrics import UPSTREAM_THROTTLED
from relay_batches.ratelimit.limiter import NoLimiter
from relay_batches.router.aliases import AliasTable, BatchOptions, Deployment, parse_aliases
from relay_batches.router.cooldown import CooldownPolicy, Cooldowns
from relay_batches.router.http1 import Http1Client
from relay_batches.router.policy import BackoffPolicy
from relay_batches.router.router import MAX_THROTTLED_RETRIES, ModelRouter
from relay_batches.router.types import Completion, RowResult

ALIAS = "chat"
MESSAGES = [{"role": "user", "content": "hi"}]
SEED = 42

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class SleepRecorder:
    """A stand-in for asyncio.sleep that records the delays and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def reply(content: str = "ok", prompt_tokens: int = 3, completion_tokens: int = 5) -> Handler:
    """A 200 chat completions answer."""

    async def handler(request: web.Request) -> web.Response:
        body = {
            "choices": [{"message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
        }
        return web.json_response(body)

    return handler


def status(code: int, text: str = "", headers: dict[str, str] | None = None) -> Handler:
    """An error answer with ``code`` and a short text body."""

    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=code, text=text or f"status {code}", headers=headers)

    return handler


def raw(body: bytes) -> Handler:
    """A 200 whose body is ``body`` as is."""

    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=200, body=body, content_type="application/json")

    return handler


@dataclass
class Call:
    """One request the upstream received."""

    deployment: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Upstream:
    """A scripted upstream: each deployment path answers from its own list of handlers.

    The last handler of a list repeats for every further call.
    """

    server: TestServer
    scripts: dict[str, list[Handler]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)

    def script(self, deployment: str, *handlers: Handler) -> None:
        self.scripts[deployment] = list(handlers)

    def base_url(self, deployment: str) -> str:
        return str(self.server.make_url(f"/{deployment}/v1"))

    def count(self, deployment: str) -> int:
        return sum(1 for c in self.calls if c.deployment == deployment)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["deployment"]
        body = orjson.loads(await request.read())
        self.calls.append(Call(name, dict(request.headers), body))
        handlers = self.scripts[name]
        handler = handlers.pop(0) if len(handlers) > 1 else handlers[0]
        return await handler(request)


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    app = web.Application()
    server = TestServer(app)
    up = Upstream(server)
    app.router.add_post("/{deployment}/v1/chat/completions", up.dispatch)
    await server.start_server()
    yield up
    await server.close()


@pytest.fixture
async def session() -> AsyncIterator[Http1Client]:
    client = Http1Client()
    yield client
    await client.close()


@pytest.fixture
def sleep() -> SleepRecorder:
    return SleepRecorder()


def deployment(upstream: Upstream, name: str, **overrides: Any) -> Deployment:
    spec: dict[str, Any] = {
        "name": name,
        "provider": "openai",
        "base_url": upstream.base_url(name),
        "model": f"model-{name}",
        "timeout_s": 5.0,
        "max_retries": 3,
    }
    spec.update(overrides)
    return Deployment(**spec)


def make_router(
    session: Http1Client, sleep: SleepRecorder, *deployments: Deployment
) -> ModelRouter:
    aliases = AliasTable({ALIAS: tuple(deployments)})
    return ModelRouter(aliases, session, BackoffPolicy(), sleep=sleep, rng=random.Random(SEED))


def jitter(count: int, base: float = 0.05, cap: float = 5.0) -> list[float]:
    """The delays the default policy draws for retries 0..count-1 from a fresh seeded rng."""
    rng = random.Random(SEED)
    return [rng.uniform(0.0, min(cap, base * 2**n)) for n in range(count)]


async def test_first_call_succeeds(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", reply("hello", 7, 2))
    router = make_router(session, sleep, deployment(upstream, "a"))
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result == RowResult(Completion("hello", 7, 2), None, 1, "a", dead_letter=False)
    assert sleep.delays == []


async def test_request_carries_model_messages_params_and_key(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", reply())
    dep = deployment(
        upstream,
        "a",
        api_key="sk-test",
        headers={"X-Team": "relay"},
        params={"temperature": 0.1, "max_tokens": 10},
    )
    router = make_router(session, sleep, dep)
    await router.complete(ALIAS, MESSAGES, {"max_tokens": 99, "model": "ignored"})
    (call,) = upstream.calls
    assert call.body == {
        "temperature": 0.1,
        "max_tokens": 99,
        "model": "model-a",
        "messages": MESSAGES,
    }
    assert call.headers["Authorization"] == "Bearer sk-test"
    assert call.headers["X-Team"] == "relay"
    assert call.headers["Content-Type"] == "application/json"


async def test_503_twice_then_200_retries_with_jitter(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", status(503), status(503), reply("third time"))
    router = make_router(session, sleep, deployment(upstream, "a"))
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result == RowResult(Completion("third time", 3, 5), None, 3, "a")
    assert sleep.delays == jitter(2)
    assert 0.0 <= sleep.delays[0] <= 0.05
    assert 0.0 <= sleep.delays[1] <= 0.1


async def test_400_is_permanent_and_not_retried(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", status(400, "bad request: messages"))
    router = make_router(session, sleep, deployment(upstream, "a"))
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result == RowResult(
        None, "upstream_error: a: HTTP 400: bad request: messages", 1, None, dead_letter=False
    )
    assert sleep.delays == []


async def test_400_falls_through_to_next_deployment_at_once(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", status(400))
    upstream.script("b", reply("from b"))
    router = make_router(session, sleep, deployment(upstream, "a"), deployment(upstream, "b"))
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result == RowResult(Completion("from b", 3, 5), None, 2, "b")
    assert sleep.delays == []
    assert [c.deployment for c in upstream.calls] == ["a", "b"]
    assert upstream.calls[1].body["model"] == "model-b"


async def test_always_503_on_a_falls_back_to_b(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", status(503))
    upstream.script("b", reply("from b"))
    router = make_router(
        session, sleep, deployment(upstream, "a", max_retries=2), deployment(upstream, "b")
    )
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result == RowResult(Completion("from b", 3, 5), None, 4, "b")
    assert upstream.count("a") == 3
    assert upstream.count("b") == 1
    assert sleep.delays == jitter(2)


async def test_every_deployment_transient_is_dead_lettered(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", status(503, "a is down"))
    upstream.script("b", status(500, "b is down"))
    router = make_router(
        session,
        sleep,
        deployment(upstream, "a", max_retries=1),
        deployment(upstream, "b", max_retries=2),
    )
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result == RowResult(
        None, "upstream_error: b: HTTP 500: b is down", 5, None, dead_letter=True
    )
    assert upstream.count("a") == 2
    assert upstream.count("b") == 3
    assert len(sleep.delays) == 3


async def test_transient_then_permanent_is_not_dead_lettered(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", status(503))
    upstream.script("b", status(422, "unprocessable"))
    router = make_router(
        session,
        sleep,
        deployment(upstream, "a", max_retries=0),
        deployment(upstream, "b"),
    )
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result == RowResult(
        None, "upstream_error: b: HTTP 422: unprocessable", 2, None, dead_letter=False
    )
    assert sleep.delays == []


async def test_permanent_then_transient_is_dead_lettered(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", status(401, "no key"))
    upstream.script("b", status(503, "busy"))
    router = make_router(
        session, sleep, deployment(upstream, "a"), deployment(upstream, "b", max_retries=1)
    )
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result == RowResult(None, "upstream_error: b: HTTP 503: busy", 3, None, dead_letter=True)


async def test_429_honours_retry_after(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script(
        "a",
        status(429, "slow down", {"Retry-After": "2"}),
        status(429, "slow down", {"Retry-After": "600"}),
        reply("finally"),
    )
    router = make_router(session, sleep, deployment(upstream, "a"))
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result == RowResult(Completion("finally", 3, 5), None, 3, "a")
    # Retry-After wins over jitter, and is capped by the policy (5 s by default).
    assert sleep.delays == [2.0, 5.0]


async def test_retry_budget_is_max_retries(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", status(429, "limited"))
    router = make_router(session, sleep, deployment(upstream, "a", max_retries=4))
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result == RowResult(
        None, "upstream_error: a: HTTP 429: limited", 5, None, dead_letter=True
    )
    assert sleep.delays == jitter(4)


async def test_error_body_is_truncated(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", status(400, "x" * 1000))
    router = make_router(session, sleep, deployment(upstream, "a"))
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result.error == "upstream_error: a: HTTP 400: " + "x" * 200


async def test_malformed_200_falls_through_and_is_not_dead_lettered(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", raw(b'{"choices": []}'))
    router = make_router(session, sleep, deployment(upstream, "a"))
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result == RowResult(
        None, "upstream_error: a: malformed response from upstream", 1, None, dead_letter=False
    )
    assert sleep.delays == []


async def test_unknown_alias(session: Http1Client, sleep: SleepRecorder) -> None:
    router = ModelRouter(AliasTable({}), session, sleep=sleep, rng=random.Random(SEED))
    result = await router.complete("nope", MESSAGES, {})
    assert result == RowResult(None, "upstream_error: unknown model alias 'nope'", 0, None)


async def test_connection_refused_is_transient(session: Http1Client, sleep: SleepRecorder) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = Deployment("dead", "openai", f"http://127.0.0.1:{port}/v1", "m", max_retries=2)
    router = make_router(session, sleep, dead)
    result = await router.complete(ALIAS, MESSAGES, {})
    assert result == RowResult(
        None,
        "upstream_error: dead: connection failed: ConnectFailed",
        3,
        None,
        dead_letter=True,
    )
    assert sleep.delays == jitter(2)


async def test_timeout_is_retried_then_dead_lettered(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    never = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await never.wait()
        return web.Response(status=200)

    upstream.script("a", hang)
    # Long enough for each call to reach the upstream's handler, which counts it, even on
    # a loaded machine (at 0.2 s a call was once cut off before its body was read).
    router = make_router(session, sleep, deployment(upstream, "a", timeout_s=0.5, max_retries=2))
    try:
        result = await router.complete(ALIAS, MESSAGES, {})
    finally:
        never.set()  # let the hanging handlers end so the server closes promptly
    assert result == RowResult(
        None, "upstream_error: a: timed out after 0.5s", 3, None, dead_letter=True
    )
    assert upstream.count("a") == 3
    assert sleep.delays == jitter(2)


async def test_a_cooling_deployment_is_skipped_while_another_is_ready() -> None:
    calls: list[str] = []

    async def chat(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.json_response({"choices": [{"message": {"content": "ok"}}]})

    app = web.Application()
    app.router.add_post("/a/chat/completions", chat)
    app.router.add_post("/b/chat/completions", chat)
    server = TestServer(app)
    await server.start_server()
    aliases = parse_aliases(
        {
            "aliases": {"m": {"deployments": ["a", "b"]}},
            "deployments": {
                "a": {"provider": "openai", "base_url": str(server.make_url("/a")), "model": "x"},
                "b": {"provider": "openai", "base_url": str(server.make_url("/b")), "model": "x"},
            },
        },
        {},
    )
    cooldowns = Cooldowns(CooldownPolicy(threshold=1, window_s=10, cooldown_s=60))
    cooldowns.record_failure("a")
    try:
        async with Http1Client() as session:
            router = ModelRouter(aliases, session, cooldowns=cooldowns)
            result = await router.complete("m", [{"role": "user", "content": "hi"}], {})
    finally:
        await server.close()
    assert (result.deployment, result.attempts) == ("b", 1)
    assert calls == ["/b/chat/completions"]


async def test_a_reply_over_the_size_cap_fails_the_deployment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import relay_batches.router.router as router_module

    monkeypatch.setattr(router_module, "MAX_REPLY_BYTES", 1000)

    async def chat(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"message": {"content": "x" * 5000}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    server = TestServer(app)
    await server.start_server()
    aliases = parse_aliases(
        {
            "aliases": {"m": {"deployments": ["a"]}},
            "deployments": {
                "a": {"provider": "openai", "base_url": str(server.make_url("/v1")), "model": "x"}
            },
        },
        {},
    )
    try:
        async with Http1Client() as session:
            result = await ModelRouter(aliases, session).complete("m", MESSAGES, {})
    finally:
        await server.close()
    assert result.completion is None
    assert result.error == "upstream_error: a: reply larger than 1000 bytes"
    assert (result.attempts, result.dead_letter) == (1, False)


async def test_a_deployment_that_cannot_take_the_row_falls_through_without_a_call(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("b", reply("from b"))
    claude = deployment(upstream, "a", provider="anthropic")
    router = make_router(session, sleep, claude, deployment(upstream, "b"))
    result = await router.complete(ALIAS, MESSAGES, {"seed": 7})
    assert result == RowResult(Completion("from b", 3, 5), None, 1, "b", dead_letter=False)
    assert [(c.deployment, c.body["seed"]) for c in upstream.calls] == [("b", 7)]
    assert sleep.delays == []


async def test_a_row_no_deployment_can_take_fails_with_the_refusal(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    claude = deployment(upstream, "a", provider="anthropic")
    router = make_router(session, sleep, claude)
    result = await router.complete(ALIAS, MESSAGES, {"seed": 7})
    assert result == RowResult(
        None,
        "upstream_error: a: anthropic deployments cannot take seed",
        0,
        None,
        dead_letter=False,
    )
    assert upstream.calls == []


# --- rate-limit hooks, with a fake limiter: acquire before every try (retries too) and
# before any connection, settle by the reply's usage, a 429 reported with its
# Retry-After, and a call waiting for budget that is cancelled.

LIMITED_MESSAGES = [{"role": "user", "content": "twelve chars"}]  # 3 tokens


class FakeLimiter:
    """Records every hook; ``gate`` (when set) holds acquire until it is set."""

    def __init__(self, limited: set[str], upstream: Upstream) -> None:
        self._limited = limited
        self._upstream = upstream
        self.events: list[tuple[object, ...]] = []
        self.gate: asyncio.Event | None = None
        self.waiting = 0
        self.entered = asyncio.Event()

    def limited(self, deployment: str) -> bool:
        return deployment in self._limited

    async def acquire(self, deployment: str, tokens: int) -> None:
        self.events.append(("acquire", deployment, tokens, len(self._upstream.calls)))
        if self.gate is not None:
            self.waiting += 1
            self.entered.set()
            try:
                await self.gate.wait()
            finally:
                self.waiting -= 1

    def settle(self, deployment: str, estimated: int, used: int) -> None:
        self.events.append(("settle", deployment, estimated, used))

    async def throttled(self, deployment: str, retry_after: float | None) -> None:
        self.events.append(("throttled", deployment, retry_after))


def make_limited(
    session: Http1Client, sleep: SleepRecorder, limiter: object, *deps: object
) -> ModelRouter:
    return ModelRouter(
        AliasTable({ALIAS: tuple(deps)}),  # type: ignore[arg-type]
        session,
        BackoffPolicy(),
        sleep=sleep,
        rng=random.Random(SEED),
        limiter=limiter,  # type: ignore[arg-type]
    )


async def test_acquire_before_each_try_settle_by_usage_and_throttled_with_retry_after(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", status(429, "slow", {"Retry-After": "2"}), status(503), reply("ok", 4, 9))
    limiter = FakeLimiter({"a"}, upstream)
    router = make_limited(session, sleep, limiter, deployment(upstream, "a"))
    result = await router.complete(ALIAS, LIMITED_MESSAGES, {"max_tokens": 20})
    assert result == RowResult(Completion("ok", 4, 9), None, 3, "a")
    assert limiter.events == [
        ("acquire", "a", 23, 0),  # estimate 3 + max_tokens, before the first call
        ("throttled", "a", 2.0),  # the 429 keeps its estimate: no refund to hand on
        ("acquire", "a", 23, 1),
        ("acquire", "a", 23, 2),  # the 503 counted as estimated: no settle
        ("settle", "a", 23, 24),  # the provider counts prompt 4 + the cap 20
    ]


async def test_without_a_cap_usage_counts_the_completion(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", reply("ok", 4, 9))
    limiter = FakeLimiter({"a"}, upstream)
    router = make_limited(session, sleep, limiter, deployment(upstream, "a"))
    await router.complete(ALIAS, LIMITED_MESSAGES, {})
    assert limiter.events == [("acquire", "a", 3, 0), ("settle", "a", 3, 13)]


async def test_a_deployment_without_limit_calls_no_hook(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", status(429, "slow", {"Retry-After": "1"}), reply())
    before = UPSTREAM_THROTTLED.labels("a")._value.get()
    limiter = FakeLimiter({"other"}, upstream)
    router = make_limited(session, sleep, limiter, deployment(upstream, "a"))
    result = await router.complete(ALIAS, LIMITED_MESSAGES, {})
    assert result.completion is not None
    assert limiter.events == []
    assert UPSTREAM_THROTTLED.labels("a")._value.get() == before + 1


async def test_no_call_while_waiting_and_a_cancel_leaves_no_waiter(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", reply())
    limiter = FakeLimiter({"a"}, upstream)
    limiter.gate = asyncio.Event()
    router = make_limited(session, sleep, limiter, deployment(upstream, "a"))
    row = asyncio.create_task(router.complete(ALIAS, LIMITED_MESSAGES, {}))
    await asyncio.wait_for(limiter.entered.wait(), 5.0)
    assert upstream.calls == []
    row.cancel()
    with pytest.raises(asyncio.CancelledError):
        await row
    assert limiter.waiting == 0
    assert upstream.calls == []


async def test_no_limiter_limits_nothing() -> None:
    limiter = NoLimiter()
    assert not limiter.limited("a")
    await limiter.acquire("a", 10)
    limiter.settle("a", 1, 2)
    await limiter.throttled("a", 1.0)


async def test_a_limited_deployments_429s_do_not_spend_the_rows_retries(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    # max_retries 3: unlimited, the fifth 429 would fail the row; limited, it waits again.
    upstream.script("a", *[status(429, "slow", {"Retry-After": "1"})] * 5, reply("ok", 4, 9))
    limiter = FakeLimiter({"a"}, upstream)
    router = make_limited(session, sleep, limiter, deployment(upstream, "a"))
    result = await router.complete(ALIAS, LIMITED_MESSAGES, {})
    assert result == RowResult(Completion("ok", 4, 9), None, 6, "a")
    assert [e[0] for e in limiter.events].count("acquire") == 6
    assert [e[0] for e in limiter.events].count("throttled") == 5
    assert sleep.delays == [1.0] * 5  # each after its Retry-After


async def test_a_limited_deployment_fails_a_row_after_its_throttled_retries_and_retries(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", *[status(429, "slow")] * (MAX_THROTTLED_RETRIES + 4))
    limiter = FakeLimiter({"a"}, upstream)
    router = make_limited(session, sleep, limiter, deployment(upstream, "a"))
    result = await router.complete(ALIAS, LIMITED_MESSAGES, {})
    assert result.completion is None and result.dead_letter
    assert result.attempts == MAX_THROTTLED_RETRIES + 4  # then max_retries 3 + the first call


async def test_the_estimate_counts_the_cap_the_provider_call_sends(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("a", reply("ok", 4, 9))
    limiter = FakeLimiter({"a"}, upstream)
    capped = deployment(upstream, "a", params={"max_completion_tokens": 4096})
    router = make_limited(session, sleep, limiter, capped)
    await router.complete(ALIAS, LIMITED_MESSAGES, {"max_tokens": 100})
    assert limiter.events == [("acquire", "a", 103, 0), ("settle", "a", 103, 104)]


async def test_a_batch_deployment_is_never_called_realtime(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    upstream.script("b", reply("realtime"))
    options = BatchOptions("openai", 10, 1000)
    batch = deployment(upstream, "a", provider="openai-batch", batch=options)
    router = make_router(session, sleep, batch, deployment(upstream, "b"))
    result = await router.complete(ALIAS, MESSAGES, {})
    assert (result.deployment, result.attempts, upstream.count("a")) == ("b", 1, 0)


async def test_an_alias_with_only_a_batch_deployment_fails_realtime_rows(
    upstream: Upstream, session: Http1Client, sleep: SleepRecorder
) -> None:
    options = BatchOptions("openai", 10, 1000)
    batch = deployment(upstream, "a", provider="openai-batch", batch=options)
    result = await make_router(session, sleep, batch).complete(ALIAS, MESSAGES, {})
    assert result == RowResult(None, f"upstream_error: {ALIAS} has no realtime deployment", 0, None)
    assert upstream.count("a") == 0
