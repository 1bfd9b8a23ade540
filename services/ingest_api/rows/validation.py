"""Validation of a batch submission's rows, and of a whole ``POST /v1/batches`` body.

Pure functions from a decoded JSON body to a typed :class:`BatchSpec`: no aiohttp and no
asyncpg here, so unit tests call them directly. Every surface that creates a job checks
its rows with :func:`request_rows` (its job-level fields: :mod:`.job_fields`).

A bad row raises :class:`RowRejected`
carrying a :class:`RowError` (row index, field within the row, message): each surface
renders it in its own terms, ``POST /v1/batches`` as a 400 naming the field with 0-based
indexes (``requests[3].messages``), the upload as a file and line.

The row loop runs on bodies of up to 1,000,000 rows, so it is written for speed: exact
``type() is`` checks, locals bound before the loop, no exception or regex on the happy
path, one ``orjson.dumps`` per row; the precise error for a bad row is worked out on a
separate slow path only once the fast check has failed.

Why a fast path beside the model, which is the rule: timed in process on 50,000 rows,
with the fast checks on and then forced off the way the agreement test forces them, a
plain row costs 10 µs with it and 32 µs through the model alone, a row with scalar
parameters 18 µs against 53 µs, and an Anthropic request 7 µs against 94 µs; without it
the 50,000 rows/s floor of ``tests/bench/test_row_validation.py`` fails. The fast checks
only ever take a subset of what the model accepts, and
``tests/unit/test_fast_path_agreement.py`` runs the same good and bad rows both ways and
requires the same rows, bytes and errors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass

import orjson

from relay_batches.dialects.chat import (
    MAX_CUSTOM_ID_CHARS,
    ROLES,
    RequestRow,
    check_row,
    is_unicode,
    plain_messages,
    plain_params,
    stored_request,
    unencodable_path,
)
from relay_batches.dialects.endpoints import ALL_ENDPOINTS, CHAT, check_body, stored_body
from relay_batches.errors import ApiError, invalid
from relay_batches.services.ingest_api.rows.job_fields import (
    JOB_FIELDS,
    BatchOptions,
    quote,
    validate_batch_options,
)
from relay_batches.services.ingest_api.rows.scan import WINDOW_BYTES, JsonScanner, NotJson

SUBMIT_FIELDS = frozenset({*JOB_FIELDS, "requests"})
ROW_FIELDS = frozenset(RequestRow.model_fields)  # the keys a request row may carry
_PLAIN_FIELDS = frozenset({"custom_id", "messages"})  # a row the fast path may take
NO_MODELS: frozenset[str] = frozenset()
__all__ = ["MAX_CUSTOM_ID_CHARS", "ROLES"]  # re-exported: the rules of a row


class KnownModels:
    """``alias in KnownModels(pred)``: the router's aliases as a container for validation."""

    def __init__(self, known: Callable[[str], bool]) -> None:
        self._known = known

    def __contains__(self, alias: object) -> bool:
        return isinstance(alias, str) and self._known(alias)


@dataclass(frozen=True, slots=True)
class SubmitLimits:
    """Configurable limits of one submission."""

    max_rows: int = 1_000_000
    max_content_bytes: int = 1024 * 1024  # per message content, UTF-8 bytes
    max_row_bytes: int = 8 * 1024 * 1024  # per row: a line of a file, a request's JSON


@dataclass(frozen=True, slots=True)
class RowInput:
    """One validated request row.

    ``request_json`` is the row's chat request as ``batch_rows.request`` stores it
    (:func:`dialects.chat.stored_request`): for a row of ``{role, content: str}`` messages
    only, its messages list re-encoded compactly by orjson with sorted keys,
    ``[{"content":"…","role":"user"}]``; else the object ``{"messages": […], …}``.
    ``model`` is the row's own alias (None: the job's); ``endpoint`` the OpenAI
    endpoint its request is a body of (chat: the default).
    """

    custom_id: str
    request_json: str
    model: str | None = None
    endpoint: str = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """A validated ``POST /v1/batches`` body: its job-level fields and its rows."""

    options: BatchOptions
    rows: list[RowInput]


@dataclass(frozen=True, slots=True)
class RowError:
    """What is wrong with one request row, as data for each surface to render.

    ``field`` is the path inside the row (``messages[1].role``; empty for the row
    itself) and ``message`` the complaint that follows it. A duplicate custom id has a
    message ending in ``duplicates`` and ``earlier``, the index of the row it repeats.
    """

    index: int
    field: str
    message: str
    earlier: int | None = None


