"""The model router: a row tries its alias's deployments in order, retrying each.

Within a deployment, connect errors, timeouts and retryable statuses (408, 409, 429,
5xx) are retried with backoff (honouring ``Retry-After``) up to its ``max_retries``;
any other status falls through to the next deployment at once. A deployment cooling
down (see :mod:`relay_batches.router.cooldown`) is skipped while another is available. A row
failing everywhere gets ``upstream_error: …``; it is dead-lettered when its last
failure was transient (worth replaying), and only failed when it was permanent.

A rate-limited deployment's call (retries too) first waits for budget
(:mod:`relay_batches.ratelimit.limiter`), before any connection is taken; a 200 settles
the token estimate by the reply's usage, and a 429 (or a Retry-After) is reported so
every worker's pacer slows down. On a limited deployment a 429 does not spend the row's
``max_retries``: the row waits for budget again, up to :data:`MAX_THROTTLED_RETRIES`
times (it still counts towards a cooldown, so an alias with a fallback moves on). Without
a limit none of that runs. A flex deployment's 429 (``service_tier = "flex"``: capacity
short) is no failure to retry: the row goes on to the alias's next deployment at once.

A batch deployment (a provider's batch API, see :mod:`relay_batches.router.aliases`) is
never called here: a row of an alias led by one (a row the offloader forwards, or one of a
job that runs realtime) starts at the alias's first realtime deployment, and an alias with
none fails the row with ``upstream_error: <alias> has no realtime deployment``.

A deployment's request is built once per row; a provider that cannot take what the row
asks for (:class:`~relay_batches.router.types.UnsupportedRequest`) is a permanent
failure of that deployment without a call, so the row falls through to the next one.

A row of another endpoint than chat (``endpoint``: embeddings, completions, moderations,
responses) goes to the deployments that declare it (``endpoints`` in the routes); one
that does not is a permanent failure of that deployment (``does not serve <endpoint>``),
so the row falls through. Its body is sent as it is (:mod:`.dialects.openai.endpoints`)
or, a Responses row on an Anthropic deployment, translated to Messages
(:mod:`.dialects.anthropic.responses`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from relay_batches.dialects.anthropic import upstream as anthropic
from relay_batches.dialects.anthropic.responses import ResponsesWire
from relay_batches.dialects.endpoints import CHAT, ENDPOINTS, RESPONSES
from relay_batches.dialects.openai import upstream as openai
from relay_batches.dialects.openai.endpoints import BodyWire
from relay_batches.metrics import (
    UPSTREAM_CALLS,
    UPSTREAM_FALLBACKS,
    UPSTREAM_FLEX_REFUSED,
    UPSTREAM_LATENCY,
    UPSTREAM_RETRIES,
    UPSTREAM_THROTTLED,
)
from relay_batches.ratelimit.estimate import counted_tokens, estimate_tokens
from relay_batches.ratelimit.limiter import Limiter, NoLimiter
from relay_batches.router.aliases import AliasTable, Deployment
from relay_batches.router.cooldown import CooldownPolicy, Cooldowns
from relay_batches.router.http1 import Http1Client, UpstreamConnectionError
from relay_batches.router.policy import BackoffPolicy, is_retryable_status, parse_retry_after
from relay_batches.router.types import ProviderReply, RowResult, UnsupportedRequest

ERROR_SNIPPET_CHARS = 200
MAX_REPLY_BYTES = 8 * 1024 * 1024
MAX_THROTTLED_RETRIES = 20  # 429s of a limited deployment a row waits out beyond max_retries
PROVIDERS: dict[str, ModuleType] = {"openai": openai, "anthropic": anthropic}
# The wire of each (provider, endpoint) besides chat.
BODY_WIRES: dict[tuple[str, str], Any] = {
    **{("openai", endpoint): BodyWire(endpoint) for endpoint in ENDPOINTS},
    ("anthropic", RESPONSES): ResponsesWire(),
}

Sleep = Callable[[float], Awaitable[None]]


def _wire(deployment: Deployment, endpoint: str) -> Any:
    """The provider interface a row of ``endpoint`` uses on ``deployment``; None when
    the deployment does not serve that endpoint."""
    if endpoint not in deployment.endpoints:
        return None
    if endpoint == CHAT:
        return PROVIDERS[deployment.provider]
    return BODY_WIRES.get((deployment.provider, endpoint))


def _estimate(
    provider: Any,
    messages: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    cap: int,
    endpoint: str,
) -> int:
    """The tokens a limited call is expected to count."""
    if endpoint == CHAT:
        return estimate_tokens(messages, params, cap)
    return int(provider.estimate(params, cap))


@dataclass(slots=True)
class _Attempt:
    """One upstream call's result: a reply, or a failure and whether to retry it."""

    reply: ProviderReply | None = None
    error: str | None = None
    retryable: bool = False
    retry_after: float | None = None
    status: int | None = None

    @property
    def throttled(self) -> bool:
        """A 429, or a retryable status that said when to come back."""
        return self.status == 429 or (self.retryable and self.retry_after is not None)


