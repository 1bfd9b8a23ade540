"""The job-level fields of a submission (docs/api/native.md, "Submit a batch"): everything
but its rows.

Every surface that creates a job checks them with :func:`validate_batch_options` (a
multipart upload converts its form fields first: :func:`parse_priority_field` for
``priority``, :func:`parse_budget_field` for ``budget_usd``). A violation raises
``invalid(message, param)`` (a 400 ``ApiError``) whose ``param`` is the exact path of the
offending field. Pure functions: no aiohttp and no asyncpg here.
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

import orjson
from croniter import CroniterBadDateError, CroniterError, croniter

from relay_batches.dialects.chat import known_list
from relay_batches.dialects.endpoints import ALL_ENDPOINTS, CHAT
from relay_batches.dialects.shapes import is_unicode
from relay_batches.durations import SPELLING, parse_duration
from relay_batches.errors import ApiError, invalid
from relay_batches.services.ingest_api.rows.params import validate_params

MAX_NAME_CHARS = 256
MAX_WEBHOOK_URL_CHARS = 2048
MAX_CRON_CHARS = 256
# Priority orders jobs within their workspace (fairness shares across workspaces).
PRIORITY_MIN = -1000
PRIORITY_MAX = 1000
_ABSENT = object()
# A completion window: "24h" (OpenAI's only value) or any <n>s|m|h|d from 1s to 7d.
MIN_COMPLETION_WINDOW = timedelta(seconds=1)
MAX_COMPLETION_WINDOW = timedelta(days=7)
_MAX_WINDOW_DIGITS = 6  # 604800s is the longest allowed spelling
_MAX_NUMBER_CHARS = 64  # a form field's number: no huge conversions
# Metadata as OpenAI limits it: at most 16 string pairs, keys ≤ 64, values ≤ 512 chars.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
# A job's budget: what its rows may cost, in USD (see the aggregator's budget trip).
MAX_BUDGET_USD = 1_000_000
# Every job-level field of a submission: the rest of a body is its rows.
JOB_FIELDS = (
    "model",
    "name",
    "priority",
    "webhookUrl",
    "cron",
    "params",
    "completion_window",
    "metadata",
    "budget_usd",
    "endpoint",
)
_QUOTE_CHARS = 64


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """The job-level fields of a submission (:data:`JOB_FIELDS`), validated.

    ``name`` is None when absent (the caller defaults it); ``params_json`` is the
    ``params`` object as compact JSON text (``{}`` when absent); ``completion_window``
    is how long each job (each run of a cron template) has to finish (None: no limit);
    ``metadata_json`` the ``metadata`` pairs as compact JSON text (None when absent);
    ``budget_usd`` what the job's rows may cost (None: no budget).
    """

    name: str | None
    model: str
    priority: int
    webhook_url: str | None
    cron: str | None
    params_json: str = "{}"
    completion_window: timedelta | None = None
    metadata_json: str | None = None
    budget_usd: float | None = None
    endpoint: str = CHAT


def validate_batch_options(
    payload: Mapping[str, object], known_models: Container[str]
) -> BatchOptions:
    """Validate the job-level fields (:data:`JOB_FIELDS`); a None value is absent.

    A form-based caller converts its text fields to these values first (``priority``
    with :func:`parse_priority_field`, JSON-valued ones decoded) and leaves out the
    fields it treats as absent.
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
    params_json = validate_params(payload.get("params"))
    raw_window = payload.get("completion_window")
    window = None if raw_window is None else completion_window(raw_window, "completion_window")
    metadata_json = validate_metadata(payload.get("metadata"))
    budget = validate_budget(payload.get("budget_usd"))
    endpoint = validate_endpoint(payload.get("endpoint"))
    if endpoint != CHAT and params_json != "{}":
        raise invalid(
            f"params is only for {CHAT} jobs: a row of {endpoint} is its whole body", "params"
        )
    return BatchOptions(
        name,
        model,
        priority,
        webhook_url,
        cron,
        params_json,
        window,
        metadata_json,
        budget,
        endpoint,
    )


def validate_endpoint(value: object) -> str:
    """A job's ``endpoint``: one Relay runs (absent or null: chat completions)."""
    if value is None:
        return CHAT
    if type(value) is not str or value not in ALL_ENDPOINTS:
        raise invalid(f"endpoint must be one of {', '.join(ALL_ENDPOINTS)}", "endpoint")
    return value


def validate_budget(value: object, param: str = "budget_usd") -> float | None:
    """A budget in USD: a number greater than 0 and at most 1,000,000 (None: absent).

    A boolean, a string, NaN or an infinity is a 400 naming ``param``.
    """
    if value is None:
        return None
    if type(value) is not int and type(value) is not float:
        raise invalid(f"{param} must be a number (USD)", param)
    if not (math.isfinite(value) and 0 < value <= MAX_BUDGET_USD):
        raise invalid(f"{param} must be greater than 0 and at most {MAX_BUDGET_USD:,} (USD)", param)
    return float(value)


