"""Decoding a large JSON body one value at a time, in bounded memory.

``orjson.loads`` of a whole 100 MiB submission builds every row's dicts and strings at
once (over 1 GiB for 100k rows of 30 messages) and holds the GIL throughout. A
:class:`JsonScanner` instead walks the top-level object member by member and an array
element by element: the UTF-8 body is decoded a window at a time, each value is parsed
by the standard library's C scanner (``JSONDecoder.raw_decode``) and handed to the
caller, who keeps only what it needs (one request row's encoded messages). Between
values the GIL is released at bytecode boundaries, so a worker thread running the scan
leaves the event loop responsive.

The accepted syntax is strict JSON, as orjson's: no ``NaN``/``Infinity`` (nor a number
too large for a double, which would decode as one), no trailing commas, UTF-8 only. Any
syntax error is a :class:`NotJson`. Two things orjson refuses are kept as the standard
library decodes them, for the callers to refuse by field: an escaped lone surrogate
(``"\\ud800"``, a ``str`` UTF-8 cannot encode) and an integer over 64 bits (up to
Python's 4,300 digits; longer is a :class:`NotJson`).

Why not ijson (yajl2_c), measured on 100,000 rows of 30 messages (98 MiB): it takes 1.4
times the CPU (2.4 s against 1.7 s; 2 to 3 times on 100 rows of 1 MB), gives no offsets
to size a row by its text, and on hostile input its C backend builds a prefix string per
nesting level (20 KB of ``[`` cost 253 MiB, 60 KB over 1.4 GiB), reads ``"\\ud800"`` as
``"?"`` and ``"\\ud800\\u0041"`` as U+10041, where this scanner refuses nesting past
about 1,000 levels and keeps what the text says.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Iterator

WINDOW_BYTES = 1024 * 1024
_WS = re.compile(r"[ \t\n\r]*")
# A decode error this close to the end of the window may only mean the value goes on.
_END_MARGIN = 8
# The longest unfinished end of a number the decoder stops before ("e-", "E+").
_NUMBER_TAIL = 2
_NUMBERS = (int, float)


class NotJson(Exception):
    """The body is not JSON text (``nested`` when it is nested too deeply to parse)."""

    def __init__(self, nested: bool = False) -> None:
        super().__init__("nested too deeply" if nested else "not JSON")
        self.nested = nested


def _reject_constant(name: str) -> object:
    raise NotJson()


def _finite_float(text: str) -> float:
    """A JSON number with a fraction or exponent; one past a double's range is NotJson
    (it would decode as an infinity, which JSON cannot say)."""
    number = float(text)
    if not math.isfinite(number):
        raise NotJson()
    return number


class JsonScanner:
    """A cursor over one JSON text held as UTF-8 bytes."""

    def __init__(self, data: bytes | bytearray, window: int = WINDOW_BYTES) -> None:
        self._data = memoryview(data)
        self._window = window
        self._offset = 0  # bytes of ``data`` decoded so far
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._text = ""
        self._pos = 0
        self._json = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
        self.last_span = (0, 0)  # where the value parsed last was in the decoded text

    @property
    def _eof(self) -> bool:
        return self._offset >= len(self._data)

    def _more(self, at_least: int = 0) -> bool:
        """Decode the next window (at least ``at_least`` bytes); False at the end."""
        if self._eof:
            return False
        size = max(self._window, at_least)
        chunk = self._data[self._offset : self._offset + size]
        self._offset += len(chunk)
        try:
            decoded = self._decoder.decode(chunk, final=self._eof)
        except UnicodeDecodeError:
            raise NotJson() from None
        self._text = self._text[self._pos :] + decoded
        self._pos = 0
        return True

    def peek(self) -> str:
        """The next non-whitespace character ('' at the end of the text)."""
        while True:
            self._pos = _WS.match(self._text, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._text) or not self._more():
                return self._text[self._pos : self._pos + 1]

    def expect(self, char: str) -> None:
        """Consume ``char`` (after whitespace), or :class:`NotJson`."""
        if self.peek() != char:
            raise NotJson()
        self._pos += 1

    def value(self) -> object:
        """Parse and consume the next JSON value."""
        self.peek()
        while True:
            try:
                value, end = self._json.raw_decode(self._text, self._pos)
            except json.JSONDecodeError as exc:
                if not self._needs_more(exc) or not self._more(2 * self._pending()):
                    raise NotJson() from None
                continue
            except RecursionError:
                raise NotJson(nested=True) from None
            except ValueError:  # an integer too long for int(); a rejected constant
                raise NotJson() from None
            # A number this close to the window's edge may go on in the next window
            # ("1" then "2", or "1" before an unfinished "e-" or ".").
            if (
                type(value) in _NUMBERS
                and end + _NUMBER_TAIL >= len(self._text)
                and self._more(2 * self._pending())
            ):
                continue
            self.last_span = (self._pos, end)
            self._pos = end
            return value

    def last_bytes(self, limit: int) -> int:
        """The UTF-8 size of the value :meth:`value` parsed last, counted exactly only
        when it may exceed ``limit`` (a character is 1 to 4 bytes)."""
        start, end = self.last_span
        chars = end - start
        if chars > limit or 4 * chars <= limit:
            return chars
        return len(self._text[start:end].encode("utf-8", "surrogatepass"))

    def _pending(self) -> int:
        return len(self._text) - self._pos

    def _needs_more(self, exc: json.JSONDecodeError) -> bool:
        return exc.pos >= len(self._text) - _END_MARGIN or exc.msg.startswith("Unterminated")

    def members(self) -> Iterator[str]:
        """The keys of the object starting here; after each key the caller consumes its
        value (:meth:`value` or :meth:`elements`) before asking for the next key."""
        self.expect("{")
        if self.peek() == "}":
            self._pos += 1
            return
        while True:
            if self.peek() != '"':
                raise NotJson()
            key = self.value()
            assert type(key) is str
            self.expect(":")
            yield key
            if self.peek() == ",":
                self._pos += 1
                continue
            self.expect("}")
            return

    def elements(self) -> Iterator[object]:
        """The elements of the array starting here, parsed one at a time."""
        self.expect("[")
        if self.peek() == "]":
            self._pos += 1
            return
        while True:
            yield self.value()
            if self.peek() == ",":
                self._pos += 1
                continue
            self.expect("]")
            return

    def at_end(self) -> bool:
        """True when only whitespace is left."""
        return self.peek() == ""
