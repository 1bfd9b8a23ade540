"""The one JSONL line reader: the same numbered lines whatever the chunks, a byte-order
mark dropped, U+2028 never a line break, a too-long line handed back once as None."""

from __future__ import annotations

import io

import pytest

from relay_batches.services.ingest_api.rows.jsonl import BOM, Line, LineSplitter, file_lines

TEXT = b'{"a": 1}\n\n{"b": "x\xe2\x80\xa8y"}\r\n' + b"z" * 40 + b'\n{"c": 3}'
EXPECTED: list[Line] = [
    (1, b'{"a": 1}'),
    (2, b""),
    (3, b'{"b": "x\xe2\x80\xa8y"}\r'),
    (4, None),
    (5, b'{"c": 3}'),
]


def fed(data: bytes, size: int, max_bytes: int = 30) -> list[Line]:
    splitter = LineSplitter(max_bytes)
    lines: list[Line] = []
    for start in range(0, len(data), size):
        lines += splitter.feed(data[start : start + size])
    return lines + splitter.feed(b"", final=True)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16, 41, 1000])
def test_the_lines_do_not_depend_on_the_chunks(size: int) -> None:
    assert fed(TEXT, size) == EXPECTED


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_a_byte_order_mark_opens_no_line(size: int) -> None:
    assert fed(BOM + TEXT, size) == EXPECTED
    assert fed(BOM + b"x" * 30, size) == [(1, b"x" * 30)]  # the mark is not counted


def test_a_final_newline_ends_the_last_line() -> None:
    assert fed(b"a\nb\n", 1000) == [(1, b"a"), (2, b"b")]
    assert fed(b"", 1000) == []


def test_a_line_of_exactly_the_limit_is_kept_one_more_byte_is_not() -> None:
    assert fed(b"x" * 30 + b"\n" + b"y" * 31, 4) == [(1, b"x" * 30), (2, None)]


def test_a_file_is_read_through_the_same_splitter() -> None:
    assert list(file_lines(io.BytesIO(TEXT), 30)) == EXPECTED
