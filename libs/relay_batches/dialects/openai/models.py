"""``GET /v1/models`` in OpenAI's shape: the route aliases as model objects.

``{object: "list", data: [{id, object: "model", created, owned_by}]}``, sorted by id;
``created`` is when the routes were loaded (the routes file's modification time) and
``owned_by`` is ``relay``: the ids are Relay's aliases, not a provider's models. A name
an alias pattern matches (``gpt-4o-mini-2024-07-18``) is retrievable by that name but
not listed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel

OWNER = "relay"


class OpenAIModel(BaseModel):
    """One model: a route alias."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class OpenAIModelList(BaseModel):
    """``GET /models``: every route alias."""

    object: Literal["list"] = "list"
    data: list[OpenAIModel]


def model_object(name: str, created: int) -> dict[str, Any]:
    """The model object of ``name``."""
    return {"id": name, "object": "model", "created": created, "owned_by": OWNER}


def model_list(names: Iterable[str], created: int) -> dict[str, Any]:
    """The list of the models ``names``, sorted by id."""
    return {"object": "list", "data": [model_object(name, created) for name in sorted(names)]}
