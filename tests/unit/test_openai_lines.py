"""Reading OpenAI batch files chunk by chunk: the same rows wherever the chunks are cut,
and every error on the line a user sees in their editor."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from relay_batches.services.ingest_api.rows.openai_file import LineError, LineReader
from relay_batches.services.ingest_api.rows.validation import (
    SubmitLimits,
)

LIMITS = SubmitLimits(max_rows=5, max_content_bytes=64)
MODELS = {"gpt-4o-mini", "other"}


def line(custom_id: str, text: str = "hi", model: str = "gpt-4o-mini", **extra: Any) -> bytes:
    """One line, with its newline."""
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    item = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return orjson.dumps({**item, **extra}) + b"\n"


def read(
    data: bytes, cut: int | None = None, limits: SubmitLimits = LIMITS
) -> tuple[LineReader, list[tuple[int, str, str]]]:
    """Feed ``data`` whole, or in chunks of ``cut`` bytes; the reader and its rows."""
    reader = LineReader(limits, MODELS)
    rows: list[tuple[int, str, str]] = []
    step = cut or len(data) or 1
    for start in range(0, len(data), step):
        rows += reader.feed(data[start : start + step])
    rows += reader.feed(b"", final=True)
    reader.finish()
    return reader, rows


def test_rows_keep_their_model_and_are_the_same_wherever_chunks_are_cut() -> None:
    data = b"\xef\xbb\xbf" + line("a", "one") + b"\r\n" + line("b", "two", "other")[:-1]
    _, whole = read(data)

    assert [(i, c) for i, c, _ in whole] == [(0, "a"), (1, "b")]
    assert orjson.loads(whole[1][2]) == {
        "messages": [{"content": "two", "role": "user"}],
        "model": "other",
    }
    for cut in range(1, len(data) + 1):
        assert read(data, cut)[1] == whole, cut


def test_the_first_rows_model_is_the_files_model() -> None:
    reader, _ = read(line("a", model="other") + line("b"))
    assert (reader.model, reader.rows, reader.errors) == ("other", 2, [])


def test_errors_name_their_line_and_no_row_is_kept_after_one() -> None:
    data = line("a") + b"\n" + b"{oops\n" + line("c", url="/v1/images/generations") + line("d")

    reader, rows = read(data)

    assert [(i, c) for i, c, _ in rows] == [(0, "a")]
    assert reader.errors == [
        LineError("invalid_json_line", "This line is not parseable as valid JSON.", None, 3),
        LineError(
            "url_mismatch",
            "url must be one of /v1/chat/completions, /v1/embeddings, /v1/completions,"
            " /v1/moderations, /v1/responses (the endpoints Relay runs)",
            "url",
            4,
        ),
    ]


def test_every_line_names_the_first_lines_url() -> None:
    embedding = orjson.dumps(
        {
            "custom_id": "e",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "gpt-4o-mini", "input": "x"},
        }
    )
    reader, rows = read(embedding + b"\n" + line("c"))
    assert reader.endpoint == "/v1/embeddings"
    assert [(i, c) for i, c, _ in rows] == [(0, "e")]
    (error,) = reader.errors
    assert (error.code, error.param, error.line) == ("mixed_urls", "url", 2)


def test_a_bad_field_is_named_by_its_path() -> None:
    reader, _ = read(line("a", model="nope"))
    (error,) = reader.errors
    assert (error.code, error.param, error.line) == ("invalid_request", "body.model", 1)


def test_more_lines_than_the_row_limit_is_too_many_tasks_once() -> None:
    reader, _ = read(b"".join(line(f"r{i}") for i in range(LIMITS.max_rows + 3)))
    assert [(e.code, e.line) for e in reader.errors] == [("too_many_tasks", LIMITS.max_rows + 1)]


def test_an_empty_file_is_an_error() -> None:
    reader, rows = read(b"\n \r\n")
    assert rows == [] and [e.code for e in reader.errors] == ["empty_file"]


def test_a_line_past_the_row_limit_is_skipped_without_being_held() -> None:
    data = line("a") + b"x" * 300 + b"\n" + line("b")

    reader, rows = read(data, cut=40, limits=replace(LIMITS, max_row_bytes=200))

    assert [(e.code, e.line) for e in reader.errors] == [("invalid_request", 2)]
    assert "longer than 200 bytes" in reader.errors[0].message
    assert [c for _, c, _ in rows] == ["a"]
    assert reader.requests == 3


def test_a_duplicate_is_reported_on_the_line_of_its_repeat() -> None:
    reader, _ = read(line("a") + b"\n" + line("b") + line("a"))
    reader.duplicate("a", 2)
    assert [(e.code, e.param, e.line) for e in reader.errors] == [
        ("duplicate_custom_id", "custom_id", 4)
    ]


@pytest.mark.parametrize("cut", [None, 40, 250])
def test_a_long_line_is_caught_whole_in_one_chunk_and_as_the_last_line(cut: int | None) -> None:
    data = line("a") + b"y" * 300 + b"\n" + line("b") + b"z" * 300  # the last has no newline

    reader, rows = read(data, cut, replace(LIMITS, max_row_bytes=200))

    assert [(e.code, e.line) for e in reader.errors] == [
        ("invalid_request", 2),
        ("invalid_request", 4),
    ]
    assert [c for _, c, _ in rows] == ["a"]
    assert reader.requests == 4


def test_blank_lines_count_for_line_numbers_only() -> None:
    data = b"\n" * 10_000 + line("a") + b"\r\n" * 3 + b"{bad"

    reader, rows = read(data, cut=4096)

    assert [(c, reader.lines[i]) for i, c, _ in rows] == [("a", 10_001)]
    assert [(e.code, e.line) for e in reader.errors] == [("invalid_json_line", 10_005)]
