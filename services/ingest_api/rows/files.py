"""Reading an uploaded ``.csv`` or ``.jsonl`` file into validated request rows.

Pure functions, no aiohttp: the upload endpoint reads each spooled file a chunk at a
time through :class:`FileReader` (tests and benches call :func:`parse_upload_file` on
bytes) and turns a :class:`LineError` into a 400 naming the file and the line.

``.csv``: one prompt per record, each becoming one ``user`` message; quoted fields may
hold commas, quotes (doubled) and newlines (the ``csv`` module, strict). Without a header
row a record must have exactly one field: a prompt with a comma has to be quoted. A first
record naming the prompt column (``prompt``, any case, or the chosen one) is a header
row: the prompt and custom id are then read from their columns
(:mod:`.csv_columns`). Blank lines are skipped. Custom ids default to ``row-1``,
``row-2``, … by record.

``.jsonl``: one request per line, blank lines skipped, in one of three formats told
apart by the file's first line (:func:`line_format`), every line then in that format:

- Relay's own, ``{custom_id?, messages, ...row fields}``: a ``requests`` element of
  ``POST /v1/batches``;
- OpenAI's Batch input, ``{custom_id, method, url, body}``
  (:func:`.row_formats.openai_line_row`);
- Anthropic's Message Batches request, ``{custom_id, params}``
  (:func:`.row_formats.anthropic_request_row`).

A row may name its own ``model`` (an OpenAI or Anthropic line always does).

Both are UTF-8 (a leading byte-order mark is ignored). Line numbers are 1-based physical
lines of the file; a CSV record spanning several lines is reported at its first line.

A file is never decoded whole, nor held whole: a ``str`` holding one emoji takes 4 bytes
per character, so a 100 MiB file would become a 400 MiB string. Its bytes are checked
to be UTF-8 a window at a time, then read line by line, each line decoded on its own,
and validated a chunk of rows at a time (:class:`FileReader`): the upload stores each
chunk before it reads the next.
"""

from __future__ import annotations

import codecs
import csv
import io
from array import array
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import orjson

from relay_batches.dialects.endpoints import CHAT
from relay_batches.services.ingest_api.rows.csv_columns import (
    NO_COLUMNS,
    CsvColumns,
    CsvLayout,
    RecordError,
)
from relay_batches.services.ingest_api.rows.jsonl import file_lines
from relay_batches.services.ingest_api.rows.row_formats import (
    anthropic_request_row,
    openai_line_row,
)
from relay_batches.services.ingest_api.rows.validation import (
    NO_MODELS,
    RowError,
    RowInput,
    RowRejected,
    SubmitLimits,
    check_unique_ids,
    duplicate_error,
    request_rows,
)

FORMATS = (".csv", ".jsonl")
RELAY, OPENAI, ANTHROPIC = "a Relay request", "an OpenAI batch line", "an Anthropic request"
_SHAPES = {
    RELAY: "{custom_id?, messages}",
    OPENAI: "{custom_id, method, url, body}",
    ANTHROPIC: "{custom_id, params}",
}
DialectRow = Callable[[int, object, SubmitLimits, Container[str]], RowInput]
_DIALECT_ROWS: dict[str, DialectRow] = {OPENAI: openai_line_row, ANTHROPIC: anthropic_request_row}
CHECK_WINDOW = 1024 * 1024  # bytes decoded at a time to check a file is UTF-8
CHUNK_ROWS = 5000  # rows validated (and stored by the upload) at a time
CHUNK_BYTES = 1024 * 1024  # about this much text of them, at most


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
    size: int  # bytes of text it was read from


def file_format(filename: str) -> str | None:
    """``.csv`` or ``.jsonl`` from the file name (any case), else None."""
    lowered = filename.lower()
    return next((ext for ext in FORMATS if lowered.endswith(ext)), None)


def line_format(request: dict[str, object]) -> str:
    """Which format a decoded ``.jsonl`` line is in: :data:`OPENAI` if it has any of
    ``body``, ``method``, ``url``; else :data:`ANTHROPIC` if it has ``params``; else
    :data:`RELAY`."""
    if "body" in request or "method" in request or "url" in request:
        return OPENAI
    return ANTHROPIC if "params" in request else RELAY


def parse_upload_file(
    filename: str,
    data: bytes | bytearray,
    limits: SubmitLimits,
    known_models: Container[str] = NO_MODELS,
    columns: CsvColumns = NO_COLUMNS,
) -> list[RowInput]:
    """Validated rows of one uploaded file held in memory; :class:`LineError` on the
    first bad line (a repeated custom id included). ``known_models`` are the aliases a
    row's own ``model`` may name; ``columns`` a CSV file's prompt and id columns. The
    upload endpoint streams a spooled file through :class:`FileReader` instead."""
    rows: list[RowInput] = []
    with io.BufferedReader(_ByteReader(data)) as source:
        reader = FileReader(filename, source, limits, known_models, columns=columns)
        while chunk := reader.next_chunk():
            rows += chunk
    try:
        check_unique_ids(rows)
    except RowRejected as exc:
        raise reader.line_error(exc.error) from None
    if not rows:
        raise LineError(None, "the file holds no rows")
    return rows


