"""Validation of a batch submission (API.md, "Submit a batch").

Pure functions from a decoded JSON body to a typed :class:`BatchSpec`: no aiohttp and no
asyncpg here, so unit tests call them directly and the multipart upload endpoint reuses
the option checks (:func:`validate_batch_options`, :func:`parse_priority_field`) and the
row checks (:func:`validate_request_rows`).

Every violation raises ``invalid(message, param)`` (a 400 ``ApiError``) whose ``param``
is the exact path of the offending field, with 0-based indexes: ``requests[3].messages``.

The row loop runs on bodies of up to 100,000 rows, so it is written for speed: exact
``type() is`` checks, locals bound before the loop, no exception or regex on the happy
path, one ``orjson.dumps`` per row; the precise error for a bad row is worked out on a
separate slow path only once the fast check has failed.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

import orjson
from croniter import CroniterBadDateError, CroniterError, croniter
from relay_batches.services.ingest_api.params import validate_params

from relay_batches.errors import ApiError, invalid

ROLES: frozenset[str] = frozenset({"system", "developer", "user", "assistant"})
MAX_NAME_CHARS = 256
MAX_CUSTOM_ID_CHARS = 256
MAX_WEBHOOK_URL_CHARS = 2048
MAX_CRON_CHARS = 256
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1
_ABSENT = object()
_QUOTE_CHARS = 64


class KnownModels:
    """``alias in KnownModels(pred)``: the router's aliases as a container for validation."""

    def __init__(self, known: Callable[[str], bool]) -> None:
        self._known = known

    def __contains__(self, alias: object) -> bool:
        return isinstance(alias, str) and self._known(alias)


@dataclass(frozen=True, slots=True)
class SubmitLimits:
    """Configurable limits of one submission."""

    max_rows: int = 100_000
    max_content_bytes: int = 1024 * 1024  # per message content, UTF-8 bytes


@dataclass(frozen=True, slots=True)
class RowInput:
    """One validated request row.

    ``messages_json`` is the row's messages list re-encoded compactly by orjson, each
    message reduced to its two keys, sorted: ``[{"content":"…","role":"user"}]``.
    """

    custom_id: str
    messages_json: str


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """A validated submission; ``name`` is None when absent (the caller defaults it)."""

    name: str | None
    model: str
    priority: int
    webhook_url: str | None
    cron: str | None
    rows: list[RowInput]
    params_json: str = "{}"


class BatchOptions(NamedTuple):
    """The non-row fields of a submission."""

    name: str | None
    model: str
    priority: int
    webhook_url: str | None
    cron: str | None


# --- body --------------------------------------------------------------------------


def decode_json_object(raw: bytes) -> dict[str, object]:
    """Decode a request body that must be one JSON object."""
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise invalid("request body must be JSON") from None
    if type(payload) is not dict:
        raise invalid("request body must be a JSON object")
    return payload


def validate_submit(
    payload: dict[str, object], limits: SubmitLimits, known_models: Container[str]
) -> BatchSpec:
    """Validate a ``POST /v1/batches`` body. Unknown top-level keys are ignored."""
    if type(payload) is not dict:
        raise invalid("request body must be a JSON object")
    options = validate_batch_options(payload, known_models)
    if "requests" not in payload:
        raise invalid("requests is required", "requests")
    rows = validate_request_rows(payload["requests"], limits)
    return BatchSpec(
        name=options.name,
        model=options.model,
        priority=options.priority,
        webhook_url=options.webhook_url,
        cron=options.cron,
        rows=rows,
        params_json=validate_params(payload.get("params")),
    )


# --- options -----------------------------------------------------------------------


def validate_batch_options(
    payload: Mapping[str, object], known_models: Container[str]
) -> BatchOptions:
    """Validate ``name``, ``model``, ``priority``, ``webhookUrl`` and ``cron``.

    A form-based caller converts ``priority`` with :func:`parse_priority_field` first
    and leaves out the fields it treats as absent.
    """
    model = _validate_model(payload.get("model", _ABSENT), known_models)
    name = _validate_name(payload.get("name"))
    raw_priority = payload.get("priority")
    priority = 0 if raw_priority is None else _validate_priority(raw_priority)
    webhook_url = payload.get("webhookUrl")
    if webhook_url is not None:
        webhook_url = validate_webhook_url(webhook_url)
    cron = payload.get("cron")
    if cron is not None:
        cron = validate_cron(cron)
    return BatchOptions(name, model, priority, webhook_url, cron)


def _validate_model(model: object, known_models: Container[str]) -> str:
    if model is _ABSENT:
        raise invalid("model is required", "model")
    if type(model) is not str:
        raise invalid("model must be a string", "model")
    if model not in known_models:
        raise invalid(f"model {_quote(model)} is unknown", "model")
    return model


