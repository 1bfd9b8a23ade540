"""Each surface's own OpenAPI document (for the docs site): valid OpenAPI 3.1, complete
(every reference resolves inside it) and together exactly the served document's paths."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

from relay_batches.services.ingest_api.openapi import documents, load_document

DOCUMENTS = documents()


def refs(value: object) -> set[str]:
    """Every ``$ref`` in ``value``."""
    text = orjson.dumps(value).decode()
    return {part.split('"', 1)[0] for part in text.split('"$ref":"')[1:]}


def test_there_is_one_document_per_surface() -> None:
    assert set(DOCUMENTS) == {"native", "openai", "anthropic"}


@pytest.mark.parametrize("name", ["native", "openai", "anthropic"])
def test_each_document_is_valid_openapi_3_1(name: str) -> None:
    document = DOCUMENTS[name]
    OPENAPI_31_VALIDATOR.validate(document)
    assert document["openapi"].startswith("3.1.")


@pytest.mark.parametrize("name", ["native", "openai", "anthropic"])
def test_every_reference_resolves_inside_its_document(name: str) -> None:
    document: dict[str, Any] = DOCUMENTS[name]
    for ref in refs(document):
        section, schema = ref.removeprefix("#/components/").split("/")
        assert schema in document["components"][section], (name, ref)


def test_the_documents_split_the_served_paths_by_surface() -> None:
    served = load_document()["paths"]
    split = [DOCUMENTS[name]["paths"] for name in ("native", "openai", "anthropic")]
    assert sum(len(paths) for paths in split) == len(served)
    assert {k: v for paths in split for k, v in paths.items()} == served
    assert all(p.startswith("/openai/v1/") for p in DOCUMENTS["openai"]["paths"])
    assert all(p.startswith("/anthropic/v1/") for p in DOCUMENTS["anthropic"]["paths"])
    assert "/v1/batches" in DOCUMENTS["native"]["paths"]


def test_documents_are_fresh_copies() -> None:
    documents()["native"]["paths"].clear()
    assert documents()["native"]["paths"]