class FileReader:
    """One uploaded file read a chunk of validated rows at a time, so only a chunk is
    ever held: its lines (or records) decoded and validated as they are read.

    Blocking and CPU-bound: callers run it in a worker thread, one call at a time.
    ``source`` is at the file's start; it is checked to be UTF-8 first (read through
    once, then rewound), so it must be seekable. Custom ids are not checked to be unique
    across chunks: the caller does that (the upload, on the stored rows) and words the
    repeat with :meth:`line_error`.
    """

    def __init__(
        self,
        filename: str,
        source: BinaryIO,
        limits: SubmitLimits,
        known_models: Container[str] = NO_MODELS,
        endpoint: str | None = None,
        columns: CsvColumns = NO_COLUMNS,
    ) -> None:
        kind = file_format(filename)
        if kind is None:
            raise LineError(None, f"file name must end in {' or '.join(FORMATS)}")
        _check_utf8(source)
        self._limits = limits
        self._known = known_models
        # The batch's endpoint: the form's, else the first OpenAI line's url (chat).
        self.endpoint = endpoint
        self.lines = array("q")  # the line each row starts on, by row index
        self._formats: list[str] = []  # the file's format, once its first line is read
        self._source = (
            _csv_rows(source, limits, columns)
            if kind == ".csv"
            else _jsonl_rows(source, limits, self._formats)
        )
        self.rows = 0  # rows read so far

    def next_chunk(
        self, max_rows: int | None = None, max_bytes: int | None = None
    ) -> list[RowInput]:
        """The next validated rows, at most ``max_rows`` (default :data:`CHUNK_ROWS`) and
        about ``max_bytes`` of text (:data:`CHUNK_BYTES`; at least one row); empty at the
        end. :class:`LineError` on a bad line."""
        max_rows = CHUNK_ROWS if max_rows is None else max_rows
        max_bytes = CHUNK_BYTES if max_bytes is None else max_bytes
        requests: list[object] = []
        size = 0
        for raw in self._source:
            self.lines.append(raw.line)
            requests.append(raw.request)
            size += raw.size
            if len(requests) >= max_rows or size >= max_bytes:
                break
        if not requests:
            return []
        start, self.rows = self.rows, self.rows + len(requests)
        try:
            return self._validated(requests, start)
        except RowRejected as exc:
            raise self.line_error(exc.error) from None

    def _validated(self, requests: list[object], start: int) -> list[RowInput]:
        dialect_row = _DIALECT_ROWS.get(self._formats[0]) if self._formats else None
        if dialect_row is None:
            return request_rows(
                requests,
                self._limits.max_content_bytes,
                self._known,
                start,
                unique=False,
                endpoint=self.endpoint or CHAT,
            )
        rows = [
            dialect_row(i, request, self._limits, self._known)
            for i, request in enumerate(requests, start)
        ]
        for i, row in enumerate(rows, start):
            if self.endpoint is None:
                self.endpoint = row.endpoint
            elif row.endpoint != self.endpoint:
                message = f"is a {row.endpoint} request: the batch runs {self.endpoint} only"
                raise RowRejected(RowError(i, "", message))
        return rows

    def line_error(self, error: RowError) -> LineError:
        """``error`` of a row read so far, in line terms."""
        return _line_error(error, self.lines)

    def duplicate(self, custom_id: str, index: int, earlier: int) -> LineError:
        """The error of row ``index``, whose custom id repeats row ``earlier``'s."""
        return self.line_error(duplicate_error(index, custom_id, earlier))


def _check_utf8(source: BinaryIO) -> None:
    """:class:`LineError` naming the line of the first byte that is not UTF-8; ``source``
    is read through a window at a time, then rewound to where it was."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    begin = source.tell()
    lines = 1
    while window := source.read(CHECK_WINDOW):
        try:
            decoder.decode(window)
        except UnicodeDecodeError as exc:
            at = max(exc.start - len(decoder.getstate()[0]), 0)
            raise LineError(lines + window.count(b"\n", 0, at), "not valid UTF-8 text") from None
        lines += window.count(b"\n")
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise LineError(lines, "not valid UTF-8 text") from None
    source.seek(begin)


class _ByteReader(io.RawIOBase):
    """A read-only, seekable file over ``data`` without copying it (``io.BytesIO``
    copies a bytearray)."""

    def __init__(self, data: bytes | bytearray) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def readable(self) -> bool:
        """Always: this file is for reading."""
        return True

    def seekable(self) -> bool:
        """Always: the bytes are all here."""
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` from the start, the current position or the end."""
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(base + offset, 0)
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        """Copy the next bytes into ``buffer``; how many (0 at the end)."""
        size = max(min(len(buffer), len(self._view) - self._pos), 0)
        buffer[:size] = self._view[self._pos : self._pos + size]
        self._pos += size
        return size


