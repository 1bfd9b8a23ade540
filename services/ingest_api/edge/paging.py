"""The ``limit`` query parameter of every list endpoint, on every surface."""

from __future__ import annotations

from relay_batches.errors import invalid


def page_limit(raw: str | None, default: int, maximum: int, name: str = "limit") -> int:
    """``raw`` as a page size from 1 to ``maximum`` (``default`` when absent).

    Only ASCII digits are taken, and never more than ``maximum`` has (after leading
    zeros), so ``int()`` is never handed a huge string. ``name`` starts the 400's
    message: ``limit`` natively and on OpenAI, ``limit:`` in Anthropic's style.
    """
    if raw is None:
        return default
    digits = raw.lstrip("0")
    short = raw.isascii() and raw.isdigit() and len(digits) <= len(str(maximum))
    if not short or not 1 <= int(digits or "0") <= maximum:
        raise invalid(f"{name} must be an integer from 1 to {maximum}", "limit")
    return int(digits)
