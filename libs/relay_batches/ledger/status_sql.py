"""Statuses written into SQL text as constants, for scans that must use a partial index.

Guarded updates take statuses as parameters. A scan that finds work by status (queued
jobs, expired leases, due templates, unannounced ends, expired claims) instead names
them as constants: the planner can only use a partial index such as ``WHERE status =
'queued'`` when it can prove the predicate, which a parameter hides from a generic plan.
The constants are rendered from the enums, so the model stays their only source.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum

_PLAIN = re.compile(r"^[a-z_]+$")


def status_in(statuses: Iterable[StrEnum]) -> str:
    """``status IN ('a', 'b')`` for ``statuses``, in their enum's order."""
    return column_in("status", statuses)


def column_in(column: str, statuses: Iterable[StrEnum]) -> str:
    """``<column> IN ('a', 'b')`` for ``statuses``, in their enum's order (one value is
    an equality to the planner, so it matches ``status = 'a'`` index predicates)."""
    wanted = set(statuses)
    if not wanted:
        raise ValueError("no statuses to match")
    enum = type(next(iter(wanted)))
    values = [s.value for s in enum if s in wanted]
    if any(not _PLAIN.match(v) for v in values):
        raise ValueError(f"status values must be plain words: {values}")
    return f"{column} IN ({', '.join(repr(v) for v in values)})"