def _too_many(limits: SubmitLimits) -> LineError:
    return LineError(None, f"a file may hold at most {limits.max_rows:,} rows (one job each)")


def _csv_rows(source: BinaryIO, limits: SubmitLimits, columns: CsvColumns) -> Iterator[RawRow]:
    """One ``user`` message per CSV record."""
    # The field limit counts characters; content is limited in bytes later, and a
    # character is at least one byte, so this never refuses a prompt that would pass.
    csv.field_size_limit(max(limits.max_content_bytes, 1))
    text = io.TextIOWrapper(
        source, encoding="utf-8-sig", newline=""
    )  # decoded a buffer at a time; lines split as io.StringIO(newline="") splits them
    try:
        yield from _csv_records(text, limits, CsvLayout(columns))
    finally:
        # The caller closes the file. A reader left early is finalised after that
        # (detaching then would raise, unraisably); a closed wrapper's file is left be.
        if not source.closed:
            text.detach()


class _RecordLines:
    """The lines of a CSV file for :func:`csv.reader`, each read no further than
    ``max_bytes`` characters: :class:`LineError` once the lines of one record (since
    :meth:`next_record`) hold over ``max_bytes`` bytes of UTF-8."""

    def __init__(self, text: io.TextIOWrapper, max_bytes: int) -> None:
        self._text = text
        self._max = max_bytes
        self._size = 0
        self._start = 1  # the line the current record starts on
        self._line = 0

    def next_record(self) -> None:
        """A new record starts with the next line."""
        self._size, self._start = 0, self._line + 1

    def __iter__(self) -> _RecordLines:
        return self

    def __next__(self) -> str:
        line = self._text.readline(self._max + 1)
        if not line:
            raise StopIteration
        self._line += 1
        self._size += len(line) if len(line) > self._max else len(line.encode("utf-8"))
        if self._size > self._max:
            raise _row_too_large(self._start, self._max)
        return line


def _csv_records(
    text: io.TextIOWrapper, limits: SubmitLimits, layout: CsvLayout
) -> Iterator[RawRow]:
    lines = _RecordLines(text, limits.max_row_bytes)
    reader = csv.reader(lines, strict=True)
    count = 0
    opened = False  # the first record was shown to the layout
    while True:
        line = reader.line_num + 1
        lines.next_record()
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise LineError(line, _csv_reason(str(exc), limits)) from None
        if not record:
            continue
        try:
            if count == 0 and not opened and layout.header(record if line == 1 else None):
                opened = True
                continue
            opened = True
            request, size = layout.request(record)
        except RecordError as exc:
            raise LineError(line, exc.reason) from None
        count += 1
        if count > limits.max_rows:
            raise _too_many(limits)
        yield RawRow(line, request, size)


def _csv_reason(message: str, limits: SubmitLimits) -> str:
    if "field larger than field limit" in message:
        return f"the prompt is longer than {limits.max_content_bytes} bytes"
    if "unexpected end of data" in message:
        return "a quoted field is not closed (missing double quote)"
    return f"not valid CSV ({message})"


def _jsonl_rows(source: BinaryIO, limits: SubmitLimits, formats: list[str]) -> Iterator[RawRow]:
    """One request object per line, each in the format of the first (appended to
    ``formats`` when read)."""
    count = 0
    for number, raw in _lines(source, limits.max_row_bytes):
        line = raw.decode("utf-8")  # checked by _check_utf8
        if not line.strip():
            continue
        try:
            request = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise LineError(number, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        if type(request) is not dict:
            shape = _SHAPES[formats[0]] if formats else "{custom_id?, messages}"
            raise LineError(number, f"must be a JSON object {shape}")
        kind = line_format(request)
        if not formats:
            formats.append(kind)
        elif kind != formats[0]:
            raise LineError(
                number,
                f"is {kind} {_SHAPES[kind]} but the file's first line is {formats[0]}"
                f" {_SHAPES[formats[0]]}: a file holds one format",
            )
        count += 1
        if count > limits.max_rows:
            raise _too_many(limits)
        yield RawRow(number, request, len(raw))


def _lines(source: BinaryIO, max_bytes: int) -> Iterator[tuple[int, bytes]]:
    """The file's lines (:func:`.jsonl.file_lines`), with :class:`LineError` for the
    first over ``max_bytes`` (its newline not counted), read no further than that."""
    for number, line in file_lines(source, max_bytes):
        if line is None:
            raise _row_too_large(number, max_bytes)
        yield number, line


def _row_too_large(line: int, max_bytes: int) -> LineError:
    return LineError(line, f"the row is larger than {max_bytes} bytes")


def _line_error(error: RowError, lines: Sequence[int]) -> LineError:
    """``error`` of the row read from ``lines[error.index]``, in line terms."""
    reason = f"{error.field} {error.message}" if error.field else error.message
    if error.earlier is not None:
        reason += f" line {lines[error.earlier]}"
    return LineError(lines[error.index], reason)
