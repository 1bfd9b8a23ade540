"""Reading an uploaded OpenAI batch file (``.jsonl`` of ``{custom_id, method, url, body}``
lines) into request rows as it streams in, with bounded memory.

:class:`LineReader` takes the file's bytes in chunks of any size and hands back the rows
of every complete line (a line's row: :func:`line_row`); a partial last line waits for
the next chunk (the lines are :class:`.jsonl.LineSplitter`'s, as for every ``.jsonl``),
and a line longer than the limits' ``max_row_bytes`` (``RELAY_MAX_ROW_BYTES``) is
reported and skipped without being held. A bad line does
not stop the reading: its error (OpenAI's
``{code, message, param, line}``) is collected, up to :data:`MAX_LINE_ERRORS`, and once
the file has an error no more rows are kept (it will never run). Line numbers are the
file's 1-based physical lines; blank lines are skipped.

Pure, no aiohttp or asyncpg: the upload calls :meth:`LineReader.feed` in a worker thread.
"""

from __future__ import annotations

from array import array
from collections.abc import Container
from dataclasses import dataclass, field

import orjson

from relay_batches.services.ingest_api.rows.jsonl import LineSplitter
from relay_batches.services.ingest_api.rows.row_formats import openai_line_row
from relay_batches.services.ingest_api.rows.validation import (
    RowError,
    RowInput,
    RowRejected,
    SubmitLimits,
)

MAX_LINE_ERRORS = 100


@dataclass(frozen=True, slots=True)
class LineError:
    """One error of a file, as OpenAI's batch ``errors`` show it."""

    code: str
    message: str
    param: str | None
    line: int | None

    def to_api(self) -> dict[str, object]:
        """``{code, message, param, line}``."""
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


def line_row(
    index: int, line: bytes, limits: SubmitLimits, known_models: Container[str]
) -> RowInput:
    """The row of one OpenAI batch line (:func:`.row_formats.openai_line_row`: a whole
    chat request, its own ``model`` kept); :class:`RowRejected` naming the field if bad."""
    try:
        request = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise RowRejected(RowError(index, "", "is not parseable as valid JSON")) from None
    return openai_line_row(index, request, limits, known_models)


def _line_error(error: RowError, line: int) -> LineError:
    """A row's error as the file's error on ``line``: OpenAI's codes where one fits."""
    if error.field == "" and "JSON" in error.message:
        return LineError(
            "invalid_json_line", "This line is not parseable as valid JSON.", None, line
        )
    if error.field == "url":
        return LineError("url_mismatch", f"url {error.message}", "url", line)
    field_path = error.field or None
    text = f"{error.field} {error.message}" if error.field else f"the line {error.message}"
    return LineError("invalid_request", text, field_path, line)


@dataclass
class LineReader:
    """Parses a file fed chunk by chunk; see the module docstring."""

    limits: SubmitLimits
    known_models: Container[str]
    errors: list[LineError] = field(default_factory=list)
    requests: int = 0  # non-blank lines seen
    model: str | None = None  # the first row's model
    endpoint: str | None = None  # the first row's url: every line must name the same
    lines: array[int] = field(default_factory=lambda: array("I"))  # line of each row
    _splitter: LineSplitter = field(init=False)

    def __post_init__(self) -> None:
        self._splitter = LineSplitter(self.limits.max_row_bytes)

    def feed(self, chunk: bytes, final: bool = False) -> list[tuple[int, str, str]]:
        """The rows ``(row_index, custom_id, request_json)`` completed by ``chunk``;
        ``final`` for the end of the file (its last line needs no newline)."""
        rows: list[tuple[int, str, str]] = []
        for number, line in self._splitter.feed(chunk, final):
            if line is None:
                self._report_too_long(number)
            else:
                self._take(number, line, rows)
        return rows

    def _report_too_long(self, number: int) -> None:
        self.requests += 1
        self._error(
            LineError(
                "invalid_request",
                f"the line is longer than {self.limits.max_row_bytes} bytes",
                None,
                number,
            )
        )

    def _error(self, error: LineError) -> None:
        if len(self.errors) < MAX_LINE_ERRORS:
            self.errors.append(error)

    def _take(self, number: int, raw: bytes, rows: list[tuple[int, str, str]]) -> None:
        stripped = raw.strip()
        if not stripped:
            return
        self.requests += 1
        if self.requests > self.limits.max_rows:
            if self.requests == self.limits.max_rows + 1:
                self._error(
                    LineError(
                        "too_many_tasks",
                        f"the file holds more than {self.limits.max_rows} requests",
                        None,
                        number,
                    )
                )
            return
        if len(self.errors) >= MAX_LINE_ERRORS:
            return
        index = len(self.lines)
        try:
            row = line_row(index, stripped, self.limits, self.known_models)
        except RowRejected as exc:
            self._error(_line_error(exc.error, number))
            return
        if self.endpoint is None:
            self.endpoint = row.endpoint
        elif row.endpoint != self.endpoint:
            self._error(
                LineError(
                    "mixed_urls",
                    f"url {row.endpoint} differs from the first line's {self.endpoint}:"
                    " a batch runs one endpoint",
                    "url",
                    number,
                )
            )
            return
        if self.errors:
            return
        if self.model is None:
            self.model = row.model
        self.lines.append(number)
        rows.append((index, row.custom_id, row.request_json))

    def duplicate(self, custom_id: str, row_index: int) -> None:
        """Record that row ``row_index`` repeats an earlier row's ``custom_id``."""
        self._error(
            LineError(
                "duplicate_custom_id",
                f"custom_id {custom_id[:64]!r} is used by an earlier line",
                "custom_id",
                self.lines[row_index],
            )
        )

    def finish(self) -> None:
        """The file has ended: an empty one is an error."""
        if self.requests == 0:
            self._error(LineError("empty_file", "the file holds no requests", None, None))

    @property
    def rows(self) -> int:
        """How many rows were kept."""
        return len(self.lines)
