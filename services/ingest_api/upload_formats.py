"""Reading an uploaded ``.csv`` or ``.jsonl`` file into validated request rows.

Pure functions, no aiohttp: the upload endpoint calls :func:`parse_upload_file` on each
file and turns a :class:`LineError` into a 400 naming the file and the line.

``.csv``: one prompt per record, each becoming one ``user`` message; quoted fields may
hold commas, quotes (doubled) and newlines (the ``csv`` module, strict). A record must
have exactly one field: a prompt with a comma has to be quoted. Blank lines are skipped.
A first record whose only field is ``prompt`` (any case) is a header and skipped. Custom
ids default to ``row-1``, ``row-2``, … by record.

``.jsonl``: one request object ``{custom_id?, messages}`` per line, the same rules as a
``requests`` element of ``POST /v1/batches``; blank lines are skipped.

Both are UTF-8 (a leading byte-order mark is ignored). Line numbers are 1-based physical
lines of the file; a CSV record spanning several lines is reported at its first line.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from relay_batches.services.ingest_api.validation import (
    RowError,
    RowInput,
    RowRejected,
    SubmitLimits,
    request_rows,
)

FORMATS = (".csv", ".jsonl")
CSV_HEADER = "prompt"


class LineError(Exception):
    """What is wrong with an uploaded file, and on which line (None: the whole file)."""

    def __init__(self, line: int | None, reason: str) -> None:
        super().__init__(reason)
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RawRow:
    """One request object read from a file, with the line it starts on."""

    line: int
    request: object


def file_format(filename: str) -> str | None:
    """``.csv`` or ``.jsonl`` from the file name (any case), else None."""
    lowered = filename.lower()
    return next((ext for ext in FORMATS if lowered.endswith(ext)), None)


def parse_upload_file(
    filename: str, data: bytes | bytearray, limits: SubmitLimits
) -> list[RowInput]:
    """Validated rows of one uploaded file; :class:`LineError` on the first bad line.

    The file is read line by line and each request validated as it is read, so only the
    validated rows are kept (never every decoded request at once).
    """
    kind = file_format(filename)
    if kind is None:
        raise LineError(None, f"file name must end in {' or '.join(FORMATS)}")
    text = _decode(data)
    lines: list[int] = []  # the line each request starts on, by row index
    source = _csv_rows(text, limits) if kind == ".csv" else _jsonl_rows(text, limits)
    try:
        rows = request_rows(_requests(source, lines), limits.max_content_bytes)
    except RowRejected as exc:
        raise _line_error(exc.error, lines) from None
    if not rows:
        raise LineError(None, "the file holds no rows")
    return rows


def _requests(source: Iterator[RawRow], lines: list[int]) -> Iterator[object]:
    for raw in source:
        lines.append(raw.line)
        yield raw.request


def _decode(data: bytes | bytearray) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise LineError(line, "not valid UTF-8 text") from None


def _too_many(limits: SubmitLimits) -> LineError:
    return LineError(None, f"a file may hold at most {limits.max_rows:,} rows (one job each)")


def _csv_rows(text: str, limits: SubmitLimits) -> Iterator[RawRow]:
    """One ``user`` message per CSV record."""
    # The field limit counts characters; content is limited in bytes later, and a
    # character is at least one byte, so this never refuses a prompt that would pass.
    csv.field_size_limit(max(limits.max_content_bytes, 1))
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    count = 0
    while True:
        line = reader.line_num + 1
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise LineError(line, _csv_reason(str(exc), limits)) from None
        if not record or (count == 0 and _is_header(record, line)):
            continue
        if len(record) != 1:
            raise LineError(
                line,
                f"expected one field (the prompt), found {len(record)};"
                " put a prompt that holds commas in double quotes",
            )
        if not record[0].strip():
            raise LineError(line, "the prompt is empty")
        count += 1
        if count > limits.max_rows:
            raise _too_many(limits)
        yield RawRow(line, {"messages": [{"role": "user", "content": record[0]}]})


def _is_header(record: list[str], line: int) -> bool:
    return line == 1 and len(record) == 1 and record[0].strip().lower() == CSV_HEADER


def _csv_reason(message: str, limits: SubmitLimits) -> str:
    if "field larger than field limit" in message:
        return f"the prompt is longer than {limits.max_content_bytes} bytes"
    if "unexpected end of data" in message:
        return "a quoted field is not closed (missing double quote)"
    return f"not valid CSV ({message})"


def _jsonl_rows(text: str, limits: SubmitLimits) -> Iterator[RawRow]:
    """One request object per line."""
    # Split on "\n" only: str.splitlines() would also split on U+2028 and friends,
    # which may stand unescaped inside a JSON string.
    count = 0
    for number, line in _lines(text):
        if not line.strip():
            continue
        try:
            request = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise LineError(number, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        if type(request) is not dict:
            raise LineError(number, "must be a JSON object {custom_id?, messages}")
        count += 1
        if count > limits.max_rows:
            raise _too_many(limits)
        yield RawRow(number, request)


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """``enumerate(text.split("\\n"), start=1)`` without building the list."""
    start, number = 0, 1
    while start <= len(text):
        end = text.find("\n", start)
        if end < 0:
            end = len(text)
        yield number, text[start:end]
        start, number = end + 1, number + 1


def _line_error(error: RowError, lines: list[int]) -> LineError:
    """``error`` of the row read from ``lines[error.index]``, in line terms."""
    reason = f"{error.field} {error.message}" if error.field else error.message
    if error.earlier is not None:
        reason += f" line {lines[error.earlier]}"
    return LineError(lines[error.index], reason)
