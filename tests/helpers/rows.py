"""The sample models, limits and message that the row-rule tests check rows against."""

from __future__ import annotations

from relay_batches.services.ingest_api.rows.validation import SubmitLimits

MODELS = frozenset({"gpt-4o-mini", "claude-haiku"})
LIMITS = SubmitLimits()
HI = {"role": "user", "content": "hi"}
