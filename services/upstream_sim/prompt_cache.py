"""The simulator's prompt cache: which prompt prefixes it has seen lately.

A call's *prefix* is every message content before its last one (a system prompt, a shared
document). With ``RELAY_SIM_CACHE_PREFIXES`` above 0 the simulator remembers that many
prefixes, least recently used dropped first, each for ``RELAY_SIM_CACHE_TTL_S`` seconds
after it was last seen; a call whose prefix it remembers reports the prefix's tokens as
read from the cache (OpenAI: ``usage.prompt_tokens_details.cached_tokens``; Anthropic:
``cache_read_input_tokens``, its ``input_tokens`` then the rest). So rows that share a
prefix and arrive close together get cache reads, and rows interleaved with many other
prefixes lose them, as with a provider's cache.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any


class PromptCache:
    """A bounded least-recently-used set of prefix digests with an idle lifetime."""

    def __init__(
        self, entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._entries = entries
        self._ttl_s = ttl_s
        self._clock = clock
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        self.reads = 0  # calls answered with cached tokens
        self.cached_tokens = 0
        self.prompt_tokens = 0  # of every call the cache looked at

    def cached(self, contents: Sequence[str], tokens_of: Callable[[str], int]) -> int:
        """The tokens (by ``tokens_of``) of the prefix of a call's message ``contents``
        when it was seen lately, else 0; either way the prefix is remembered (a call
        primes the cache for the next ones)."""
        prefix = contents[:-1]
        self.prompt_tokens += sum(tokens_of(c) for c in contents)
        if self._entries <= 0 or not prefix:
            return 0
        key = hashlib.blake2b("\x00".join(prefix).encode(), digest_size=16).digest()
        now = self._clock()
        seen = self._seen.pop(key, None)
        self._seen[key] = now
        while len(self._seen) > self._entries:
            self._seen.popitem(last=False)
        if seen is None or now - seen > self._ttl_s:
            return 0
        tokens = sum(tokens_of(c) for c in prefix)
        self.reads += 1
        self.cached_tokens += tokens
        return tokens

    def stats(self) -> dict[str, int]:
        """What ``GET /stats`` adds while the cache is on: calls with cache reads, cached
        and prompt tokens."""
        if self._entries <= 0:
            return {}
        return {
            "cache_reads": self.reads,
            "cached_tokens": self.cached_tokens,
            "cache_prompt_tokens": self.prompt_tokens,
        }

    def reset(self) -> None:
        """Forget every prefix and zero the counters."""
        self._seen.clear()
        self.reads = self.cached_tokens = self.prompt_tokens = 0


def openai_cached(payload: dict[str, Any], cached: int) -> None:
    """Note ``cached`` prompt tokens in a chat completion's usage."""
    payload["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}


def anthropic_cached(payload: dict[str, Any], cached: int) -> None:
    """Note ``cached`` prompt tokens in a Messages reply's usage (counted apart from
    ``input_tokens``, as the Messages API does)."""
    usage = payload["usage"]
    usage["input_tokens"] = max(0, usage["input_tokens"] - cached)
    usage["cache_read_input_tokens"] = cached
