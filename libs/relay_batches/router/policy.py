"""Retry policy: which failures retry, and exponential backoff with full jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

RETRYABLE_STATUSES = frozenset({408, 409, 429})


def is_retryable_status(status: int) -> bool:
    """408, 409, 429 and every 5xx are worth retrying; other statuses are not."""
    return status in RETRYABLE_STATUSES or 500 <= status <= 599


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (seconds or HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now = now or datetime.now(UTC)
    return max(0.0, (when - now).total_seconds())


@dataclass(frozen=True)
class BackoffPolicy:
    """Exponential backoff with full jitter: ``uniform(0, min(cap, base * 2**n))``."""

    base_s: float = 0.05
    cap_s: float = 5.0

    def delay(self, retry: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Delay before retry number ``retry`` (0-based); ``Retry-After`` wins, capped."""
        if retry_after is not None:
            return min(self.cap_s, retry_after)
        ceiling = min(self.cap_s, self.base_s * (2**retry))
        return rng.uniform(0.0, ceiling)
