"""The grant issuer's arithmetic for one deployment (pure: the clock is passed in).

A :class:`Pacer` keeps a schedule of *slots*, one call each, spaced evenly at
``fraction × (1 - MARGIN) × limit`` (requests and tokens alike: a slot pays for a request
and a typical call's tokens, and the scarcer limit spaces them), and each tick hands out
the slots due before the next tick's, :data:`LEAD_S` ahead of their time, as
:class:`Grant`\\ s stamped with it (``at``). A worker starts a call on a grant at its slot,
not when the grant arrives, and not later than :data:`LATE_S` after it (it expires then):
so the calls reach the provider spaced as the slots are, whatever the delivery took, and
*no* window of a second, however the provider places it, sees more than the limit:

- a calendar second (the provider resets its count each second) and a sliding second
  (any second, wherever it starts) hold at most ``limit / 60`` slots, with
  :data:`MARGIN` of a second to spare for calls a little late (a call late by under
  ``MARGIN`` seconds still falls in a second with room for it); measured without it,
  three workers met 429s against a sliding window;
- a token bucket holding a second's worth never runs dry at an even rate under its refill.

Bounds that keep the schedule honest:

- a slot is never issued less than :data:`MIN_LEAD_S` ahead (so it reaches a worker in
  time), and the schedule never goes back: an idle stretch banks nothing, the next slot
  comes a spacing after the last or :data:`MIN_LEAD_S` from now, whichever is later;
- in a calendar second ``k`` no more than its quantum is issued, ``limit / 60`` with the
  remainder spread over the minute (:func:`quantum_of`: 90 rpm is 1, 2, 1, 2, … calls a
  second), and no slot falls in its last :data:`LATE_S` (a late call still lands in it):
  such a slot moves to the start of the next second;
- past :data:`~relay_batches.bus.topology.GRANT_MESSAGES_PER_TICK` slots a tick (12,000
  rpm) a slot carries several calls (they start together, a few milliseconds late);
- a new leader issues nothing before the next second, nor before every slot its
  predecessor can have issued (:meth:`Pacer.restart`).

AIMD (shared by every worker through ``ratelimit.throttled`` events):
:meth:`Pacer.throttled` multiplies the fraction by :data:`DECREASE` at most once per
second (one congestion event per second, as TCP per round trip); a ``Retry-After``
longer than a second also stops issuing until then (at most :data:`MAX_PAUSE_S`). The
fraction grows back by :data:`INCREASE_PER_S` per second, up to 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from relay_batches.bus.topology import GRANT_MESSAGES_PER_TICK
from relay_batches.ratelimit.limits import RateLimit

TICK_S = 0.1
LEAD_S = 0.2  # slots are issued up to this far (plus a tick) ahead of their time
MIN_LEAD_S = 0.05  # and never less than this ahead: a worker has them before their time
LATE_S = 0.03  # a grant expires this long after its slot: a late call is at most this late
MARGIN = 0.03  # of the limit left unissued: calls late by under MARGIN seconds stay within
F_MIN = 0.05
DECREASE = 0.8
INCREASE_PER_S = 0.05
DECREASE_EVERY_S = 1.0
MAX_PAUSE_S = 60.0


def quantum_of(per_minute: int, second: int) -> int:
    """What calendar second ``second`` (Unix) may hold of ``per_minute``: ``per_minute /
    60`` with the remainder spread evenly, so any 60 consecutive seconds hold exactly
    ``per_minute``."""
    return (second + 1) * per_minute // 60 - second * per_minute // 60


@dataclass(frozen=True, slots=True)
class Grant:
    """Budget for one worker: ``requests`` calls and ``tokens`` tokens, to start at
    ``at`` (0: at once) and usable until ``expires_at`` (Unix seconds)."""

    requests: int
    tokens: int
    expires_at: float
    at: float = 0.0


class Pacer:
    """Issues one deployment's grants, slot by slot, at ``fraction × (1 - MARGIN) ×
    limit`` (see the module doc)."""

    def __init__(self, limit: RateLimit, tick_s: float = TICK_S) -> None:
        self.limit = limit
        self.fraction = 1.0
        self._tick_s = tick_s
        self._rps = None if limit.rpm is None else limit.rpm / 60
        self._tps = None if limit.tpm is None else limit.tpm / 60
        # Calls a slot carries: past GRANT_MESSAGES_PER_TICK slots a tick, several.
        per_tick = (self._rps or 0.0) * tick_s
        self._calls = max(1, math.ceil(per_tick / GRANT_MESSAGES_PER_TICK))
        self._last: float | None = None
        self._last_decrease = -math.inf
        self._paused_until = -math.inf
        self._next = -math.inf  # the schedule's next slot
        self._issued: dict[int, tuple[int, int]] = {}  # second -> requests, tokens issued

    def _advance(self, now: float) -> None:
        """Move the clock to ``now``: the additive increase of the time elapsed."""
        elapsed = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now if self._last is None else max(self._last, now)
        self.fraction = min(1.0, self.fraction + INCREASE_PER_S * elapsed)

    def _slot_tokens(self, tokens_per_call: int) -> int:
        """A slot's tokens: its calls' typical estimate (at most a second's quantum); with
        none known, a request's share of the tokens, or a tick's worth."""
        if self._tps is None:
            return 0
        if tokens_per_call >= 1:
            unit = float(tokens_per_call)
        elif self._rps is not None:
            unit = self._tps / self._rps
        else:
            unit = self._tps * self._tick_s
        return max(1, min(round(unit * self._calls), math.ceil(self._tps)))

    def spacing(self, requests: int, tokens: int) -> float:
        """Seconds from a slot of ``requests`` and ``tokens`` to the next one: what the
        scarcer limit earns them in, at ``fraction × (1 - MARGIN)``."""
        rate = self.fraction * (1.0 - MARGIN)
        by_requests = 0.0 if self._rps is None else requests / (rate * self._rps)
        by_tokens = 0.0 if self._tps is None else tokens / (rate * self._tps)
        return max(by_requests, by_tokens, 1e-6)

    def issue(self, now: float, tokens_per_call: int = 1) -> list[Grant]:
        """The slots due before the next tick's (:data:`LEAD_S` ahead), a grant each;
        tokens in whole typical calls of ``tokens_per_call``, so a grant pays for whole
        calls (a grant of a fraction of one lets a worker start a call on credit)."""
        self._advance(now)
        if now < self._paused_until:
            return []
        requests = 0 if self._rps is None else self._calls
        tokens = self._slot_tokens(tokens_per_call)
        horizon = now + LEAD_S + self._tick_s
        at = max(self._next, now + MIN_LEAD_S)
        grants: list[Grant] = []
        while True:
            at = self._fit(at, requests, tokens)
            if at >= horizon:
                break
            second = math.floor(at)
            issued = self._issued.get(second, (0, 0))
            self._issued[second] = (issued[0] + requests, issued[1] + tokens)
            grants.append(Grant(requests, tokens, at + LATE_S, at))
            at += self.spacing(requests, tokens)
        self._next = at
        for second in [s for s in self._issued if s < math.floor(now)]:
            del self._issued[second]
        return grants

    def _fit(self, at: float, requests: int, tokens: int) -> float:
        """``at``, or the start of the first later second whose quantum has room for the
        slot and whose end is not within :data:`LATE_S` of it."""
        for _ in range(3):  # a slot too big for a second's quantum goes out anyway
            second = math.floor(at)
            issued_requests, issued_tokens = self._issued.get(second, (0, 0))
            fits = (
                at + LATE_S < second + 1.0
                and (self._rps is None or issued_requests + requests <= self._quantum(second))
                and (self._tps is None or issued_tokens + tokens <= self._quantum(second, True))
            )
            if fits:
                return at
            at = second + 1.0
        return at

    def _quantum(self, second: int, tokens: bool = False) -> int:
        limit = self.limit.tpm if tokens else self.limit.rpm
        return 0 if limit is None else quantum_of(limit, second)

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
            self._next = max(self._next, self._paused_until)
        return changed

    def restart(self, now: float) -> None:
        """A new leader: its first slot comes after the next second starts and after every
        slot a predecessor can have issued (up to a tick and :data:`LEAD_S` ahead), a
        spacing later, so the slots of the two stay spaced."""
        requests = 0 if self._rps is None else self._calls
        after = now + LEAD_S + self._tick_s + self.spacing(requests, self._slot_tokens(0))
        self._next = max(math.floor(now) + 1.0, after)
        self._issued.clear()