def parse_budget_field(text: str) -> float:
    """A form field's budget: a JSON number (``12``, ``0.5``, ``1e3``), then the rules of
    :func:`validate_budget`; anything else is a 400 naming ``budget_usd``."""
    stripped = text.strip()
    try:
        value = orjson.loads(stripped) if len(stripped) <= _MAX_NUMBER_CHARS else None
    except orjson.JSONDecodeError:
        value = None
    if type(value) is not int and type(value) is not float:
        raise invalid("budget_usd must be a number (USD)", "budget_usd")
    budget = validate_budget(value)
    assert budget is not None
    return budget


def _validate_model(model: object, known_models: Container[str]) -> str:
    if model is _ABSENT:
        raise invalid("model is required", "model")
    if type(model) is not str:
        raise invalid("model must be a string", "model")
    if model not in known_models:
        raise invalid(f"model {quote(model)} is unknown{known_list(known_models)}", "model")
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
    if not is_unicode(name):  # a lone surrogate: the ledger cannot store it
        raise invalid("name must be valid Unicode text", "name")
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


def validate_webhook_url(url: object, param: str = "webhookUrl") -> str:
    """An absolute http(s) URL with a host, at most 2048 characters; returned as given
    (a 400 naming ``param`` otherwise)."""
    if type(url) is not str:
        raise invalid(f"{param} must be a string", param)
    if len(url) > MAX_WEBHOOK_URL_CHARS:
        raise invalid(f"{param} must be at most {MAX_WEBHOOK_URL_CHARS} characters", param)
    if not _is_http_url(url):
        raise invalid(f"{param} must be an absolute http or https URL", param)
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
        raise invalid(f"cron expression {quote(normalized)} is not valid", "cron")
    try:
        croniter(normalized).get_next(float)
    except CroniterBadDateError:  # every field valid, but no date matches ("0 0 30 2 *")
        raise invalid(f"cron expression {quote(normalized)} never fires", "cron") from None
    except CroniterError:
        raise invalid(f"cron expression {quote(normalized)} is not valid", "cron") from None
    return normalized


def _has_random_field(fields: list[str]) -> bool:
    # No month or weekday name starts with R or H, so a leading R/H is croniter's
    # random ("R") or hashed ("H") extension in any field.
    return any(part[:1] in ("R", "r", "H", "h") for f in fields for part in f.split(","))


def completion_window(value: object, param: str) -> timedelta:
    """A completion window: ``"<n>s"``, ``"<n>m"``, ``"<n>h"`` or ``"<n>d"`` from 1s to 7d.

    ``n`` is ASCII digits without sign or surrounding space; ``"24h"`` (OpenAI's only
    value) is one of them. Anything else is a 400 naming ``param``.
    """
    if type(value) is not str:
        raise invalid(f'{param} must be a string such as "24h"', param)
    window = parse_duration(value, _MAX_WINDOW_DIGITS)
    if window is None:
        raise invalid(
            f'{param} {quote(value)} is not a duration: write {SPELLING} (for example "24h")',
            param,
        )
    if not MIN_COMPLETION_WINDOW <= window <= MAX_COMPLETION_WINDOW:
        raise invalid(f"{param} must be from 1s to 7d, got {quote(value)}", param)
    return window


def validate_metadata(value: object, param: str = "metadata") -> str | None:
    """Metadata as ``batches.metadata`` stores it: compact JSON of string pairs, or None.

    None and ``{}`` are absent. At most 16 pairs, keys of 1 to 64 characters and values
    of at most 512 (OpenAI's limits), no NUL; anything else is a 400 naming the field.
    """
    if value is None:
        return None
    if type(value) is not dict:
        raise invalid(f"{param} must be an object of string keys and string values", param)
    if len(value) > MAX_METADATA_PAIRS:
        raise invalid(f"{param} must have at most {MAX_METADATA_PAIRS} pairs", param)
    for key, item in value.items():
        _check_metadata_pair(key, item, param)
    return orjson.dumps(value).decode() if value else None


def _check_metadata_pair(key: str, item: object, param: str) -> None:
    if not is_unicode(key):  # a lone surrogate: not echoed in the path
        raise invalid(f"{param} keys must be valid Unicode text", param)
    if not 0 < len(key) <= MAX_METADATA_KEY_CHARS or "\x00" in key:
        raise invalid(
            f"{param} keys must be 1 to {MAX_METADATA_KEY_CHARS} characters without NUL,"
            f" got {quote(key)}",
            param,
        )
    path = f"{param}.{key}"
    if type(item) is not str:
        raise invalid(f"{path} must be a string", path)
    if len(item) > MAX_METADATA_VALUE_CHARS or "\x00" in item:
        raise invalid(
            f"{path} must be at most {MAX_METADATA_VALUE_CHARS} characters without NUL", path
        )
    if not is_unicode(item):
        raise invalid(f"{path} must be valid Unicode text", path)


def quote(value: str) -> str:
    """A value echoed in a message: quoted, and cut short if long."""
    if len(value) > _QUOTE_CHARS:
        value = value[:_QUOTE_CHARS] + "…"
    return repr(value)
