"""Rate limits, as providers enforce them (:class:`RateWindows`), for each requested model
on its own: with ``SimConfig.rpm`` at most ``rpm / 60`` calls a second, and with
``SimConfig.tpm`` at most ``tpm / 60`` tokens, a call counting its prompt tokens plus its
``max_tokens`` (``max_completion_tokens``; without either, its reply's tokens); a call over
either answers 429 at once with ``Retry-After: 1`` and the provider's error shape, and is
not counted. ``GET /stats`` counts those answers as ``throttled``.

Providers count "a second" in different ways, and ``SimConfig.rate_counting`` picks one
(``RELAY_SIM_RATE_COUNTING``), for calls and tokens alike:

- ``calendar`` (:class:`CalendarSecond`): each calendar second of the clock admits
  ``limit / 60`` with the remainder spread over the minute (:func:`per_second`: 90 rpm is
  1, 2, 1, 2, …), so any 60 consecutive seconds admit exactly the limit;
- ``sliding`` (:class:`SlidingWindow`): any window of :func:`sliding_span` seconds admits
  ``ceil(limit / 60)`` (a window of one second when the limit is a multiple of 60: 600 rpm
  is at most 10 calls in *any* second, wherever it starts);
- ``bucket`` (:class:`TokenBucket`): a bucket of ``ceil(limit / 60)`` (a second's worth),
  full at first, refilled continuously at ``limit / 60`` a second; a call takes its
  amount out of it, and fits only while the bucket holds that much.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from relay_batches.settings.tools import RATE_COUNTINGS as COUNTINGS

THROTTLE_RETRY_AFTER_S = 1  # a throttled call may come back with the next second
MAX_RATE_MODELS = 1024  # models with a window of their own; beyond, the oldest is forgotten


def per_second(per_minute: int, second: int) -> int:
    """What calendar second ``second`` admits of a per-minute limit: ``per_minute /
    60`` with the remainder spread evenly (90 rpm: 1, 2, 1, 2, …; 30 rpm: one call every
    other second), so any 60 consecutive seconds admit exactly ``per_minute``."""
    return (second + 1) * per_minute // 60 - second * per_minute // 60


def burst(per_minute: int) -> int:
    """The most a sliding window or a bucket admits at once: ``ceil(per_minute / 60)``."""
    return -(-per_minute // 60)


def sliding_span(per_minute: int) -> float:
    """Seconds a sliding window spans: the time ``per_minute`` takes to earn a
    :func:`burst` (one second when the limit is a multiple of 60)."""
    return burst(per_minute) * 60 / per_minute


class Counter(Protocol):
    """One model's count of one limit (calls or tokens)."""

    def fits(self, amount: int, now: float) -> bool:
        """Whether ``amount`` more may go at ``now``."""

    def count(self, amount: int, now: float) -> None:
        """Count ``amount`` at ``now`` (after :meth:`fits` said yes)."""


class CalendarSecond:
    """Each calendar second admits :func:`per_second` of the limit."""

    def __init__(self, per_minute: int) -> None:
        self._per_minute = per_minute
        self._second = -1
        self._used = 0

    def _roll(self, now: float) -> int:
        second = math.floor(now)
        if second != self._second:
            self._second, self._used = second, 0
        return second

    def fits(self, amount: int, now: float) -> bool:
        """Whether this calendar second has room for ``amount``."""
        second = self._roll(now)
        return self._used + amount <= per_second(self._per_minute, second)

    def count(self, amount: int, now: float) -> None:
        """Count ``amount`` in this calendar second."""
        self._roll(now)
        self._used += amount


class SlidingWindow:
    """Any :func:`sliding_span` seconds admit a :func:`burst` of the limit: what was
    counted in the last span, ``(now - span, now]``, plus ``amount`` must fit."""

    def __init__(self, per_minute: int) -> None:
        self._cap = burst(per_minute)
        self._span = sliding_span(per_minute)
        self._counted: deque[tuple[float, int]] = deque()
        self._total = 0

    def _forget(self, now: float) -> None:
        while self._counted and self._counted[0][0] <= now - self._span:
            self._total -= self._counted.popleft()[1]

    def fits(self, amount: int, now: float) -> bool:
        """Whether the last span plus ``amount`` stays within the burst."""
        self._forget(now)
        return self._total + amount <= self._cap

    def count(self, amount: int, now: float) -> None:
        """Remember ``amount`` at ``now`` for one span."""
        self._forget(now)
        self._counted.append((now, amount))
        self._total += amount


class TokenBucket:
    """A bucket of a :func:`burst`, full at first, refilled at ``per_minute / 60`` a
    second; a call takes its amount out."""

    def __init__(self, per_minute: int) -> None:
        self._capacity = float(burst(per_minute))
        self._rate = per_minute / 60
        self._level = self._capacity
        self._at: float | None = None

    def _refill(self, now: float) -> None:
        if self._at is not None and now > self._at:
            self._level = min(self._capacity, self._level + (now - self._at) * self._rate)
        self._at = now if self._at is None else max(self._at, now)

    def fits(self, amount: int, now: float) -> bool:
        """Whether the bucket holds ``amount`` now."""
        self._refill(now)
        return self._level >= amount

    def count(self, amount: int, now: float) -> None:
        """Take ``amount`` out of the bucket."""
        self._refill(now)
        self._level -= amount


COUNTERS: dict[str, Callable[[int], Counter]] = dict(
    zip(COUNTINGS, (CalendarSecond, SlidingWindow, TokenBucket), strict=True)
)


class RateWindows:
    """Per-model counts of calls and tokens, as a provider enforces its per-minute limits
    (each model has its own, as providers limit each model), counted the way
    ``counting`` names (the module doc); 0 means that limit is off."""

    def __init__(
        self, rpm: int, tpm: int, clock: Callable[[], float] = time.time, counting: str = "calendar"
    ) -> None:
        if counting not in COUNTERS:
            raise ValueError(f"counting must be one of {', '.join(COUNTINGS)}, got {counting!r}")
        self._rpm = rpm
        self._tpm = tpm
        self._clock = clock
        self._make = COUNTERS[counting]
        self._windows: dict[str, tuple[Counter | None, Counter | None]] = {}  # calls, tokens

    @property
    def active(self) -> bool:
        """Whether any limit is on."""
        return bool(self._rpm or self._tpm)

    def admit(self, tokens: int, model: str = "") -> bool:
        """Count a call of ``tokens`` to ``model`` if it fits both limits now; False (and
        nothing counted) if it is over either."""
        now = self._clock()
        window = self._windows.get(model)
        if window is None:
            if len(self._windows) >= MAX_RATE_MODELS:
                del self._windows[next(iter(self._windows))]
            window = self._windows[model] = (
                self._make(self._rpm) if self._rpm else None,
                self._make(self._tpm) if self._tpm else None,
            )
        calls, counted = window
        if calls is not None and not calls.fits(1, now):
            return False
        if counted is not None and not counted.fits(tokens, now):
            return False
        if calls is not None:
            calls.count(1, now)
        if counted is not None:
            counted.count(tokens, now)
        return True
