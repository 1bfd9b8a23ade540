"""``openapi.documents()``: the served document split into one per surface, which the
docs' API reference pages are generated from."""

from __future__ import annotations

from typing import Any

from relay_batches.services.ingest_api.openapi import documents, load_document

PREFIXES = {"openai": "/openai/v1/", "anthropic": "/anthropic/v1/"}


def _refs(node: object) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(value) for value in node))
    return set()


def _resolves(document: dict[str, Any], ref: str) -> bool:
    _, _, kind, name = ref.split("/", 3)
    return name in document["components"].get(kind, {})


def test_every_path_is_in_exactly_one_surface_by_its_prefix() -> None:
    split = documents()
    assert set(split) == {"native", "openai", "anthropic"}
    whole = load_document()
    for path, item in whole["paths"].items():
        owners = [name for name, document in split.items() if path in document["paths"]]
        expected = next((n for n, p in PREFIXES.items() if path.startswith(p)), "native")
        assert owners == [expected], path
        assert split[expected]["paths"][path] == item
    assert all(split[name]["paths"] for name in split)


def test_each_surface_holds_every_component_its_paths_use_and_no_other() -> None:
    for name, document in documents().items():
        refs = _refs(document)
        assert all(_resolves(document, ref) for ref in refs), name
        for kind, entries in document["components"].items():
            if kind == "securitySchemes":
                continue
            for entry in entries:
                assert f"#/components/{kind}/{entry}" in refs, (name, kind, entry)
