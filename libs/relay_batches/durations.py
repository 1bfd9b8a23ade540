"""Durations written as ``<n>s``, ``<n>m``, ``<n>h`` or ``<n>d``: one grammar for a
batch's ``completion_window`` and for settings such as ``RELAY_RETENTION``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

UNITS: Mapping[str, int] = {"s": 1, "m": 60, "h": 3600, "d": 86400}
SPELLING = "<n>s, <n>m, <n>h or <n>d"


def parse_duration(text: str, max_digits: int) -> timedelta | None:
    """``text`` as a duration, or None when it is not one.

    ``n`` is at most ``max_digits`` ASCII digits, without sign or surrounding space,
    followed by one unit letter (lower case).
    """
    digits, unit = text[:-1], UNITS.get(text[-1:])
    if unit is None or not (digits.isascii() and digits.isdigit()) or len(digits) > max_digits:
        return None
    return timedelta(seconds=int(digits) * unit)


def format_duration(value: timedelta) -> str:
    """``value`` in the grammar, in the largest unit that holds it whole (``7d``, ``90m``)."""
    seconds = int(value.total_seconds())
    for unit, size in sorted(UNITS.items(), key=lambda item: -item[1]):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