class RowRejected(Exception):
    """Raised by :func:`request_rows` for the first bad row."""

    def __init__(self, error: RowError) -> None:
        super().__init__(f"row {error.index}: {error.field} {error.message}")
        self.error = error


# --- body --------------------------------------------------------------------------


def decode_json_object(raw: bytes | bytearray) -> dict[str, object]:
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
    """Validate a decoded ``POST /v1/batches`` body; an unknown top-level key is a 400."""
    if type(payload) is not dict:
        raise invalid("request body must be a JSON object")
    for key in payload:
        check_submit_field(key)
    options = validate_batch_options(payload, known_models)
    if "requests" not in payload:
        raise invalid("requests is required", "requests")
    rows = validate_request_rows(payload["requests"], limits, known_models, options.endpoint)
    return BatchSpec(options, rows)


def check_submit_field(key: str) -> None:
    """400 naming ``key`` unless it is a field of ``POST /v1/batches``."""
    if key not in SUBMIT_FIELDS:
        raise invalid(
            f"{quote(key)} is not a field of a batch (fields: {', '.join(sorted(SUBMIT_FIELDS))})",
            key,
        )


def scan_submit(
    raw: bytes | bytearray,
    limits: SubmitLimits,
    known_models: Container[str],
    window: int = WINDOW_BYTES,
) -> BatchSpec:
    """Decode and validate a ``POST /v1/batches`` body in one pass, row by row.

    Only the validated rows are kept, never the decoded body (see :mod:`.scan`). The
    errors and their order are those of :func:`decode_json_object` then
    :func:`validate_submit`: a bad row is reported after the job-level fields. The text
    is decoded ``window`` bytes at a time.
    """
    scanner = JsonScanner(raw, window)
    try:
        return _scan_submit(scanner, limits, known_models)
    except NotJson as exc:
        if exc.nested:
            raise invalid("request body must be JSON nested at most 1,000 levels deep") from None
        raise invalid("request body must be JSON") from None


def _scan_submit(
    scanner: JsonScanner, limits: SubmitLimits, known_models: Container[str]
) -> BatchSpec:
    if scanner.peek() != "{":
        scanner.value()  # JSON, but not an object (else NotJson)
        if not scanner.at_end():
            raise NotJson()
        raise invalid("request body must be a JSON object")
    fields: dict[str, object] = {}
    rows: list[RowInput] | None = None
    row_error: ApiError | None = None
    scanned_as = CHAT  # the endpoint the streamed rows were checked as
    for key in scanner.members():
        check_submit_field(key)
        if key != "requests":
            fields[key] = scanner.value()
        elif scanner.peek() != "[":
            fields[key] = scanner.value()
            rows, row_error = None, None
        else:
            given = fields.get("endpoint")
            scanned_as = given if type(given) is str and given in ALL_ENDPOINTS else CHAT
            rows, row_error = _scan_rows(scanner, limits, known_models, scanned_as)
    if not scanner.at_end():
        raise NotJson()
    options = validate_batch_options(fields, known_models)
    if rows is not None or row_error is not None:
        if options.endpoint != scanned_as:
            raise invalid(
                "endpoint must come before requests in the body (rows are checked as they"
                " stream in)",
                "endpoint",
            )
    if row_error is not None:
        raise row_error
    if rows is None:
        if "requests" not in fields:
            raise invalid("requests is required", "requests")
        rows = validate_request_rows(fields["requests"], limits, known_models, options.endpoint)
    return BatchSpec(options, rows)


def _scan_rows(
    scanner: JsonScanner, limits: SubmitLimits, known_models: Container[str], endpoint: str
) -> tuple[list[RowInput] | None, ApiError | None]:
    """The rows of a streamed ``requests`` array, or the error of its first bad row
    (the rest of the array is then parsed and dropped, to find the body's end)."""
    error: ApiError | None = None
    rows: list[RowInput] | None = None
    elements = scanner.elements()
    try:
        sized = sized_elements(scanner, elements, limits.max_row_bytes)
        rows = request_rows(
            at_most(sized, limits.max_rows),
            limits.max_content_bytes,
            known_models,
            endpoint=endpoint,
        )
    except RowRejected as exc:
        error = row_api_error(exc.error)
    except ApiError as exc:
        error = exc
    deque(elements, maxlen=0)  # parse the rest of the array to its end, keeping nothing
    if rows is not None and not rows:
        error = invalid("requests must be a non-empty array", "requests")
    return rows, error


# --- rows --------------------------------------------------------------------------


