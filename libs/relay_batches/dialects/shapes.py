"""Pydantic v2 plumbing shared by the request models of every surface.

:class:`Shape` is a strict JSON object refusing unknown keys with a message that lists
the known ones (or says why a known-elsewhere key cannot be honoured); :func:`tagged_by`
and :func:`tagged` build unions told apart by one key, whose bad tag is one error on that
key; :data:`FreeObject` and :data:`NestedObject` are free-form objects bounded in depth
(and size); :func:`ranged` a number with both bounds in one message and in the schema.

:func:`first_error` turns a :class:`~pydantic.ValidationError` into the one
``(field, message)`` to report: ``field`` the exact path in the input
(``messages[0].content[1].text``, union members skipped), ``message`` what follows it
(``must be a string``), so each surface renders it as its 400.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

MAX_SCHEMA_BYTES = 64 * 1024  # a free-form object (a JSON Schema), compact JSON
MAX_JSON_DEPTH = 32  # nesting of a free-form object: ``{}`` is 1, ``{"a": []}`` is 2
BAD_TAG = "bad_tag:"
# A union member's tag, as it appears in an error's location: marked so that no JSON key
# of the input can be mistaken for it (see error_field_and_message).
TAG_MARK = "="


class Shape(BaseModel):
    """A JSON object of the API: strict, no unknown keys (each named with the known)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # What the object is, for "is not a field of <NOUN>"; reasons for keys that are known
    # elsewhere but cannot be honoured here.
    NOUN: ClassVar[str] = "this object"
    UNSUPPORTED: ClassVar[Mapping[str, str]] = {}

    FIELDS: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Note the class's field names once (``model_fields`` is slow to read)."""
        super().__pydantic_init_subclass__(**kwargs)
        cls.FIELDS = frozenset(cls.__pydantic_fields__)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if type(data) is dict and not cls.FIELDS.issuperset(data):
            raise _unknown_key(cls, next(k for k in data if k not in cls.FIELDS))
        return data


def _unknown_key(cls: type[Shape], key: object) -> PydanticCustomError:
    if not _encodes(key):  # pydantic cannot render such a key: name the object instead
        return PydanticCustomError("string_unicode", "must be valid Unicode text")
    reason = cls.UNSUPPORTED.get(key) if type(key) is str else None
    if reason is not None:
        return PydanticCustomError("unsupported", reason, {"field": key})
    known = ", ".join(sorted(cls.FIELDS))
    return PydanticCustomError(
        "unknown_key", f"is not a field of {cls.NOUN} (fields: {known})", {"field": key}
    )


def tagged_by(key: str, tags: tuple[str, ...], non_object: str | None = None) -> Discriminator:
    """A discriminator on ``key``: a missing or unknown tag is one error on ``key`` naming
    the tags; a value that is not an object goes to the ``non_object`` member (whose own
    error says "must be an object"), or is that same error when None."""

    def tag(value: Any) -> str | None:
        if type(value) is not dict:
            return None if non_object is None else TAG_MARK + non_object
        found = value.get(key)
        return TAG_MARK + found if type(found) is str and found in tags else None

    return Discriminator(
        tag,
        # The error's type names the key (a context dict would make the type unhashable).
        custom_error_type=f"{BAD_TAG}{key}",
        custom_error_message=f"must be one of {', '.join(tags)}",
    )


def tagged(name: str) -> Tag:
    """The ``Tag`` of the union member chosen by a :func:`tagged_by` value ``name``."""
    return Tag(TAG_MARK + name)


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


def _shallow(value: dict[str, Any]) -> dict[str, Any]:
    # Stored free-form JSON is echoed by every listing: orjson refuses to encode past 255
    # levels, so a deep value would otherwise break each page that holds it.
    if json_depth(value) > MAX_JSON_DEPTH:
        raise PydanticCustomError(
            "too_deep", f"must nest at most {MAX_JSON_DEPTH} levels of objects and arrays"
        )
    return value


def _bounded(value: dict[str, Any]) -> dict[str, Any]:
    _shallow(value)
    try:
        size = len(orjson.dumps(value))
    except TypeError:  # lone surrogates: only from a payload not built by orjson
        raise PydanticCustomError("not_json", "must be valid Unicode JSON") from None
    if size > MAX_SCHEMA_BYTES:
        raise PydanticCustomError("too_large", f"must be at most {MAX_SCHEMA_BYTES} bytes")
    return value


