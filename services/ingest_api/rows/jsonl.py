"""The one JSONL line reader of the API: every ``.jsonl`` it takes (an upload's file, an
OpenAI batch file) is split into lines here.

:class:`LineSplitter` takes a file's bytes in chunks of any size and hands back each
complete line with its 1-based physical line number. It splits on ``\\n`` only
(``str.splitlines()`` would also split on U+2028 and friends, which may stand unescaped
inside a JSON string), drops a byte-order mark before the first line, and never holds
more than one line of at most ``max_bytes`` (its newline not counted) beside a chunk: a
longer line is handed back as ``None`` as soon as it is known to be too long, and its
bytes are skipped. What a too-long, blank or bad line means is the caller's to say.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import BinaryIO

BOM = codecs.BOM_UTF8
READ_BYTES = 256 * 1024  # bytes read from a file at a time

Line = tuple[int, bytes | None]  # (line number, its bytes; None when too long)


class LineSplitter:
    """Splits a byte stream fed chunk by chunk into numbered lines (module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._line = 0  # lines ended so far
        self._carry = b""  # the start of a line whose newline has not come yet
        self._skipping = False  # inside a line already handed back as too long

    def feed(self, chunk: bytes | bytearray, final: bool = False) -> list[Line]:
        """The lines ``chunk`` completes; ``final`` for the end of the stream (its last
        line needs no newline)."""
        found: list[Line] = []
        data = bytes(chunk)
        if self._skipping:
            cut = data.find(b"\n")
            if cut < 0:
                self._ended(final, b"")
                return found
            self._skipping = False
            self._line += 1
            data = data[cut + 1 :]
        elif self._carry:
            data, self._carry = self._carry + data, b""
        pos = 0
        while (cut := data.find(b"\n", pos)) >= 0:  # one line at a time, never all of them
            self._line += 1
            found.append((self._line, self._body(data[pos:cut])))
            pos = cut + 1
        rest = data[pos:]
        if len(self._unmarked(rest)) > self._max:
            found.append((self._line + 1, None))
            self._skipping, rest = True, b""
        self._ended(final, rest, found)
        return found

    def _ended(self, final: bool, rest: bytes, found: list[Line] | None = None) -> None:
        """Carry ``rest`` to the next chunk or, at the end, hand it back as the last line."""
        if not final:
            self._carry = rest
            return
        if rest and found is not None:
            self._line += 1
            found.append((self._line, self._body(rest)))
        self._carry, self._skipping = b"", False

    def _unmarked(self, line: bytes) -> bytes:
        """``line`` without the byte-order mark that may open the first line."""
        return line[len(BOM) :] if self._line == 0 and line.startswith(BOM) else line

    def _body(self, line: bytes) -> bytes | None:
        """The line just ended (number :attr:`_line`), or None when it is too long."""
        if self._line == 1 and line.startswith(BOM):
            line = line[len(BOM) :]
        return None if len(line) > self._max else line


def file_lines(source: BinaryIO, max_bytes: int) -> Iterator[Line]:
    """Every line of ``source`` (read :data:`READ_BYTES` at a time), as
    :meth:`LineSplitter.feed` hands them back."""
    splitter = LineSplitter(max_bytes)
    while chunk := source.read(READ_BYTES):
        yield from splitter.feed(chunk)
    yield from splitter.feed(b"", final=True)