def validate_request_rows(
    requests: object,
    limits: SubmitLimits,
    known_models: Container[str] = NO_MODELS,
    endpoint: str = CHAT,
) -> list[RowInput]:
    """The ``requests`` of ``POST /v1/batches``: a bad row is a 400 naming its field."""
    requests = _check_row_list(requests, limits)
    try:
        return request_rows(requests, limits.max_content_bytes, known_models, endpoint=endpoint)
    except RowRejected as exc:
        raise row_api_error(exc.error) from None


def row_api_error(error: RowError, prefix: str = "requests") -> ApiError:
    """``error`` as a 400 whose ``param`` is its path: ``requests[3].messages``."""
    param = _row_path(prefix, error.index, error.field)
    message = f"{param} {error.message}"
    if error.earlier is not None:
        message += f" {_row_path(prefix, error.earlier, error.field)}"
    return invalid(message, param)


def _row_path(prefix: str, index: int, field: str) -> str:
    return f"{prefix}[{index}].{field}" if field else f"{prefix}[{index}]"


def request_rows(
    requests: Iterable[object],
    max_bytes: int,
    known_models: Container[str] = NO_MODELS,
    start: int = 0,
    unique: bool = True,
    endpoint: str = CHAT,
) -> list[RowInput]:
    """Validate request rows, default their custom ids and encode their requests.

    :class:`RowRejected` for the first bad row; ``max_bytes`` bounds each message's
    content in UTF-8 bytes, ``known_models`` the aliases a row's ``model`` may name.
    ``requests`` may be a stream (see :func:`at_most`). ``start`` is the index of the
    first of them (a chunk of a longer stream); ``unique=False`` leaves the check that
    custom ids do not repeat to the caller (who sees every chunk).

    A plain row (``custom_id?`` and ``{role, content: str}`` messages, perhaps scalar
    parameters) is checked here and by :func:`dialects.chat.plain_messages` and
    :func:`dialects.chat.plain_params`, a subset of what :class:`dialects.chat.RequestRow`
    accepts; any other row, or a plain one failing that check, goes to the model itself,
    which accepts it or gives the precise error. A row of another ``endpoint`` than chat
    is checked by that endpoint's row model (:mod:`relay_batches.dialects.endpoints`).
    """
    if endpoint != CHAT:
        bodies = [
            _body_row(i, req, endpoint, known_models) for i, req in enumerate(requests, start)
        ]
        if unique:
            _check_unique([row.custom_id for row in bodies])
        return bodies
    plain = plain_messages
    plain_fields = _PLAIN_FIELDS
    dumps = orjson.dumps
    sort_keys = orjson.OPT_SORT_KEYS
    rows: list[RowInput] = []
    ids: list[str] = []
    add_row = rows.append
    add_id = ids.append
    for i, req in enumerate(requests, start):
        if type(req) is dict and plain_fields.issuperset(req):
            messages = req.get("messages")
            if type(messages) is not list or not messages:
                raise RowRejected(RowError(i, "messages", "must be a non-empty array"))
            custom_id = req.get("custom_id")
            if custom_id is None:
                custom_id = f"row-{i + 1}"
            if (
                plain(messages, max_bytes)
                and type(custom_id) is str
                and len(custom_id) <= MAX_CUSTOM_ID_CHARS
                and "\x00" not in custom_id  # Postgres text cannot hold NUL
                and is_unicode(custom_id)
            ):
                try:  # sorted keys: the same text whatever order the client sent
                    encoded = dumps(messages, option=sort_keys).decode()
                except TypeError:  # lone surrogates: only from a payload not built by orjson
                    field = unencodable_path({"messages": messages})
                    raise RowRejected(RowError(i, field, "must be valid Unicode text")) from None
                add_id(custom_id)
                add_row(RowInput(custom_id, encoded))
                continue
        elif type(req) is dict and plain_params(req, plain_fields):
            row = _fast_row(i, req, max_bytes)
            if row is not None:
                add_id(row.custom_id)
                add_row(row)
                continue
        # Not a plain row (or the fast check failed): the model accepts it or says why.
        row = _model_row(i, req, max_bytes, known_models)
        add_id(row.custom_id)
        add_row(row)
    if unique:
        _check_unique(ids)
    return rows


