"""A worker's budget for one deployment (pure): the grants it received, spent by calls.

:meth:`Budget.take` lets a call go when the budget holds a request (when requests are
limited) and some tokens (when tokens are limited), debiting one request and the call's
whole token estimate: tokens may go negative, a debt the next grants pay off (a call
bigger than one grant still goes, and the limit still holds on average). Positive
balances expire with the newest grant (no banking, so no burst later); debts never do.
:meth:`Budget.settle` corrects the estimate by what the call counted.
"""

from __future__ import annotations

import math

from relay_batches.ratelimit.limits import RateLimit
from relay_batches.ratelimit.pacing import Grant


class Budget:
    """The requests and tokens one worker may still spend on one deployment."""

    def __init__(self, limit: RateLimit) -> None:
        self._by_requests = limit.rpm is not None
        self._by_tokens = limit.tpm is not None
        self.requests = 0
        self.tokens = 0
        self.expires_at = -math.inf

    def add(self, grant: Grant, now: float) -> bool:
        """Add ``grant`` unless it has expired; True if it was added."""
        if grant.expires_at <= now:
            return False
        self._expire(now)
        self.requests += grant.requests
        self.tokens += grant.tokens
        self.expires_at = max(self.expires_at, grant.expires_at)
        return True

    def _expire(self, now: float) -> None:
        if now >= self.expires_at:
            self.requests = min(self.requests, 0)
            self.tokens = min(self.tokens, 0)

    def ready(self, now: float) -> bool:
        """Whether a call could be taken now."""
        self._expire(now)
        if self._by_requests and self.requests < 1:
            return False
        return not (self._by_tokens and self.tokens <= 0)

    def take(self, tokens: int, now: float) -> bool:
        """Debit one call of ``tokens`` estimated tokens if the budget allows it now."""
        if not self.ready(now):
            return False
        if self._by_requests:
            self.requests -= 1
        if self._by_tokens:
            self.tokens -= tokens
        return True

    def give_back(self, tokens: int) -> None:
        """Undo a :meth:`take` of ``tokens`` whose call never went (it was cancelled)."""
        if self._by_requests:
            self.requests += 1
        if self._by_tokens:
            self.tokens += tokens

    def settle(self, estimated: int, used: int) -> None:
        """The call counted ``used`` tokens where ``estimated`` were debited."""
        if self._by_tokens:
            self.tokens += estimated - used
