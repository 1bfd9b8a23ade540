"""The model lists of the OpenAI and Anthropic surfaces: the aliases in each provider's
shape, read back by the SDKs' own types; Anthropic's pages by cursor both ways."""

from __future__ import annotations

from datetime import UTC, datetime

from anthropic.types import ModelInfo
from openai.types import Model

from relay_batches.dialects.anthropic.models import model_page
from relay_batches.dialects.openai.models import model_list

LOADED = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NAMES = ["e", "a", "d", "c", "b"]


def ids(page: dict[str, object]) -> list[str]:
    return [str(m["id"]) for m in page["data"]]  # type: ignore[attr-defined]


def test_openai_lists_every_alias_sorted_as_sdk_models() -> None:
    listed = model_list(NAMES, int(LOADED.timestamp()))
    assert listed["object"] == "list"
    models = [Model.model_validate(m, strict=True) for m in listed["data"]]
    assert [(m.id, m.owned_by, m.created) for m in models][:2] == [
        ("a", "relay", int(LOADED.timestamp())),
        ("b", "relay", int(LOADED.timestamp())),
    ]


def test_anthropic_pages_forward_and_back_by_cursor() -> None:
    first = model_page(NAMES, LOADED, 2)
    assert (ids(first), first["has_more"], first["first_id"], first["last_id"]) == (
        ["a", "b"],
        True,
        "a",
        "b",
    )
    ModelInfo.model_validate(first["data"][0])  # type: ignore[index]
    assert ids(model_page(NAMES, LOADED, 2, after_id="b")) == ["c", "d"]
    last = model_page(NAMES, LOADED, 2, after_id="d")
    assert (ids(last), last["has_more"]) == (["e"], False)
    assert ids(model_page(NAMES, LOADED, 2, after_id="bb")) == ["c", "d"]  # not an id: a place
    back = model_page(NAMES, LOADED, 2, before_id="d")
    assert (ids(back), back["has_more"]) == (["b", "c"], True)
    start = model_page(NAMES, LOADED, 2, before_id="b")
    assert (ids(start), start["has_more"]) == (["a"], False)
    empty = model_page([], LOADED, 20)
    assert (empty["data"], empty["first_id"], empty["last_id"]) == ([], None, None)
