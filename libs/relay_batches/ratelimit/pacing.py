"""The grant issuer's arithmetic for one deployment (pure: the clock is passed in).

A :class:`Pacer` accrues credit at ``fraction × limit / 60`` per second (requests and
tokens alike), counted in whole ticks of the wall clock's tenths of a second (so a tick
a few milliseconds late or early accrues the same), and hands out the whole units
accrued as a :class:`Grant`. Three bounds
keep the issue even within the minute:

- a call accrues at most two ticks' worth, so an idle stretch banks nothing that could
  come out as a burst (a late tick still gets its due);
- in any calendar second no more than ``limit / 60`` (at least 1) is issued: the
  quantum providers enforce (per calendar second, as the simulator does), however the
  ticks jitter; credit held back by it is late, not lost (the keeper ticks in the middle
  of each tenth of a second, so a grant and its call land in the second it was issued);
- a grant expires :data:`GRANT_LIFETIME_S` after issue: a worker cannot hoard it.

AIMD (shared by every worker through ``ratelimit.throttled`` events):
:meth:`Pacer.throttled` multiplies the fraction by :data:`DECREASE` at most once per
second (one congestion event per second, as TCP per round trip); a ``Retry-After``
longer than a second also stops issuing until then (at most :data:`MAX_PAUSE_S`). The
fraction grows back by :data:`INCREASE_PER_S` per second, up to 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from relay_batches.ratelimit.limits import RateLimit

TICK_S = 0.1
GRANT_LIFETIME_S = 0.5
F_MIN = 0.05
DECREASE = 0.8
INCREASE_PER_S = 0.05
DECREASE_EVERY_S = 1.0
MAX_PAUSE_S = 60.0
MAX_GAP_TICKS = 2


@dataclass(frozen=True, slots=True)
class Grant:
    """Budget for one worker: ``requests`` calls and ``tokens`` tokens, usable until
    ``expires_at`` (Unix seconds)."""

    requests: int
    tokens: int
    expires_at: float


class _Dimension:
    """Credit of one dimension (requests or tokens) at ``per_minute``.

    Each call accrues at most :data:`MAX_GAP_TICKS` ticks' worth (a late tick still
    gets its due, an idle stretch banks nothing more); what is left after a grant is
    under one unit, unless the calendar-second quantum held some back: that credit is
    only late, not banked, and is kept (up to one quantum) so the minute comes out whole.
    """

    def __init__(self, per_minute: int, tick_s: float) -> None:
        self.per_second = per_minute / 60
        self.quantum = max(1, per_minute // 60)  # at most this much per trailing second
        self.max_gap_s = tick_s * MAX_GAP_TICKS
        self.credit = 0.0

    def accrue(self, fraction: float, elapsed: float) -> None:
        gained = fraction * self.per_second * min(elapsed, self.max_gap_s)
        self.credit = min(self.credit + gained, self.quantum + self.per_second * self.max_gap_s)

    def take(self, issued_in_window: int, unit: int = 1) -> int:
        unit = max(1, min(unit, self.quantum))
        room = min(self.credit, self.quantum - issued_in_window)
        amount = max(0, math.floor(room / unit) * unit)
        self.credit -= amount
        return amount

    def reset(self) -> None:
        self.credit = 0.0


class Pacer:
    """Issues one deployment's grants at ``fraction × limit`` (see the module doc)."""

    def __init__(
        self, limit: RateLimit, tick_s: float = TICK_S, lifetime_s: float = GRANT_LIFETIME_S
    ) -> None:
        self.limit = limit
        self.fraction = 1.0
        self._lifetime_s = lifetime_s
        self._requests = None if limit.rpm is None else _Dimension(limit.rpm, tick_s)
        self._tokens = None if limit.tpm is None else _Dimension(limit.tpm, tick_s)
        self._tick_s = tick_s
        self._last: float | None = None
        self._last_slot: int | None = None
        self._last_decrease = -math.inf
        self._paused_until = -math.inf
        self._second = -1  # the calendar second of the grants counted in ``_issued``
        self._issued = (0, 0)  # requests and tokens issued in that second

    def _advance(self, now: float) -> None:
        """Move the clock to ``now``: the additive increase of the time elapsed."""
        elapsed = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now if self._last is None else max(self._last, now)
        self.fraction = min(1.0, self.fraction + INCREASE_PER_S * elapsed)

    def issue(self, now: float, tokens_per_call: int = 1) -> Grant | None:
        """The whole requests and tokens accrued since the last call, or None; tokens
        in whole multiples of ``tokens_per_call`` (a typical call's estimate, at most
        the quantum), so a grant pays for whole calls: a grant of a fraction of a call
        lets some worker start one on credit, and a few workers doing so at once put a
        second over the provider's quantum."""
        self._advance(now)
        slot = math.floor(now / self._tick_s)  # accrue by whole ticks: jitter changes nothing
        ticks = 0 if self._last_slot is None else max(0, slot - self._last_slot)
        self._last_slot = slot if self._last_slot is None else max(self._last_slot, slot)
        if now < self._paused_until:
            return None
        for dimension in (self._requests, self._tokens):
            if dimension is not None:
                dimension.accrue(self.fraction, ticks * self._tick_s)
        second = math.floor(now)
        if second != self._second:
            self._second, self._issued = second, (0, 0)
        requests = self._take(self._requests, self._issued[0])
        tokens = self._take(self._tokens, self._issued[1], tokens_per_call)
        if requests <= 0 and tokens <= 0:
            return None
        self._issued = (self._issued[0] + requests, self._issued[1] + tokens)
        return Grant(requests, tokens, now + self._lifetime_s)

    @staticmethod
    def _take(dimension: _Dimension | None, issued_in_window: int, unit: int = 1) -> int:
        return 0 if dimension is None else dimension.take(issued_in_window, unit)

    def throttled(self, now: float, retry_after: float | None) -> None:
        """A call got a 429 (or a Retry-After): decrease at most once per second; a
        Retry-After over a second pauses issuing until then (at most a minute)."""
        self._advance(now)
        if now - self._last_decrease >= DECREASE_EVERY_S:
            self.fraction = max(F_MIN, self.fraction * DECREASE)
            self._last_decrease = now
        if retry_after is not None and retry_after > 1.0:
            pause = min(retry_after, MAX_PAUSE_S)
            self._paused_until = max(self._paused_until, now + pause)
            for dimension in (self._requests, self._tokens):
                if dimension is not None:
                    dimension.reset()
