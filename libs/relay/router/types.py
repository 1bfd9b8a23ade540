"""Small values the router passes around."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Completion:
    """A successful reply of a model."""

    content: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class ProviderReply:
    """A provider's parse of a 200 reply: a completion, or why it is unusable."""

    completion: Completion | None = None
    error: str | None = None


@dataclass(frozen=True)
class RowResult:
    """What the router made of one row after retries and fallback."""

    completion: Completion | None
    error: str | None
    attempts: int
    deployment: str | None
    dead_letter: bool = False
