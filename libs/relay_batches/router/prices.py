"""A deployment's price in the routes file: USD per million prompt, completion and cached
prompt tokens, and what one answer's tokens cost at it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from relay_batches.settings import ConfigError

PRICE_KEYS = ("prompt_per_mtok", "completion_per_mtok", "cached_prompt_per_mtok")
TOKENS_PER_MTOK = 1_000_000


@dataclass(frozen=True, slots=True)
class Price:
    """What a deployment's tokens cost: USD per million prompt and completion tokens, and
    per million prompt tokens read from the provider's prompt cache (None: the prompt
    rate, no discount)."""

    prompt_per_mtok: float = 0.0
    completion_per_mtok: float = 0.0
    cached_prompt_per_mtok: float | None = None

    @property
    def cached_rate(self) -> float:
        """USD per million cached prompt tokens (the prompt rate when none is declared)."""
        cached = self.cached_prompt_per_mtok
        return self.prompt_per_mtok if cached is None else cached

    def cost_usd(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """The cost of one answer's tokens, in USD: ``cached_tokens`` (of ``prompt_tokens``,
        read from the prompt cache) at the cached rate, the other prompt tokens at the
        prompt rate."""
        cached = max(0, min(cached_tokens, prompt_tokens))
        return (
            (prompt_tokens - cached) * self.prompt_per_mtok
            + cached * self.cached_rate
            + completion_tokens * self.completion_per_mtok
        ) / TOKENS_PER_MTOK


def parse_price(name: str, value: Any, where: str) -> Price | None:
    """``price = { prompt_per_mtok = …, completion_per_mtok = … }``: non-negative finite
    USD per million tokens, a key left out is 0; None when the deployment has no price."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(
            where + f"deployment {name!r}: price must be a table such as"
            " { prompt_per_mtok = 0.15, completion_per_mtok = 0.60 }"
        )
    for key in value:
        if key not in PRICE_KEYS:
            raise ConfigError(
                where + f"deployment {name!r}: price.{key} is not a price key"
                f" (expected {', '.join(PRICE_KEYS[:-1])} or {PRICE_KEYS[-1]})"
            )
    rates = [value.get(key, 0.0) for key in PRICE_KEYS[:2]] + [value.get(PRICE_KEYS[2])]
    for key, rate in zip(PRICE_KEYS, rates, strict=True):
        if rate is None:  # no cached rate: cached tokens cost the prompt rate
            continue
        if (
            isinstance(rate, bool)
            or not isinstance(rate, int | float)
            or not math.isfinite(rate)
            or rate < 0
        ):
            raise ConfigError(
                where + f"deployment {name!r}: price.{key} must be a non-negative number"
                " (USD per million tokens)"
            )
    cached = None if rates[2] is None else float(rates[2])
    return Price(float(rates[0]), float(rates[1]), cached)
