"""``GET /v1/models`` in Anthropic's shape: the route aliases as model infos.

``{data: [{type: "model", id, display_name, created_at, lifecycle: "active", …}],
has_more, first_id, last_id}`` (what Relay cannot know of a model, its capabilities,
line, token limits, deprecation and retirement, is null), a page of ``limit`` (1 to
1000, default 20) ids in sorted order after ``after_id`` or before ``before_id`` (ids
compare as text, so a cursor need not be an id still listed). ``display_name`` is the
alias; ``created_at`` when the routes were loaded (the routes file's modification time).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

DEFAULT_PAGE = 20
MAX_PAGE = 1000


class _Response(BaseModel):
    """A response shape: every field is always sent (``null`` when unset)."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


class AnthropicModelInfo(_Response):
    """One model: a route alias."""

    type: Literal["model"] = "model"
    id: str
    display_name: str
    created_at: datetime
    lifecycle: Literal["active"] = "active"
    capabilities: dict[str, Any] | None = None
    line: str | None = None
    max_input_tokens: int | None = None
    max_tokens: int | None = None
    deprecated_at: datetime | None = None
    retires_at: datetime | None = None


class AnthropicModelList(_Response):
    """A page of models, in id order."""

    data: list[AnthropicModelInfo]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


def model_info(name: str, created_at: datetime) -> dict[str, Any]:
    """The model info of ``name``."""
    info = AnthropicModelInfo(id=name, display_name=name, created_at=created_at)
    return info.model_dump(mode="json")


def model_page(
    names: Sequence[str],
    created_at: datetime,
    limit: int,
    after_id: str | None = None,
    before_id: str | None = None,
) -> dict[str, Any]:
    """One page of the sorted ``names``: the ``limit`` after ``after_id``, else the
    ``limit`` just before ``before_id``, else the first ``limit``; ``has_more`` says
    whether more lie in the direction asked."""
    ordered = sorted(names)
    if before_id is not None:
        end = bisect.bisect_left(ordered, before_id)
        start = max(0, end - limit)
        more = start > 0
    else:
        start = 0 if after_id is None else bisect.bisect_right(ordered, after_id)
        end = min(len(ordered), start + limit)
        more = end < len(ordered)
    page = ordered[start:end]
    return {
        "data": [model_info(name, created_at) for name in page],
        "has_more": more,
        "first_id": page[0] if page else None,
        "last_id": page[-1] if page else None,
    }
