"""A deployment's configured rate limit (the routes file's ``rpm`` and ``tpm``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Requests and tokens per minute that every row-worker together may spend on one
    deployment; None: that dimension is not limited (at least one of them is set)."""

    rpm: int | None = None
    tpm: int | None = None
