"""The routes file's lane keys of a deployment (see :mod:`relay_batches.lanes`).

- ``service_tier = "flex"`` (OpenAI-compatible deployments only): the flex lane. Every
  call carries ``service_tier: "flex"``; the provider answers at (about) the batch price
  and may refuse with 429 when capacity is short, which the router takes as "try the
  next lane" (no retry, no cooldown).
- ``rows_per_s``: the throughput the planner may count on for this deployment (flex or
  realtime) when its rate limits do not say it; measured throughput is used otherwise.
- ``turnaround`` (batch deployments): the expected time from submit to results, before
  any provider batch of it has finished (then the learned one is used); at most its
  ``window``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from relay_batches.durations import SPELLING, parse_duration
from relay_batches.settings import ConfigError

FLEX = "flex"
SERVICE_TIERS = (FLEX,)


def service_tier(name: str, provider: str, spec: dict[str, Any], where: str) -> str | None:
    """``service_tier``: ``"flex"`` on an OpenAI-compatible realtime deployment, else
    absent."""
    value = spec.get("service_tier")
    if value is None:
        return None
    if value not in SERVICE_TIERS:
        raise ConfigError(
            where + f"deployment {name!r}: service_tier must be 'flex', not {value!r}"
        )
    if provider != "openai":
        raise ConfigError(
            where + f"deployment {name!r}: service_tier is only for OpenAI-compatible"
            " (provider = 'openai') deployments"
        )
    return str(value)


def rows_per_s(name: str, spec: dict[str, Any], where: str) -> float | None:
    """``rows_per_s``: a positive number, or absent."""
    value = spec.get("rows_per_s")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(
            where + f"deployment {name!r}: rows_per_s must be a number greater than 0"
        )
    return float(value)


def turnaround(name: str, spec: dict[str, Any], window: timedelta, where: str) -> timedelta:
    """``turnaround``: a positive duration no longer than ``window``; half of the
    window when absent."""
    value = spec.get("turnaround")
    if value is None:
        return window / 2
    found = parse_duration(value, 6) if isinstance(value, str) else None
    if found is None or found <= timedelta(0) or found > window:
        raise ConfigError(
            where + f"deployment {name!r}: turnaround must be a duration ({SPELLING}) no"
            f" longer than its window, not {value!r}"
        )
    return found
