"""Job-level model parameters (``params`` of ``POST /v1/batches``), applied to every row.

They are the parameters a row may carry itself, under the same rules: one model,
:class:`dialects.chat.Params`. Only parameters every provider can honour (or that translate
cleanly) are accepted; an unknown key is a 400 so a typo never silently changes nothing.
"""

from __future__ import annotations

import orjson

from relay_batches.dialects.chat import (
    MAX_JSON_DEPTH,
    MAX_SCHEMA_BYTES,
    MAX_STOP_CHARS,
    MAX_STOP_SEQUENCES,
    MAX_TOKENS_LIMIT,
    PARAM_FIELDS,
    RESPONSE_FORMAT_TYPES,
    SEED_RANGE,
    check_params,
    json_depth,
)
from relay_batches.errors import invalid

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_SCHEMA_BYTES",
    "MAX_STOP_CHARS",
    "MAX_STOP_SEQUENCES",
    "MAX_TOKENS_LIMIT",
    "PARAM_FIELDS",
    "RESPONSE_FORMAT_TYPES",
    "SEED_RANGE",
    "json_depth",
    "validate_params",
]


def validate_params(value: object, param: str = "params") -> str:
    """Validate ``params``; return it as compact JSON text (``{}`` when absent), null
    values left out (null means absent)."""
    if value is None:
        return "{}"
    problem = check_params(value)
    if problem is not None:
        field, message = problem
        at = f"{param}.{field}" if field else param
        raise invalid(f"{at} {message}", at)
    assert type(value) is dict  # check_params refuses anything else
    return orjson.dumps({k: v for k, v in value.items() if v is not None}).decode()