@dataclass(frozen=True)
class _DeploymentResult:
    """What one deployment made of a row."""

    reply: ProviderReply
    calls: int
    transient: bool


class ModelRouter:
    """Turns ``(alias, messages, params)`` into a :class:`RowResult`."""

    def __init__(
        self,
        aliases: AliasTable,
        client: Http1Client,
        policy: BackoffPolicy | None = None,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
        cooldowns: Cooldowns | None = None,
        limiter: Limiter | None = None,
    ) -> None:
        self.aliases = aliases
        self._client = client
        self._policy = policy or BackoffPolicy()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._cooldowns = cooldowns or Cooldowns(CooldownPolicy())
        self._limiter: Limiter = limiter or NoLimiter()
        self._latency: dict[str, Any] = {}
        self._calls: dict[tuple[str, str], Any] = {}
        self._realtime: dict[str, tuple[Deployment, ...]] = {}

    async def complete(
        self,
        alias: str,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        workspace: str = "",
        endpoint: str = CHAT,
    ) -> RowResult:
        """Run one row through its alias's deployments, its calls over connections of
        ``workspace``'s own (see :mod:`relay_batches.router.http1`); a row of another
        ``endpoint`` than chat has its body as ``params`` and no messages."""
        canonical = self.aliases.alias_of(alias)  # a name a pattern matches: its alias
        deployments = None if canonical is None else self._realtime_of(canonical)
        if canonical is None or deployments is None:
            return RowResult(None, f"upstream_error: unknown model alias {alias!r}", 0, None)
        alias = canonical
        if not deployments:
            return RowResult(None, f"upstream_error: {alias} has no realtime deployment", 0, None)
        attempts = 0
        last_error = "no deployment tried"
        last_transient = False
        for position, deployment in enumerate(self._order(deployments)):
            if position:
                UPSTREAM_FALLBACKS.labels(alias).inc()
            has_next = position + 1 < len(deployments)
            result = await self._try_deployment(
                deployment, messages, params, has_next, workspace, endpoint
            )
            attempts += result.calls
            if result.reply.completion is not None:
                lane = None if deployment.service_tier is None else deployment.lane
                return RowResult(
                    result.reply.completion, None, attempts, deployment.name, lane=lane
                )
            last_error = f"{deployment.name}: {result.reply.error}"
            last_transient = result.transient
        return RowResult(
            None, f"upstream_error: {last_error}", attempts, None, dead_letter=last_transient
        )

    def _realtime_of(self, alias: str) -> tuple[Deployment, ...] | None:
        """The alias's realtime deployments (its batch one left out), once per alias;
        None for an unknown alias."""
        cached = self._realtime.get(alias)
        if cached is None:
            deployments = self.aliases.resolve(alias)
            if deployments is None:
                return None
            cached = tuple(d for d in deployments if d.batch is None)
            self._realtime[alias] = cached
        return cached

    def _order(self, deployments: tuple[Deployment, ...]) -> Sequence[Deployment]:
        """Deployments in fallback order, those cooling down moved behind the others."""
        if not self._cooldowns.any_cooling():
            return deployments
        ready = [d for d in deployments if not self._cooldowns.cooling(d.name)]
        if len(ready) == len(deployments):
            return deployments
        return ready + [d for d in deployments if d not in ready]

    def _latency_of(self, deployment: Deployment) -> Any:
        """The deployment's latency metric, looked up once (hot path)."""
        metric = self._latency.get(deployment.name)
        if metric is None:
            metric = self._latency[deployment.name] = UPSTREAM_LATENCY.labels(deployment.name)
        return metric

    def _calls_of(self, deployment: str, outcome: str) -> Any:
        """The deployment's call counter of ``outcome``, looked up once (hot path)."""
        key = (deployment, outcome)
        metric = self._calls.get(key)
        if metric is None:
            metric = self._calls[key] = UPSTREAM_CALLS.labels(deployment, outcome)
        return metric

    async def _try_deployment(
        self,
        deployment: Deployment,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        has_next: bool,
        workspace: str,
        endpoint: str = CHAT,
    ) -> _DeploymentResult:
        """Call one deployment with retries until success, a permanent error or give-up."""
        provider = _wire(deployment, endpoint)
        if provider is None:
            error = f"deployment does not serve {endpoint}"
            return _DeploymentResult(ProviderReply(error=error), 0, False)
        try:
            request = provider.build_request(deployment, messages, params)
        except UnsupportedRequest as exc:
            return _DeploymentResult(ProviderReply(error=str(exc)), 0, False)
        calls = 0
        limited = self._limiter.limited(deployment.name)
        cap = provider.token_cap(deployment, params) if limited else 0
        estimate = _estimate(provider, messages, params, cap, endpoint) if limited else 0
        failures = throttles = 0
        while True:
            if limited:
                await self._limiter.acquire(deployment.name, estimate)
            attempt = await self._call(deployment, provider, request, workspace)
            calls += 1
            self._calls_of(deployment.name, _call_outcome(attempt)).inc()
            if limited or attempt.throttled:
                await self._account(deployment.name, attempt, cap, estimate, limited)
            if attempt.reply is not None:
                if attempt.reply.completion is not None:
                    self._cooldowns.record_success(deployment.name)
                return _DeploymentResult(attempt.reply, calls, False)
            if not attempt.retryable:
                return _DeploymentResult(ProviderReply(error=attempt.error), calls, False)
            if attempt.status == 429 and deployment.service_tier is not None:
                # The flex lane's refusal (capacity short): the next lane takes the row,
                # without a retry here or a cooldown (the next row may well be taken).
                UPSTREAM_FLEX_REFUSED.labels(deployment.name).inc()
                return _DeploymentResult(ProviderReply(error=attempt.error), calls, True)
            self._cooldowns.record_failure(deployment.name)
            # A limited deployment's 429 means its budget ran out upstream: the row waits
            # for budget again (the pacers slowed down) instead of spending its retries,
            # up to MAX_THROTTLED_RETRIES (a provider that never lets it through fails it).
            waits_out = limited and attempt.status == 429 and throttles < MAX_THROTTLED_RETRIES
            if waits_out:
                throttles += 1
            else:
                failures += 1
            out_of_budget = failures > deployment.max_retries
            if out_of_budget or (has_next and self._cooldowns.cooling(deployment.name)):
                return _DeploymentResult(ProviderReply(error=attempt.error), calls, True)
            UPSTREAM_RETRIES.labels(deployment.name).inc()
            retry = (throttles if waits_out else failures) - 1
            await self._sleep(self._policy.delay(retry, self._rng, attempt.retry_after))

    async def _account(
        self, name: str, attempt: _Attempt, cap: int, estimate: int, limited: bool
    ) -> None:
        """A limited call's tokens by the reply's usage (a throttled call keeps its
        estimate); a throttled call counted and, when limited, reported."""
        completion = None if attempt.reply is None else attempt.reply.completion
        if attempt.throttled:
            UPSTREAM_THROTTLED.labels(name).inc()
        if not limited:
            return
        if completion is not None:
            used = counted_tokens(
                cap, completion.prompt_tokens, completion.completion_tokens, estimate
            )
            self._limiter.settle(name, estimate, used)
        elif attempt.throttled:
            # No refund of a throttled call's tokens: handed straight on, they let the
            # next waiter call into the same limit (on a tpm-only deployment, a cascade
            # of 429s until the grant expired).
            await self._limiter.throttled(name, attempt.retry_after)

    async def _call(
        self,
        deployment: Deployment,
        provider: Any,
        request: tuple[str, dict[str, str], bytes],
        workspace: str,
    ) -> _Attempt:
        url, headers, body = request
        latency = self._latency_of(deployment)
        started = time.perf_counter()
        try:
            reply = await self._client.post(
                url, headers, body, deployment.timeout_s, MAX_REPLY_BYTES, workspace
            )
        except TimeoutError:
            return _Attempt(error=f"timed out after {deployment.timeout_s:g}s", retryable=True)
        except UpstreamConnectionError as exc:
            return _Attempt(error=f"connection failed: {exc.__class__.__name__}", retryable=True)
        except ValueError as exc:  # a header the routes give that HTTP cannot carry
            return _Attempt(error=f"request cannot be sent: {exc}")
        finally:
            latency.observe(time.perf_counter() - started)
        status, raw = reply.status, reply.body
        retry_after = reply.headers.get("retry-after")
        if status == 200 and len(raw) > MAX_REPLY_BYTES:
            return _Attempt(reply=ProviderReply(error=f"reply larger than {MAX_REPLY_BYTES} bytes"))
        if status == 200:
            return _Attempt(reply=provider.parse_reply(raw))
        snippet = raw[:ERROR_SNIPPET_CHARS].decode("utf-8", "replace")
        return _Attempt(
            error=f"HTTP {status}: {snippet}",
            retryable=is_retryable_status(status),
            retry_after=parse_retry_after(retry_after),
            status=status,
        )


def _call_outcome(attempt: _Attempt) -> str:
    """``ok`` for a call that brought an answer, ``error`` for any other."""
    return "ok" if attempt.reply is not None and attempt.reply.completion is not None else "error"
