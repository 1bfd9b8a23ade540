"""An uploaded CSV file with a header row: the prompt and custom id read from their
columns; a one-column file without a header as before (no servers)."""

from __future__ import annotations

import orjson
import pytest

from relay_batches.services.ingest_api.rows.csv_columns import NO_COLUMNS, CsvColumns
from relay_batches.services.ingest_api.rows.files import LineError, parse_upload_file
from relay_batches.services.ingest_api.rows.validation import SubmitLimits

LIMITS = SubmitLimits(max_rows=100, max_content_bytes=1000, max_row_bytes=4000)


def rows(data: bytes, columns: CsvColumns = NO_COLUMNS) -> list[tuple[str, str]]:
    return [
        (row.custom_id, orjson.loads(row.request_json)[0]["content"])
        for row in parse_upload_file("t.csv", data, LIMITS, columns=columns)
    ]


def error(data: bytes, columns: CsvColumns = NO_COLUMNS) -> LineError:
    with pytest.raises(LineError) as caught:
        parse_upload_file("t.csv", data, LIMITS, columns=columns)
    return caught.value


def test_a_header_with_prompt_and_custom_id_columns_is_read_by_name() -> None:
    data = b'custom_id,prompt,notes\nr-1,"hello, you",x\nr-2,second,\n'
    assert rows(data) == [("r-1", "hello, you"), ("r-2", "second")]


def test_chosen_columns_any_case_and_other_columns_ignored() -> None:
    data = b"ID,Text,prompt\na,first,ignored\nb,second,ignored\n"
    assert rows(data, CsvColumns("text", "id")) == [("a", "first"), ("b", "second")]
    assert rows(b"id,prompt\n7,seven\n") == [("row-1", "seven")]  # no id column chosen
    assert rows(b"id,prompt\n7,seven\n", CsvColumns(id="id")) == [("7", "seven")]


def test_a_one_column_file_without_header_keeps_working() -> None:
    assert rows(b"first\nsecond\n") == [("row-1", "first"), ("row-2", "second")]
    assert rows(b"prompt\nfirst\n") == [("row-1", "first")]


def test_errors_name_the_line_and_the_column() -> None:
    missing = error(b"id,text\n1,a\n", CsvColumns("prompt_text"))
    assert missing.line == 1 and "no column named 'prompt_text'" in missing.reason
    assert "'id', 'text'" in missing.reason
    no_header = error(b"just a prompt\n", CsvColumns(id="id"))
    assert no_header.line == 1 and "no column named 'prompt'" in no_header.reason
    unknown_id = error(b"prompt,x\na,b\n", CsvColumns(id="key"))
    assert unknown_id.line == 1 and "no column named 'key'" in unknown_id.reason
    short = error(b"custom_id,prompt\na,one\nb\n")
    assert short.line == 3 and "expected 2 fields, as the header row has, found 1" in short.reason
    empty_id = error(b"custom_id,prompt\n,one\n")
    assert empty_id.line == 2 and "custom id is empty" in empty_id.reason
    two = error(b"id,prompt_text\n1,a\n")  # no header naming prompt: one field expected
    assert two.line == 1 and "header row naming its prompt column" in two.reason
    repeated = error(b"custom_id,prompt\na,one\na,two\n")
    assert repeated.line == 3 and "'a'" in repeated.reason
