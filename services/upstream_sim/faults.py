"""How a call misbehaves on purpose: the ``[sim:...]`` markers of a request, the global
latency and error rate, and the outcome they decide when the call arrives.

Markers in the message contents make a call misbehave, so tests and benchmarks can
exercise retries, rate limits and timeouts without a real model (on both endpoints):

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

import re
from dataclasses import dataclass

from relay_batches.services.upstream_sim.config import MAX_REPLY_BYTES
from relay_batches.services.upstream_sim.state import SimState

MARKER = "[sim:"
_TRIGGER_RE = re.compile(
    r"\[sim:(?:(status|fail-first|delay-ms|retry-after|reply-bytes)=(\d{1,9})|(hang))\]"
)


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
    if MARKER not in text:
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
