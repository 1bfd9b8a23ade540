"""Per-process cooldown of deployments that fail repeatedly.

A deployment with ``threshold`` transient failures within ``window_s`` is skipped for
``cooldown_s``: rows go straight to the next deployment of their alias. When the
cooldown ends the deployment is tried again (a success clears its failure history).
If every deployment of an alias is cooling down, rows still try them in order: a
cooldown reroutes traffic, it never fails a row by itself.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from relay_batches.metrics import UPSTREAM_COOLDOWN_ACTIVE, UPSTREAM_COOLDOWNS

Clock = Callable[[], float]


@dataclass(frozen=True)
class CooldownPolicy:
    """When a deployment cools down, and for how long."""

    threshold: int = 5
    window_s: float = 10.0
    cooldown_s: float = 30.0


class Cooldowns:
    """Failure history and cooldown deadlines of every deployment this process used."""

    def __init__(self, policy: CooldownPolicy, clock: Clock = time.monotonic) -> None:
        self._policy = policy
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._until: dict[str, float] = {}

    def any_cooling(self) -> bool:
        """Whether any deployment may be cooling down (False: none is, a fast path)."""
        return bool(self._until)

    def cooling(self, deployment: str) -> bool:
        """True while ``deployment`` is in its cooldown period."""
        until = self._until.get(deployment)
        if until is None:
            return False
        if self._clock() >= until:
            del self._until[deployment]
            UPSTREAM_COOLDOWN_ACTIVE.labels(deployment).set(0)
            return False
        return True

    def record_failure(self, deployment: str) -> bool:
        """Note a transient failure; return True if it started a cooldown."""
        now = self._clock()
        history = self._failures.setdefault(deployment, deque())
        history.append(now)
        while history and history[0] <= now - self._policy.window_s:
            history.popleft()
        if len(history) < self._policy.threshold or self.cooling(deployment):
            return False
        history.clear()
        self._until[deployment] = now + self._policy.cooldown_s
        UPSTREAM_COOLDOWNS.labels(deployment).inc()
        UPSTREAM_COOLDOWN_ACTIVE.labels(deployment).set(1)
        return True

    def record_success(self, deployment: str) -> None:
        """A success forgets the deployment's recent failures."""
        history = self._failures.get(deployment)
        if history:
            history.clear()
