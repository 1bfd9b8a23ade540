"""Rows grouped by shared prefix, so a provider's prompt cache sees them together.

Providers cache a prompt's leading tokens (a system prompt, a shared document): a row
sent soon after another with the same prefix reads it from the cache, at the cached rate.
Rows interleaved with rows of other prefixes lose that. :func:`grouped` gathers a
bounded run of rows (one release of a dispatcher, one page of a provider batch's input)
by the opening of their stored request text, its first :data:`PREFIX_CHARS` characters
(a system prompt's, a document's): rows of one opening become adjacent, each group where
its first row was, and rows keep their order within it. No decoding, no query. Rows that
share no opening keep the job's order, so the rows a user put first still start first
(a sort would reorder them alphabetically, for no cache gain). Grouping is per run, never
across the whole job, so memory stays what the run already holds.
``RELAY_PREFIX_GROUPING=off`` keeps the stored order (to measure what grouping gains).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

PREFIX_CHARS = 64  # of a row's request text that make its group (its opening)
GROUPING = ("on", "off")


def grouped(rows: Sequence[T], text_of: Callable[[T], str]) -> list[T]:
    """``rows`` with those whose request text opens alike (its first
    :data:`PREFIX_CHARS` characters) adjacent: groups in the order of their first row,
    rows in their order within each."""
    groups: dict[str, list[T]] = {}
    for row in rows:
        groups.setdefault(text_of(row)[:PREFIX_CHARS], []).append(row)
    return [row for group in groups.values() for row in group]