def _validate_name(name: object) -> str | None:
    if name is None:
        return None
    if type(name) is not str:
        raise invalid("name must be a string", "name")
    if len(name) > MAX_NAME_CHARS:
        raise invalid(f"name must be at most {MAX_NAME_CHARS} characters", "name")
    if "\x00" in name:  # Postgres text cannot hold NUL
        raise invalid("name must not contain NUL characters", "name")
    return name


def _validate_priority(priority: object) -> int:
    if type(priority) is not int:  # excludes bool, float (5.0 included) and strings
        raise invalid("priority must be an integer", "priority")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise _priority_range_error()
    return priority


def parse_priority_field(text: str) -> int:
    """Parse a form field's priority: optional sign and ASCII digits, nothing else.

    Surrounding whitespace is allowed; ``"5.0"``, ``"1_000"`` and ``""`` are not
    integers. Whether a blank field means "absent" is the caller's decision.
    """
    stripped = text.strip()
    digits = stripped[1:] if stripped[:1] in ("+", "-") else stripped
    if not (digits.isascii() and digits.isdigit()):
        raise invalid("priority must be an integer", "priority")
    if len(digits) > len(str(PRIORITY_MAX)):  # before int(): no huge conversions
        raise _priority_range_error()
    return _validate_priority(int(stripped))


def _priority_range_error() -> ApiError:
    return invalid(f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}", "priority")


def validate_webhook_url(url: object) -> str:
    """An absolute http(s) URL with a host, at most 2048 characters; returned as given."""
    if type(url) is not str:
        raise invalid("webhookUrl must be a string", "webhookUrl")
    if len(url) > MAX_WEBHOOK_URL_CHARS:
        raise invalid(
            f"webhookUrl must be at most {MAX_WEBHOOK_URL_CHARS} characters", "webhookUrl"
        )
    if not _is_http_url(url):
        raise invalid("webhookUrl must be an absolute http or https URL", "webhookUrl")
    return url


def _is_http_url(url: str) -> bool:
    # urlsplit silently strips some whitespace and control characters: refuse them first.
    if not url.isprintable() or " " in url:
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def validate_cron(expr: object) -> str:
    """A 5-field cron expression (UTC) that fires at some future time.

    Returns the fields joined by single spaces, the form the scheduler stores. Six-field
    (seconds) expressions, ``@daily``-style nicknames and croniter's random/hashed ``R``
    and ``H`` extensions are refused.
    """
    if type(expr) is not str:
        raise invalid("cron must be a string", "cron")
    if len(expr) > MAX_CRON_CHARS:
        raise invalid(f"cron must be at most {MAX_CRON_CHARS} characters", "cron")
    fields = expr.split()
    if len(fields) != 5:
        raise invalid(
            f"cron must have exactly 5 fields (minute hour day month weekday), got {len(fields)}",
            "cron",
        )
    normalized = " ".join(fields)
    if not normalized.isascii() or _has_random_field(fields):
        raise invalid(f"cron expression {_quote(normalized)} is not valid", "cron")
    try:
        croniter(normalized).get_next(float)
    except CroniterBadDateError:  # every field valid, but no date matches ("0 0 30 2 *")
        raise invalid(f"cron expression {_quote(normalized)} never fires", "cron") from None
    except CroniterError:
        raise invalid(f"cron expression {_quote(normalized)} is not valid", "cron") from None
    return normalized


def _has_random_field(fields: list[str]) -> bool:
    # No month or weekday name starts with R or H, so a leading R/H is croniter's
    # random ("R") or hashed ("H") extension in any field.
    return any(part[:1] in ("R", "r", "H", "h") for f in fields for part in f.split(","))


# --- rows --------------------------------------------------------------------------