# A free-form object: nesting bounded (NestedObject), and size too (FreeObject, a schema).
NestedObject = Annotated[dict[str, Any], AfterValidator(_shallow)]
FreeObject = Annotated[dict[str, Any], AfterValidator(_bounded)]


def ranged(low: int, high: int, what: str) -> tuple[Any, ...]:
    """Annotations of a number from ``low`` to ``high`` (``what``: "a number", "an
    integer"), documented as the schema's minimum and maximum, one message for both."""

    def check(value: float) -> float:
        if not low <= value <= high:
            raise PydanticCustomError("range", f"must be {what} from {low} to {high}")
        return value

    bounds: dict[str, Any] = {"minimum": low, "maximum": high}
    return Field(json_schema_extra=bounds, allow_inf_nan=False), AfterValidator(check)


# --- errors --------------------------------------------------------------------------

_PHRASES = {
    "missing": "is required",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be a boolean",
    "list_type": "must be an array",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "none_required": "must be null",
    "string_unicode": "must be valid Unicode text",
}


def error_field_and_message(error: ErrorDetails, data: object) -> tuple[str, str]:
    """The path (``messages[0].content``) and message (``must be a string``) of a
    pydantic error on ``data``; the path follows the input, skipping union tags."""
    path = ""
    node: object = data
    loc = error["loc"]
    ctx = error.get("ctx") or {}
    for n, step in enumerate(loc):
        if type(node) is dict and type(step) is str and step in node:
            path, node = f"{path}.{step}", node[step]
        elif type(node) is list and type(step) is int:
            path, node = f"{path}[{step}]", node[step]
        elif n == len(loc) - 1 and error["type"] == "missing" and type(step) is str:
            path = f"{path}.{step}"
    field = ctx.get("field") or error["type"].partition(BAD_TAG)[2]
    if field:
        path = f"{path}.{field}"
    return path.lstrip("."), _phrase(error)


def _phrase(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind in _PHRASES:
        return _PHRASES[kind]
    if kind == "literal_error":
        return f"must be {ctx.get('expected', 'one of the allowed values')}"
    if kind == "too_short":
        return "must be a non-empty array"
    if kind == "too_long":
        return f"must hold at most {ctx.get('max_length')} items"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "greater_than_equal":
        return f"must be at least {ctx.get('ge')}"
    if kind == "less_than_equal":
        return f"must be at most {ctx.get('le')}"
    if kind == "finite_number":
        return "must be a finite number"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}"
    return error["msg"]


def first_error(exc: ValidationError, data: object) -> tuple[str, str]:
    """The error to report of all pydantic found: the deepest (a union's other members
    fail at the union itself), the first of those. An error pydantic cannot render
    (a lone surrogate in a key it reports) is the unencodable string's path."""
    try:
        errors = exc.errors(include_url=False)
    except UnicodeEncodeError:
        return unencodable_path(data), _PHRASES["string_unicode"]
    found = [(error_field_and_message(e, data), e["type"].endswith("_type")) for e in errors]
    # Deepest first; at one depth, a member that took the value's type says more than
    # one that did not ("at most 4 items" rather than "must be a string").
    best = max(found, key=lambda f: (f[0][0].count(".") + f[0][0].count("["), not f[1]))
    return best[0]


def unencodable_path(value: object) -> str:
    """The path of the first string in ``value`` (a value or a key) that is not valid
    Unicode, a lone surrogate (only from a payload not built by orjson); ``""`` for none."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if type(item) is dict:
            items = list(item.items())
            if not all(_encodes(k) for k, _ in items):
                return path.lstrip(".")
            stack.extend((f"{path}.{k}", child) for k, child in reversed(items))
        elif type(item) is list:
            stack.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
        elif not _encodes(item):
            return path.lstrip(".")
    return ""


def is_unicode(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (holds no lone surrogate): cheap for ASCII."""
    return text.isascii() or _encodes(text)


def _encodes(value: object) -> bool:
    if type(value) is not str:
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
