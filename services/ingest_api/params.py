"""Job-level model parameters (``params`` of ``POST /v1/batches``), applied to every row.

Only the parameters every provider can honour (or that translate cleanly) are
accepted; an unknown key is a 400 so a typo never silently changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import orjson

from relay_batches.errors import invalid

MAX_TOKENS_LIMIT = 1_000_000
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256
MAX_SCHEMA_BYTES = 64 * 1024
MAX_JSON_DEPTH = 32  # nesting of a free-form object: ``{}`` is 1, ``{"a": []}`` is 2
RESPONSE_FORMAT_TYPES = frozenset({"text", "json_object", "json_schema"})
SEED_RANGE = (-(2**63), 2**63 - 1)


def _number(value: object, param: str, low: float, high: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise invalid(f"{param} must be a number from {low:g} to {high:g}", param)
    return value


def _integer(value: object, param: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise invalid(f"{param} must be an integer from {low} to {high}", param)
    return value


def _stop(value: object, param: str) -> str | list[str]:
    items = [value] if type(value) is str else value
    if (
        type(items) is not list
        or not 1 <= len(items) <= MAX_STOP_SEQUENCES
        or not all(type(s) is str and 0 < len(s) <= MAX_STOP_CHARS for s in items)
    ):
        raise invalid(
            f"{param} must be a non-empty string or an array of 1 to {MAX_STOP_SEQUENCES}"
            f" non-empty strings of at most {MAX_STOP_CHARS} characters",
            param,
        )
    return value  # type: ignore[return-value]


def _response_format(value: object, param: str) -> dict[str, object]:
    kind = value.get("type") if type(value) is dict else None
    if type(value) is not dict or type(kind) is not str or kind not in RESPONSE_FORMAT_TYPES:
        raise invalid(
            f"{param}.type must be one of {', '.join(sorted(RESPONSE_FORMAT_TYPES))}",
            f"{param}.type",
        )
    # Checked whenever present: a stored ``json_schema`` must be an object whatever ``type``.
    if kind == "json_schema" or "json_schema" in value:
        schema = value.get("json_schema")
        if type(schema) is not dict:
            raise invalid(f"{param}.json_schema must be an object", f"{param}.json_schema")
        check_depth(schema, f"{param}.json_schema")
        if len(orjson.dumps(schema)) > MAX_SCHEMA_BYTES:
            raise invalid(
                f"{param}.json_schema must be at most {MAX_SCHEMA_BYTES} bytes",
                f"{param}.json_schema",
            )
    for key, item in value.items():  # the rest of a response_format is stored as given
        if key != "json_schema":
            check_depth(item, f"{param}.{key}")
    return value


def json_depth(value: object) -> int:
    """How deeply ``value`` nests objects and arrays (a scalar is 0, ``[]`` is 1)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if type(item) is dict:
            children: Iterable[object] = item.values()
        elif type(item) is list:
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_depth(value: object, param: str, limit: int = MAX_JSON_DEPTH) -> None:
    """400 naming ``param`` when ``value`` nests deeper than ``limit`` levels.

    Stored free-form JSON is echoed by every listing: orjson refuses to encode past 255
    levels, so a deep value would otherwise break each page that holds it.
    """
    if json_depth(value) > limit:
        raise invalid(f"{param} must nest at most {limit} levels of objects and arrays", param)


def validate_params(value: object, param: str = "params") -> str:
    """Validate ``params``; return it as compact JSON text (``{}`` when absent)."""
    if value is None:
        return "{}"
    if type(value) is not dict:
        raise invalid(f"{param} must be an object", param)
    checks = {
        "temperature": lambda v, p: _number(v, p, 0, 2),
        "top_p": lambda v, p: _number(v, p, 0, 1),
        "max_tokens": lambda v, p: _integer(v, p, 1, MAX_TOKENS_LIMIT),
        "seed": lambda v, p: _integer(v, p, *SEED_RANGE),
        "stop": _stop,
        "response_format": _response_format,
    }
    for key, item in value.items():
        check = checks.get(key)
        if check is None:
            raise invalid(
                f"{param}.{key} is not a supported parameter"
                f" (supported: {', '.join(sorted(checks))})",
                f"{param}.{key}",
            )
        check(item, f"{param}.{key}")
    return orjson.dumps(value).decode()