def validate_request_rows(
    requests: object, limits: SubmitLimits, param_prefix: str = "requests"
) -> list[RowInput]:
    """Validate the request rows, default their custom ids and encode their messages."""
    requests = _check_row_list(requests, limits, param_prefix)
    max_bytes = limits.max_content_bytes
    # A str of n code points is at most 4n UTF-8 bytes: only longer ones get encoded.
    safe_chars = max_bytes // 4
    roles = ROLES
    dumps = orjson.dumps
    sort_keys = orjson.OPT_SORT_KEYS
    rows: list[RowInput] = []
    ids: list[str] = []
    add_row = rows.append
    add_id = ids.append
    for i, req in enumerate(requests):
        if type(req) is not dict:
            raise invalid(f"{param_prefix}[{i}] must be an object", f"{param_prefix}[{i}]")
        messages = req.get("messages")
        if type(messages) is not list or not messages:
            param = f"{param_prefix}[{i}].messages"
            raise invalid(f"{param} must be a non-empty array", param)
        n_keys = 0
        for msg in messages:
            if type(msg) is not dict:
                break
            role = msg.get("role")
            content = msg.get("content")
            if type(role) is not str or role not in roles or type(content) is not str:
                break
            if len(content) > safe_chars and len(content.encode("utf-8", "replace")) > max_bytes:
                break
            n_keys += len(msg)
        else:  # every message passed: finish the row, then on to the next one
            custom_id = req.get("custom_id")
            if custom_id is None:
                custom_id = f"row-{i + 1}"
            elif (
                type(custom_id) is not str
                or len(custom_id) > MAX_CUSTOM_ID_CHARS
                or "\x00" in custom_id  # Postgres text cannot hold NUL
            ):
                raise _custom_id_error(custom_id, f"{param_prefix}[{i}].custom_id")
            if n_keys != 2 * len(messages):  # some message has extra keys: drop them
                messages = _role_and_content(messages)
            try:  # sorted keys: the same text whatever order the client sent
                encoded = dumps(messages, option=sort_keys).decode()
            except TypeError:  # lone surrogates: only from a payload not built by orjson
                raise _unencodable_error(messages, f"{param_prefix}[{i}].messages") from None
            add_id(custom_id)
            add_row(RowInput(custom_id, encoded))
            continue
        # A message failed the fast check (break): find and report it precisely.
        raise _message_error(messages, f"{param_prefix}[{i}].messages", max_bytes)
    _check_unique(ids, param_prefix)
    return rows


def _role_and_content(messages: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{"content": m["content"], "role": m["role"]} for m in messages]


def _check_row_list(requests: object, limits: SubmitLimits, param_prefix: str) -> list[object]:
    if type(requests) is not list or not requests:
        raise invalid(f"{param_prefix} must be a non-empty array", param_prefix)
    if len(requests) > limits.max_rows:
        raise invalid(
            f"{param_prefix} must hold at most {limits.max_rows:,} requests per batch",
            param_prefix,
        )
    return requests


def _message_error(messages: list[object], param: str, max_bytes: int) -> ApiError:
    """The precise error for the first bad message; the slow path of the row loop."""
    for j, msg in enumerate(messages):
        at = f"{param}[{j}]"
        if type(msg) is not dict:
            return invalid(f"{at} must be an object", at)
        role = msg.get("role")
        if type(role) is not str or role not in ROLES:
            return invalid(
                f"{at}.role must be one of system, developer, user, assistant", f"{at}.role"
            )
        content = msg.get("content")
        if type(content) is not str:
            return invalid(f"{at}.content must be a string", f"{at}.content")
        if len(content.encode("utf-8", "replace")) > max_bytes:
            return invalid(
                f"{at}.content must be at most {max_bytes} bytes of UTF-8", f"{at}.content"
            )
    return invalid(f"{param} is not valid", param)  # unreachable: the fast check failed


def _unencodable_error(messages: list[object], param: str) -> ApiError:
    for j, msg in enumerate(messages):
        content = msg["content"] if type(msg) is dict else ""
        try:
            content.encode("utf-8")
        except UnicodeEncodeError:
            return invalid(
                f"{param}[{j}].content must be valid Unicode text", f"{param}[{j}].content"
            )
    return invalid(f"{param} must be valid Unicode text", param)


def _custom_id_error(custom_id: object, param: str) -> ApiError:
    if type(custom_id) is not str:
        return invalid(f"{param} must be a string", param)
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        return invalid(f"{param} must be at most {MAX_CUSTOM_ID_CHARS} characters", param)
    return invalid(f"{param} must not contain NUL characters", param)


def _check_unique(ids: list[str], param_prefix: str) -> None:
    if len(set(ids)) != len(ids):
        raise _duplicate_error(ids, param_prefix)


def _duplicate_error(ids: list[str], param_prefix: str) -> ApiError:
    first: dict[str, int] = {}
    for i, custom_id in enumerate(ids):
        if custom_id in first:
            param = f"{param_prefix}[{i}].custom_id"
            earlier = f"{param_prefix}[{first[custom_id]}].custom_id"
            return invalid(f"{param} {_quote(custom_id)} duplicates {earlier}", param)
        first[custom_id] = i
    return invalid(f"{param_prefix} custom ids must be unique", param_prefix)  # unreachable


def _quote(value: str) -> str:
    """A value echoed in a message: quoted, and cut short if long."""
    if len(value) > _QUOTE_CHARS:
        value = value[:_QUOTE_CHARS] + "…"
    return repr(value)
