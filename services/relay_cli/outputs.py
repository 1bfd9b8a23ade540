"""``relay batch results`` and ``relay batch dead-letter``: a job's rows written as JSONL,
one JSON document or CSV, read from the API's ndjson stream a line at a time (memory
does not grow with the job's size)."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import orjson

from relay_batches.model import TERMINAL
from relay_batches.services.relay_cli.args import UsageError
from relay_batches.services.relay_cli.client import ApiFailure, RelayClient
from relay_batches.services.relay_cli.progress import status_text

EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv"}
CSV_COLUMNS = ("custom_id", "content", "error", "tool_calls")
DETAIL_COLUMNS = (
    "prompt_tokens",
    "completion_tokens",
    "attempts",
    "deployment",
    "latency_ms",
    "finish_reason",
    "cost_usd",
)


class FormatError(Exception):
    """The output's format cannot be told from its name."""


def output_format(chosen: str | None, output: Path | None) -> str:
    """``--format`` if given, else what ``output``'s extension names, else ``jsonl``
    (stdout); :class:`FormatError` for a file name whose extension names none."""
    if chosen is not None:
        return chosen
    if output is None:
        return "jsonl"
    found = EXTENSIONS.get(output.suffix.lower())
    if found is None:
        raise FormatError(
            f"cannot tell the format of {output} from its extension: name it .jsonl, .json"
            " or .csv, or pass --format"
        )
    return found


class RowWriter:
    """Rows (each one JSON object, as the API's ndjson lines) as JSONL: :meth:`head`,
    :meth:`row` for each, :meth:`tail`, each the bytes to write."""

    def __init__(self, head: dict[str, Any], details: bool) -> None:
        self._head = head
        self._details = details
        self.rows = 0

    def head(self) -> bytes:
        """What comes before the first row."""
        return b""

    def row(self, line: bytes) -> bytes:
        """One row."""
        self.rows += 1
        return line + b"\n"

    def tail(self) -> bytes:
        """What comes after the last row."""
        return b""


class JsonWriter(RowWriter):
    """One JSON document, as the API's: ``{id, status, [partial,] data: [rows]}``."""

    def head(self) -> bytes:
        """The document's head, up to the opening of ``data``."""
        return orjson.dumps(self._head)[:-1] + b',"data":[\n'

    def row(self, line: bytes) -> bytes:
        """One element of ``data``, a line each."""
        self.rows += 1
        return line if self.rows == 1 else b",\n" + line

    def tail(self) -> bytes:
        """The closing of ``data`` and the document."""
        return b"\n]}\n"


class CsvWriter(RowWriter):
    """A header row, then one record per row: :data:`CSV_COLUMNS` (``tool_calls`` as
    JSON text), and :data:`DETAIL_COLUMNS` with details; an absent value is empty."""

    def _record(self, values: list[Any]) -> bytes:
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerow(values)
        return text.getvalue().encode()

    def _columns(self) -> tuple[str, ...]:
        return CSV_COLUMNS + DETAIL_COLUMNS if self._details else CSV_COLUMNS

    def head(self) -> bytes:
        """The header row."""
        return self._record(list(self._columns()))

    def row(self, line: bytes) -> bytes:
        """One record."""
        self.rows += 1
        shown = orjson.loads(line)
        usage = shown.get("usage") or {}
        values = {**shown, **usage}
        if "tool_calls" in shown:
            values["tool_calls"] = orjson.dumps(shown["tool_calls"]).decode()
        return self._record([_cell(values.get(column)) for column in self._columns()])


def _cell(value: Any) -> Any:
    return "" if value is None else value


WRITERS: dict[str, type[RowWriter]] = {"jsonl": RowWriter, "json": JsonWriter, "csv": CsvWriter}


async def ndjson_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The non-blank lines of an ndjson stream, however its chunks cut them."""
    pending = b""
    async for chunk in chunks:
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


async def results(client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Write a job's results (``--failed``: its failed rows; ``--partial``: so far) in
    the chosen format, to ``-o`` (written whole or not at all) or stdout."""
    try:
        chosen = output_format(args.format, args.output)
    except FormatError as exc:
        raise UsageError(str(exc)) from None
    batch = await client.get(args.id)
    if not args.partial and batch["status"] not in TERMINAL:
        raise ApiFailure(
            f"job {batch['id']} is {batch['status']}; results appear when it ends"
            f" (relay batch watch {batch['id']}), or pass --partial for the rows so far"
        )
    head: dict[str, Any] = {"id": batch["id"], "status": batch["status"]}
    if args.partial:
        head["partial"] = True
    writer = WRITERS[chosen](head, args.details)
    chunks = client.results(
        batch["id"],
        outcome="error" if args.failed else None,
        partial=args.partial,
        details=args.details,
    )
    if args.output is None:
        await _copy(ndjson_lines(chunks), writer, sys.stdout.buffer)
        return 0
    part = args.output.with_name(args.output.name + ".part")
    try:
        with part.open("wb") as target:
            await _copy(ndjson_lines(chunks), writer, target)
        part.replace(args.output)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    finally:
        part.unlink(missing_ok=True)
    which = " failed" if args.failed else ""
    print(
        f"wrote {writer.rows}{which} rows of {batch['id']} ({status_text(batch)})"
        f" to {args.output} ({chosen})",
        file=err,
    )
    return 0


async def _copy(lines: AsyncIterator[bytes], writer: RowWriter, target: BinaryIO) -> None:
    target.write(writer.head())
    async for line in lines:
        target.write(writer.row(line))
    target.write(writer.tail())
    target.flush()


async def dead_letter(
    client: RelayClient, args: argparse.Namespace, out: TextIO, err: TextIO
) -> int:
    """A job's dead-letter rows: ``<custom_id>  <attempts> attempt(s)  <error>`` a line
    each (``--json``: the API's document), in row order."""
    lines = ndjson_lines(client.dead_letters(args.id, args.details))
    if args.json:
        writer = JsonWriter({"id": args.id}, args.details)
        out.flush()
        await _copy(lines, writer, sys.stdout.buffer)
        return 0
    count = 0
    async for line in lines:
        row = orjson.loads(line)
        count += 1
        where = f"  {row['deployment']}" if args.details and row.get("deployment") else ""
        print(f"{row['custom_id']}  {row['attempts']} attempt(s){where}  {row['error']}", file=out)
    print(f"{args.id}: {count} dead-letter row(s)", file=err)
    return 0
