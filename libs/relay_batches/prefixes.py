"""Rows grouped by shared prefix, so a provider's prompt cache sees them together.

Providers cache a prompt's leading tokens (a system prompt, a shared document): a row
sent soon after another with the same prefix reads it from the cache, at the cached rate.
Rows interleaved with rows of other prefixes lose that. :func:`grouped` orders a bounded
run of rows (one release of a dispatcher, one page of a provider batch's input) by their
stored request text, so rows sharing a leading run of it are adjacent: a stable sort on
the first :data:`PREFIX_CHARS` characters, no decoding, no query. Grouping is per run,
never across the whole job, so memory stays what the run already holds.
``RELAY_PREFIX_GROUPING=off`` keeps the stored order (to measure what grouping gains).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

PREFIX_CHARS = 4096  # of a row's request text compared: bounds a sort's cost per row
GROUPING = ("on", "off")


def grouped(rows: Sequence[T], text_of: Callable[[T], str]) -> list[T]:
    """``rows`` ordered so those whose request text starts alike are adjacent (a stable
    sort on the text's first :data:`PREFIX_CHARS` characters: rows of one prefix keep
    their order)."""
    return sorted(rows, key=lambda row: text_of(row)[:PREFIX_CHARS])