def _fast_row(index: int, req: dict[str, object], max_bytes: int) -> RowInput | None:
    """A row of plain messages and scalar parameters (:func:`dialects.chat.plain_params`),
    stored as the model path stores it; None when the fast check does not hold."""
    custom_id = req.get("custom_id")
    if custom_id is None:
        custom_id = f"row-{index + 1}"
    if not (
        plain_messages(req.get("messages"), max_bytes)
        and type(custom_id) is str
        and len(custom_id) <= MAX_CUSTOM_ID_CHARS
        and "\x00" not in custom_id
        and is_unicode(custom_id)
    ):
        return None
    # No null anywhere, a parameter beside the messages: stored_request's object form.
    kept = {key: value for key, value in req.items() if key != "custom_id"}
    try:
        request_json = orjson.dumps(kept, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # lone surrogates: only from a payload not built by orjson
        field = unencodable_path(req)
        raise RowRejected(RowError(index, field, "must be valid Unicode text")) from None
    return RowInput(custom_id, request_json)


def _model_row(index: int, req: object, max_bytes: int, known_models: Container[str]) -> RowInput:
    """A row checked by :class:`dialects.chat.RequestRow`: stored, or :class:`RowRejected`."""
    problem = check_row(RequestRow, req, max_bytes, known_models)
    if problem is not None:
        raise RowRejected(RowError(index, *problem))
    assert type(req) is dict  # check_row refuses anything else
    custom_id = req.get("custom_id")
    try:
        request_json = stored_request(req)
    except TypeError:  # lone surrogates: only from a payload not built by orjson
        field = unencodable_path(req)
        raise RowRejected(RowError(index, field, "must be valid Unicode text")) from None
    return RowInput(
        f"row-{index + 1}" if custom_id is None else custom_id, request_json, req.get("model")
    )


def _body_row(index: int, req: object, endpoint: str, known_models: Container[str]) -> RowInput:
    """A native row of ``endpoint`` (embeddings, …): stored, or :class:`RowRejected`."""
    problem = check_body(endpoint, req, known_models, row=True)
    if problem is not None:
        raise RowRejected(RowError(index, *problem))
    assert type(req) is dict  # check_body refuses anything else
    custom_id = req.get("custom_id")
    try:
        request_json = stored_body(endpoint, req)
    except TypeError:  # lone surrogates: only from a payload not built by orjson
        field = unencodable_path(req)
        raise RowRejected(RowError(index, field, "must be valid Unicode text")) from None
    custom_id = f"row-{index + 1}" if custom_id is None else custom_id
    return RowInput(custom_id, request_json, req.get("model"), endpoint)


def check_unique_ids(rows: Sequence[RowInput]) -> None:
    """:class:`RowRejected` naming the first row whose custom id repeats an earlier one."""
    _check_unique([row.custom_id for row in rows])


def duplicate_error(index: int, custom_id: str, earlier: int) -> RowError:
    """The error of row ``index``, whose custom id repeats row ``earlier``'s."""
    return RowError(index, "custom_id", f"{quote(custom_id)} duplicates", earlier)


def sized_elements(
    scanner: JsonScanner, elements: Iterator[object], max_bytes: int
) -> Iterator[object]:
    """``elements`` (of ``scanner``'s array), with :class:`RowRejected` for the first
    whose JSON text is over ``max_bytes``."""
    for i, element in enumerate(elements):
        if scanner.last_bytes(max_bytes) > max_bytes:
            raise RowRejected(RowError(i, "", f"is larger than {max_bytes} bytes"))
        yield element


def at_most(requests: Iterable[object], max_rows: int) -> Iterator[object]:
    """``requests``, with a 400 (``requests``) as soon as there are over ``max_rows``."""
    for i, req in enumerate(requests):
        if i >= max_rows:
            raise _too_many_rows(max_rows)
        yield req


def _check_row_list(requests: object, limits: SubmitLimits) -> list[object]:
    if type(requests) is not list or not requests:
        raise invalid("requests must be a non-empty array", "requests")
    if len(requests) > limits.max_rows:
        raise _too_many_rows(limits.max_rows)
    return requests


def _too_many_rows(max_rows: int) -> ApiError:
    return invalid(f"requests must hold at most {max_rows:,} requests per batch", "requests")


def _check_unique(ids: list[str]) -> None:
    if len(set(ids)) != len(ids):
        raise RowRejected(_duplicate_error(ids))


def _duplicate_error(ids: list[str]) -> RowError:
    first: dict[str, int] = {}
    for i, custom_id in enumerate(ids):
        if custom_id in first:
            return duplicate_error(i, custom_id, first[custom_id])
        first[custom_id] = i
    return RowError(0, "custom_id", "must be unique")  # unreachable: the caller saw a repeat
