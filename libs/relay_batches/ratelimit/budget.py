"""A worker's budget for one deployment (pure): the grants it received, spent by calls.

A grant counts from its slot (``Grant.at``) on, not from its arrival: until then it is
*pending* (:meth:`Budget.next_at` says when the next one starts, so the limiter wakes
then), so a call starts at the slot the leader spaced it at. Each grant's requests
expire with it (a grant not used within its few milliseconds is gone: nothing is banked
for a burst later).

:meth:`Budget.take` lets a call go when the budget holds a request (when requests are
limited) and some tokens (when tokens are limited), debiting one request and the call's
whole token estimate: tokens may go negative, a debt the next grants pay off (a call
bigger than one grant still goes, and the limit still holds on average). Positive token
balances expire with the newest grant; debts never do. :meth:`Budget.settle` corrects
the estimate by what the call counted.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque

from relay_batches.ratelimit.limits import RateLimit
from relay_batches.ratelimit.pacing import Grant


class Budget:
    """The requests and tokens one worker may still spend on one deployment."""

    def __init__(self, limit: RateLimit) -> None:
        self._by_requests = limit.rpm is not None
        self._by_tokens = limit.tpm is not None
        self._requests: deque[list[float]] = deque()  # [expires_at, requests left], in order
        self.tokens = 0
        self.expires_at = -math.inf
        self._pending: list[tuple[float, int, Grant]] = []  # a heap by slot
        self._order = itertools.count()

    @property
    def requests(self) -> int:
        """Requests on hand (whatever their expiry)."""
        return int(sum(left for _, left in self._requests))

    def add(self, grant: Grant, now: float) -> bool:
        """Add ``grant`` unless it has expired (pending until its slot); True if added."""
        if grant.expires_at <= now:
            return False
        if grant.at > now:
            heapq.heappush(self._pending, (grant.at, next(self._order), grant))
        else:
            self._credit(grant, now)
        return True

    def next_at(self) -> float | None:
        """When the next pending grant starts (None: none pending)."""
        return self._pending[0][0] if self._pending else None

    def held(self, now: float) -> int:
        """Calls this budget pays for now or soon (pending grants and requests on hand)."""
        self._activate(now)
        on_hand = self.requests if self._by_requests else int(self.tokens > 0)
        return len(self._pending) + on_hand

    def _credit(self, grant: Grant, now: float) -> None:
        self._expire(now)
        if grant.requests > 0:
            self._requests.append([grant.expires_at, grant.requests])
        self.tokens += grant.tokens
        self.expires_at = max(self.expires_at, grant.expires_at)

    def _activate(self, now: float) -> None:
        """The pending grants whose slot has come count now (unless already expired)."""
        while self._pending and self._pending[0][0] <= now:
            _, _, grant = heapq.heappop(self._pending)
            if grant.expires_at > now:
                self._credit(grant, now)

    def _expire(self, now: float) -> None:
        while self._requests and self._requests[0][0] <= now:
            self._requests.popleft()
        if now >= self.expires_at:
            self.tokens = min(self.tokens, 0)

    def ready(self, now: float) -> bool:
        """Whether a call could be taken now."""
        self._activate(now)
        self._expire(now)
        if self._by_requests and not self._requests:
            return False
        return not (self._by_tokens and self.tokens <= 0)

    def take(self, tokens: int, now: float) -> bool:
        """Debit one call of ``tokens`` estimated tokens if the budget allows it now."""
        if not self.ready(now):
            return False
        if self._by_requests:
            self._requests[0][1] -= 1
            if self._requests[0][1] <= 0:
                self._requests.popleft()
        if self._by_tokens:
            self.tokens -= tokens
        return True

    def give_back(self, tokens: int) -> None:
        """Undo a :meth:`take` of ``tokens`` whose call never went (it was cancelled)."""
        if self._by_requests:
            self._requests.appendleft([self.expires_at, 1])
        if self._by_tokens:
            self.tokens += tokens

    def settle(self, estimated: int, used: int) -> None:
        """The call counted ``used`` tokens where ``estimated`` were debited."""
        if self._by_tokens:
            self.tokens += estimated - used
