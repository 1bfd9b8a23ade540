"""The grant issuer's arithmetic for one deployment (pure: the clock is passed in).

A :class:`Pacer` accrues credit at ``fraction × limit / 60`` per second (requests and
tokens alike), counted in whole ticks of the wall clock's tenths of a second (so a tick
a few milliseconds late or early accrues the same), and hands out the whole units
accrued as a :class:`Grant`. Three bounds
keep the issue even within the minute:

- a call accrues at most :data:`MAX_GAP_TICKS` ticks' worth (a second), so an idle
  stretch banks nothing more that could come out as a burst (a late tick still gets its
  due), and the calendar-second quantum caps what any second gets;
- in a calendar second ``k`` no more than its quantum is issued, ``limit / 60`` with the
  remainder spread over the minute (:func:`quantum_of`: 90 rpm is 1, 2, 1, 2, … calls a
  second, 30 rpm one call every other second), as providers (and the simulator) enforce
  it, however the ticks jitter; credit held back by it is late, not lost (the keeper
  ticks in the middle of each tenth of a second, so a grant and its call land in the
  second it was issued);
- a grant expires :data:`GRANT_LIFETIME_S` after issue, and at the latest just before
  its calendar second ends: a worker cannot hoard it, and grants left in the queue
  while nobody consumed it cannot come out on top of the next second's;
- a new leader issues nothing for the rest of the second it won in
  (:meth:`Pacer.skip_second`): its predecessor may have issued all of it.

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
MAX_GAP_TICKS = 10  # a slow tick (late confirms) still gets a second's due
MIN_LIFE_S = 0.025  # a grant is not issued with less life left than this
SECOND_EDGE_S = 0.05  # a grant expires this long before its calendar second ends: a call it
# starts may reach the provider that much later (event-loop lag on a busy worker) and still
# land in the second it was issued for


def quantum_of(per_minute: int, second: int) -> int:
    """What calendar second ``second`` (Unix) may hold of ``per_minute``: ``per_minute /
    60`` with the remainder spread evenly, so any 60 consecutive seconds hold exactly
    ``per_minute``."""
    return (second + 1) * per_minute // 60 - second * per_minute // 60


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
    gets its due, an idle stretch banks nothing more), and credit never exceeds that
    plus one unit (a request, or one call's tokens): held back by the calendar-second
    quantum, it comes out a little late, never as a burst.
    """

    def __init__(self, per_minute: int, tick_s: float) -> None:
        self.per_minute = per_minute
        self.per_second = per_minute / 60
        self.peak = -(-per_minute // 60)  # the largest quantum of any second
        self.max_gap_s = tick_s * MAX_GAP_TICKS
        self.credit = 0.0

    def quantum(self, second: int) -> int:
        """The most calendar second ``second`` may be issued (:func:`quantum_of`)."""
        return quantum_of(self.per_minute, second)

    def accrue(self, fraction: float, elapsed: float, unit: int = 1) -> None:
        gained = fraction * self.per_second * min(elapsed, self.max_gap_s)
        most = self.per_second * self.max_gap_s + max(1, min(unit, self.peak))
        self.credit = min(self.credit + gained, most)

    def take(self, second: int, issued_in_window: int, unit: int = 1) -> int:
        unit = max(1, min(unit, self.peak))
        room = min(self.credit, self.quantum(second) - issued_in_window)
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
        if self._requests is not None:
            self._requests.accrue(self.fraction, ticks * self._tick_s)
        if self._tokens is not None:
            self._tokens.accrue(self.fraction, ticks * self._tick_s, tokens_per_call)
        second = math.floor(now)
        if now + SECOND_EDGE_S + MIN_LIFE_S >= second + 1.0:
            return None  # too late in the second: a grant would live too little to use
        if second != self._second:
            self._second, self._issued = second, (0, 0)
        requests = self._take(self._requests, second, self._issued[0])
        tokens = self._take(self._tokens, second, self._issued[1], tokens_per_call)
        if requests <= 0 and tokens <= 0:
            return None
        self._issued = (self._issued[0] + requests, self._issued[1] + tokens)
        return Grant(requests, tokens, self._expiry(now))

    def _expiry(self, now: float) -> float:
        """When a grant issued at ``now`` expires: after its lifetime, but never past
        its calendar second (less :data:`SECOND_EDGE_S`), so what is spent in a second
        was issued in it, whoever held it and however late they subscribed."""
        return max(now, min(now + self._lifetime_s, math.floor(now) + 1.0 - SECOND_EDGE_S))

    def skip_second(self, now: float) -> None:
        """Issue nothing more in ``now``'s calendar second (a new leader: its
        predecessor may have issued the whole quantum of it already)."""
        self._second = second = math.floor(now)
        self._issued = (
            0 if self._requests is None else self._requests.quantum(second),
            0 if self._tokens is None else self._tokens.quantum(second),
        )

    @staticmethod
    def _take(
        dimension: _Dimension | None, second: int, issued_in_window: int, unit: int = 1
    ) -> int:
        return 0 if dimension is None else dimension.take(second, issued_in_window, unit)

    def throttled(self, now: float, retry_after: float | None) -> bool:
        """A call got a 429 (or a Retry-After): decrease at most once per second; a
        Retry-After over a second pauses issuing until then (at most a minute).
        Whether it changed the pacer: a decrease, or a pause longer by over
        :data:`DECREASE_EVERY_S` (only such a throttle is worth telling other workers)."""
        self._advance(now)
        changed = now - self._last_decrease >= DECREASE_EVERY_S
        if changed:
            self.fraction = max(F_MIN, self.fraction * DECREASE)
            self._last_decrease = now
        if retry_after is not None and retry_after > 1.0:
            until = now + min(retry_after, MAX_PAUSE_S)
            changed = changed or until > self._paused_until + DECREASE_EVERY_S
            self._paused_until = max(self._paused_until, until)
            for dimension in (self._requests, self._tokens):
                if dimension is not None:
                    dimension.reset()
        return changed

    def restart(self, now: float) -> None:
        """A new leader: nothing more in ``now``'s second (:meth:`skip_second`), and no
        credit from before the next one (the time until then was another leader's)."""
        self._last_slot = math.floor((math.floor(now) + 1.0) / self._tick_s + 0.5) - 1
        for dimension in (self._requests, self._tokens):
            if dimension is not None:
                dimension.reset()
        self.skip_second(now)
