"""The API reference pages, generated from each surface's OpenAPI document.

A MkDocs hook (``hooks:`` in mkdocs.yml): before every build it renders the documents of
``relay_batches.services.ingest_api.openapi.documents()`` as Markdown tables, one page
per surface, into ``docs/api/reference/`` (git-ignored). A page is written only when its
text changed, so ``mkdocs serve`` does not rebuild for ever. Run alone
(``python docs/gen_api.py``) it writes the pages and prints their paths.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from relay_batches.services.ingest_api.openapi import documents

OUT = Path(__file__).parent / "api" / "reference"

SURFACES = {
    "native": ("Native API reference", "../native.md", "Native API"),
    "openai": ("OpenAI-compatible API reference", "../openai.md", "OpenAI-compatible API"),
    "anthropic": (
        "Anthropic-compatible API reference",
        "../anthropic.md",
        "Anthropic-compatible API",
    ),
}
METHODS = ("get", "post", "put", "patch", "delete")
RULES = (
    ("minimum", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "≤ {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "at least {} characters"),
    ("maxLength", "at most {} characters"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
    ("pattern", "matches `{}`"),
)


def text(value: object) -> str:
    """``value`` as one table cell: one line, pipes escaped, ``<`` outside code spans
    escaped (so ``<api key>`` is not taken for HTML)."""
    parts = str(value).replace("\n", " ").replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts)


def schema_name(ref: str) -> str:
    """The component name a ``$ref`` points at."""
    return ref.rsplit("/", 1)[-1]


def type_of(schema: dict[str, Any]) -> str:
    """A schema's type in a few words, component names linked to their section."""
    if "$ref" in schema:
        name = schema_name(schema["$ref"])
        return f"[`{name}`](#schema-{name})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(type_of(s) for s in schema[key])
    if "allOf" in schema:
        return " and ".join(type_of(s) for s in schema["allOf"])
    if "const" in schema:
        return f"`{_json(schema['const'])}`"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{_json(v)}`" for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(type_of({**schema, "type": k}) for k in kind)
    if kind == "array":
        items = schema.get("items")
        return f"array of {type_of(items)}" if items else "array"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {type_of(schema['additionalProperties'])}"
    if kind is None:
        return "any"
    return f"{kind} ({schema['format']})" if "format" in schema else str(kind)


def _json(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def about(schema: dict[str, Any]) -> str:
    """A schema's description with its rules and default."""
    rules = [form.format(schema[key]) for key, form in RULES if key in schema]
    if "default" in schema:
        rules.append(f"default `{_json(schema['default'])}`")
    said = schema.get("description", "")
    return text("; ".join(filter(None, [said, ", ".join(rules)])))


def properties(schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Table rows of an object's fields; inline objects (and arrays of them) are
    unfolded as ``field.sub`` and ``field[].sub``."""
    required = set(schema.get("required", ()))
    for name, field in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        yes = "yes" if name in required else ""
        yield f"| `{path}` | {type_of(field)} | {yes} | {about(field)} |"
        if field.get("properties"):
            yield from properties(field, f"{path}.")
        items = field.get("items")
        if isinstance(items, dict) and items.get("properties"):
            yield from properties(items, f"{path}[].")


def resolve(document: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """``node`` itself, or the component it refers to (parameters, responses)."""
    while "$ref" in node and not node["$ref"].startswith("#/components/schemas/"):
        _, _, kind, name = node["$ref"].split("/", 3)
        node = document["components"][kind][name]
    return node


def bodies(content: dict[str, Any]) -> str:
    """What a request or response body holds, per content type."""
    return "; ".join(
        f"`{kind}`: {type_of(media['schema'])}" if "schema" in media else f"`{kind}`"
        for kind, media in content.items()
    )


def operation(document: dict[str, Any], path: str, method: str, item: dict[str, Any]) -> str:
    """One endpoint's section: what it does, its parameters, body and responses."""
    op = item[method]
    lines = [f"### `{method.upper()} {path}` {{ #{op['operationId']} }}", ""]
    lines += [op.get("summary", ""), ""]
    if op.get("description"):
        lines += [op["description"], ""]
    if not op.get("security", document.get("security")):
        lines += ["No API key needed.", ""]
    params = [resolve(document, p) for p in item.get("parameters", []) + op.get("parameters", [])]
    if params:
        lines += ["| parameter | in | required | type | description |", "|---|---|---|---|---|"]
        for p in params:
            yes = "yes" if p.get("required") else ""
            schema = p.get("schema", {})
            said = " ".join(filter(None, [text(p.get("description", "")), about(schema)]))
            lines.append(f"| `{p['name']}` | {p['in']} | {yes} | {type_of(schema)} | {said} |")
        lines.append("")
    if "requestBody" in op:
        body = resolve(document, op["requestBody"])
        lines += [f"Request body: {bodies(body.get('content', {}))}", ""]
    lines += ["| status | description | body |", "|---|---|---|"]
    for status, response in op.get("responses", {}).items():
        response = resolve(document, response)
        lines.append(
            f"| {status} | {text(response.get('description', ''))} | "
            f"{bodies(response.get('content', {}))} |"
        )
    return "\n".join(lines) + "\n"


def schema_section(name: str, schema: dict[str, Any]) -> str:
    """One component schema's section: its description and a table of its fields."""
    lines = [f"### `{name}` {{ #schema-{name} }}", ""]
    if schema.get("description"):
        lines += [schema["description"], ""]
    rows = list(properties(schema))
    if rows:
        lines += ["| field | type | required | description |", "|---|---|---|---|", *rows]
    else:
        lines.append(f"Type: {type_of(schema)}. {about(schema)}")
    return "\n".join(lines) + "\n"


def page(surface: str, document: dict[str, Any]) -> str:
    """The Markdown page of one surface's document."""
    title, prose, prose_title = SURFACES[surface]
    endpoints = [
        (path, method, item)
        for path, item in document["paths"].items()
        for method in METHODS
        if method in item
    ]
    out = [
        f"# {title}",
        "",
        "Generated from the OpenAPI document that ingest-api serves at `GET /openapi.json`;",
        f"do not edit. The contract in prose is on the [{prose_title}]({prose}) page.",
        "",
        "## Endpoints",
        "",
        "| method | path | summary |",
        "|---|---|---|",
    ]
    for path, method, item in endpoints:
        op = item[method]
        summary = text(op.get("summary", ""))
        out.append(f"| {method.upper()} | [`{path}`](#{op['operationId']}) | {summary} |")
    out.append("")
    out += [operation(document, path, method, item) for path, method, item in endpoints]
    out += ["## Schemas", ""]
    schemas = document["components"].get("schemas", {})
    out += [schema_section(name, schemas[name]) for name in sorted(schemas)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out))


def generate() -> list[Path]:
    """Write every surface's page (only those whose text changed); all their paths."""
    OUT.mkdir(parents=True, exist_ok=True)
    written = []
    for surface, document in documents().items():
        target = OUT / f"{surface}.md"
        content = page(surface, document)
        if not target.exists() or target.read_text(encoding="utf-8") != content:
            target.write_text(content, encoding="utf-8")
        written.append(target)
    return written


def on_pre_build(config: object) -> None:
    """MkDocs hook: the reference pages exist and are current before files are read."""
    generate()


if __name__ == "__main__":
    for written in generate():
        print(written)
