"""What one simulator remembers between calls: its counters (``GET /stats``), the
fail-first counts, the error-rate dice and the calls in flight."""

from __future__ import annotations

import asyncio
import random

from relay_batches.services.upstream_sim.answers import AnswerCounts
from relay_batches.services.upstream_sim.prompt_cache import PromptCache


class SimState:
    """Call counters, fail-first counters and the error-rate dice of one simulator."""

    def __init__(self, seed: int | None = None, prompt_cache: PromptCache | None = None) -> None:
        self._seed = seed
        # Prefixes seen lately (none remembered by default: no cache reads).
        self.prompt_cache = prompt_cache or PromptCache(0, 0.0)
        self._rng = random.Random(seed)
        self._failures: dict[str, int] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self.calls = 0
        self.ok = 0
        self.errors = 0
        self.throttled = 0  # of errors: 429s of the rate limits (RateWindows)
        self.in_flight = 0
        self.batches_created = 0  # provider batches, both APIs
        self.batch_rows = 0  # lines / requests submitted in them
        self.batch_rows_repeated = 0  # of those: custom_ids submitted in an earlier batch
        self._batch_ids: set[str] = set()
        self.answers = AnswerCounts()  # calls begun and answered per request
        self.flex_calls = 0  # calls asking for the flex lane
        self.flex_refused = 0  # of those: refused with 429 (capacity short)

    def stats(self) -> dict[str, int]:
        """The counters served by ``GET /stats``."""
        return {
            "calls": self.calls,
            "ok": self.ok,
            "errors": self.errors,
            "throttled": self.throttled,
            "batches_created": self.batches_created,
            "batch_rows": self.batch_rows,
            "batch_rows_repeated": self.batch_rows_repeated,
            "flex_calls": self.flex_calls,
            "flex_refused": self.flex_refused,
            **self.prompt_cache.stats(),
        }

    def count_batch(self, rows: int, custom_ids: set[str]) -> None:
        """Count a provider batch of ``rows`` lines and the ``custom_ids`` it submits
        that an earlier batch already submitted."""
        self.batches_created += 1
        self.batch_rows += rows
        self.batch_rows_repeated += len(custom_ids & self._batch_ids)
        self._batch_ids |= custom_ids

    def reset(self) -> None:
        """Zero every counter, forget fail-first contents and re-seed the dice."""
        self.calls = self.ok = self.errors = self.throttled = 0
        self.batches_created = self.batch_rows = self.batch_rows_repeated = 0
        self.flex_calls = self.flex_refused = 0
        self._batch_ids.clear()
        self.answers.reset()
        self.prompt_cache.reset()
        self._failures.clear()
        self._rng = random.Random(self._seed)

    def refuse_flex(self, share: float) -> bool:
        """Count a flex call; True when it is one of the ``share`` refused (spread
        evenly: the n-th call is refused when ``n * share`` crosses a whole number)."""
        self.flex_calls += 1
        refused = int(self.flex_calls * share) > int((self.flex_calls - 1) * share)
        self.flex_refused += refused
        return refused

    @property
    def tracked_contents(self) -> int:
        """How many distinct contents the fail-first counters remember."""
        return len(self._failures)

    def take_failure(self, key: str, limit: int) -> bool:
        """True if this call is one of the first ``limit`` calls for ``key`` (and count it)."""
        seen = self._failures.get(key, 0)
        if seen >= limit:
            return False
        self._failures[key] = seen + 1
        return True

    def roll(self) -> float:
        """A uniform number in [0, 1) from the (optionally seeded) dice."""
        return self._rng.random()

    def enter(self) -> None:
        """Count a call and mark it in flight."""
        self.calls += 1
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        """Mark a call (answered or cancelled) as no longer in flight."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no call is in flight."""
        await self._idle.wait()
