"""Reading uploaded .csv and .jsonl files: rows, custom ids, and the line of each error."""

from __future__ import annotations

import codecs
import io

import orjson
import pytest

from relay_batches.errors import ApiError
from relay_batches.services.ingest_api.rows import files as upload_formats
from relay_batches.services.ingest_api.rows.files import (
    FileReader,
    LineError,
    file_format,
    parse_upload_file,
)
from relay_batches.services.ingest_api.rows.job_fields import (
    validate_batch_options,
)
from relay_batches.services.ingest_api.rows.validation import (
    RowInput,
    SubmitLimits,
)
from relay_batches.services.ingest_api.surfaces.native.upload import (
    clean_filename,
    form_payload,
    job_name,
)
from tests.helpers.rows import MODELS

LIMITS = SubmitLimits(max_rows=5, max_content_bytes=64)


def contents(rows: list[RowInput]) -> list[tuple[str, str]]:
    """(custom_id, content of the single user message) per row."""
    out = []
    for row in rows:
        messages = orjson.loads(row.request_json)
        assert [m["role"] for m in messages] == ["user"]
        out.append((row.custom_id, messages[0]["content"]))
    return out


def line_error(filename: str, data: bytes, limits: SubmitLimits = LIMITS) -> LineError:
    with pytest.raises(LineError) as caught:
        parse_upload_file(filename, data, limits)
    return caught.value


# --- csv --------------------------------------------------------------------------------


def test_csv_one_prompt_per_record_with_quoted_commas_quotes_and_newlines() -> None:
    data = b'plain prompt\n"Classify: good, cheap"\n"She said ""hi"""\n"two\nlines"\nlast'
    assert contents(parse_upload_file("a.csv", data, LIMITS)) == [
        ("row-1", "plain prompt"),
        ("row-2", "Classify: good, cheap"),
        ("row-3", 'She said "hi"'),
        ("row-4", "two\nlines"),
        ("row-5", "last"),
    ]


def test_csv_header_bom_crlf_and_blank_lines() -> None:
    data = "\ufeffPrompt\r\nfirst\r\n\r\nsecond\r\n".encode()
    assert contents(parse_upload_file("A.CSV", data, LIMITS)) == [
        ("row-1", "first"),
        ("row-2", "second"),
    ]


def test_csv_prompt_only_on_a_later_line_is_not_a_header() -> None:
    assert contents(parse_upload_file("a.csv", b"first\nprompt\n", LIMITS)) == [
        ("row-1", "first"),
        ("row-2", "prompt"),
    ]


@pytest.mark.parametrize(
    ("data", "line", "fragment"),
    [
        pytest.param(b"ok\nhas, comma\n", 2, "found 2", id="unquoted-comma"),
        pytest.param(b'ok\n"two\nlines"\n"open\nquote', 4, "not closed", id="unclosed-quote"),
        pytest.param(b'ok\n"x"y\n', 2, "not valid CSV", id="text-after-quote"),
        pytest.param(b'ok\n"  "\n', 2, "empty", id="blank-prompt"),
        pytest.param(b"ok\n" + b"x" * 65 + b"\n", 2, "64 bytes", id="too-long"),
        pytest.param(b"ok\n" + "€".encode() * 22 + b"\n", 2, "at most 64 bytes", id="utf8-long"),
        pytest.param(b"ok\nbad \xff byte\n", 2, "UTF-8", id="not-utf8"),
    ],
)
def test_csv_errors_name_the_line(data: bytes, line: int, fragment: str) -> None:
    error = line_error("a.csv", data)
    assert error.line == line
    assert fragment in error.reason


def test_csv_more_rows_than_the_limit() -> None:
    error = line_error("a.csv", b"\n".join(b"p%d" % i for i in range(6)))
    assert error.line is None
    assert "at most 5 rows" in error.reason


# --- jsonl ------------------------------------------------------------------------------


def row(content: str, custom_id: str | None = None) -> bytes:
    body: dict[str, object] = {"messages": [{"role": "user", "content": content}]}
    if custom_id is not None:
        body["custom_id"] = custom_id
    return orjson.dumps(body)


def test_jsonl_one_request_per_line_defaults_ids_by_position() -> None:
    data = b"\n".join([row("a", "x-1"), b"", row("b"), row("c\u2028d")]) + b"\n"
    assert contents(parse_upload_file("b.jsonl", data, LIMITS)) == [
        ("x-1", "a"),
        ("row-2", "b"),
        ("row-3", "c\u2028d"),
    ]


@pytest.mark.parametrize(
    ("lines", "line", "fragment"),
    [
        pytest.param([row("a"), b"{not json"], 2, "not valid JSON", id="bad-json"),
        pytest.param([row("a"), b"[1, 2]"], 2, "JSON object", id="not-object"),
        pytest.param([row("a"), b'{"messages": []}'], 2, "messages must be", id="no-messages"),
        pytest.param(
            [row("a"), b"", b'{"messages": [{"role": "robot", "content": "x"}]}'],
            3,
            "messages[0].role must be one of",
            id="bad-role",
        ),
        pytest.param(
            [row("a", "same"), row("b"), row("c", "same")],
            3,
            "custom_id 'same' duplicates line 1",
            id="duplicate-id",
        ),
        pytest.param(
            [row("a", "rows[9]"), row("b", "rows[9]")],
            2,
            "custom_id 'rows[9]' duplicates line 1",
            id="duplicate-id-that-looks-like-a-reference",
        ),
        pytest.param(
            [row("a"), b'{"messages": [{"role": "user", "content": "x"}], "bogus": 1}'],
            2,
            "bogus is not a field of a request (fields: audio, custom_id, frequency_penalty,",
            id="unknown-key",
        ),
    ],
)
def test_jsonl_errors_name_the_line(lines: list[bytes], line: int, fragment: str) -> None:
    error = line_error("b.jsonl", b"\n".join(lines))
    assert error.line == line
    assert fragment in error.reason
    assert "rows[" not in error.reason.replace("'rows[9]'", "")


@pytest.mark.parametrize(
    ("filename", "data", "fragment"),
    [
        pytest.param("c.txt", b"hello", ".csv or .jsonl", id="wrong-extension"),
        pytest.param("c.jsonl", b"\n  \n", "no rows", id="empty-jsonl"),
        pytest.param("c.csv", b"prompt\n", "no rows", id="header-only-csv"),
    ],
)
def test_whole_file_errors(filename: str, data: bytes, fragment: str) -> None:
    error = line_error(filename, data)
    assert error.line is None
    assert fragment in error.reason


def test_file_format_by_extension() -> None:
    assert file_format("x.CSV") == ".csv"
    assert file_format("x.jsonl") == ".jsonl"
    assert file_format("x.json") is None


# --- options and names --------------------------------------------------------------------


def test_form_fields_become_body_values_and_blank_ones_are_absent() -> None:
    fields = {
        "model": "m",
        "priority": " 7 ",
        "name": "",
        "webhookUrl": " ",
        "cron": "",
        "params": '{\n  "temperature": 0.2, "stop": ["a"]\n}',
    }
    assert form_payload(fields) == {
        "model": "m",
        "priority": 7,
        "params": {"temperature": 0.2, "stop": ["a"]},
    }
    assert form_payload({"params": "  "}) == {}


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        pytest.param({"priority": "5.5"}, "priority", "priority must be an integer", id="priority"),
        pytest.param(
            {"params": "{temperature: 1}"}, "params", "params must be JSON text", id="json"
        ),
    ],
)
def test_form_field_that_cannot_be_converted(
    fields: dict[str, str], param: str, message: str
) -> None:
    with pytest.raises(ApiError) as caught:
        form_payload(fields)
    assert (caught.value.status, caught.value.param, caught.value.message) == (400, param, message)


@pytest.mark.parametrize(
    "params",
    [[], "json", {"temperature": 5}, {"temprature": 1}, {"response_format": {"type": "xml"}}],
)
def test_a_json_field_gets_the_error_of_the_same_value_in_a_body(params: object) -> None:
    def error(payload: dict[str, object]) -> ApiError:
        with pytest.raises(ApiError) as caught:
            validate_batch_options(payload, {"m"})
        return caught.value

    from_form = error(form_payload({"model": "m", "params": orjson.dumps(params).decode()}))
    from_body = error({"model": "m", "params": params})
    assert from_form.body() == from_body.body()
    assert from_form.param is not None and from_form.param.startswith("params")


def test_job_names() -> None:
    assert job_name(None, "a.csv", 2) == "a.csv"
    assert job_name("October", "a.csv", 1) == "October"
    assert job_name("October", "a.csv", 2) == "October — a.csv"
    assert len(job_name("n" * 256, "a.csv", 2)) == 256


def test_clean_filename_keeps_the_printable_base_name() -> None:
    assert clean_filename("reviews.csv") == "reviews.csv"
    assert clean_filename("C:\\data\\q3 réviews.csv") == "q3 réviews.csv"
    assert clean_filename("/tmp/x/a.jsonl") == "a.jsonl"
    assert clean_filename("a\x00b\n.csv") == "ab.csv"


# --- decoding a line at a time ------------------------------------------------------------


@pytest.mark.parametrize("kind", [".csv", ".jsonl"])
@pytest.mark.parametrize("window", [1, 2, 3, 5, 1024])
def test_a_byte_that_is_not_utf8_is_named_by_its_line_at_any_window(
    monkeypatch: pytest.MonkeyPatch, kind: str, window: int
) -> None:
    """The check decodes a window at a time: a character split across windows is fine,
    a bad byte is reported on its own line wherever the windows fall."""
    monkeypatch.setattr(upload_formats, "CHECK_WINDOW", window)
    good = row("é😀") if kind == ".jsonl" else "é😀".encode()
    bad = b'{"messages": "\xe2\x82"}' if kind == ".jsonl" else b"\xe2\x82 cut"
    error = line_error(f"f{kind}", good + b"\n" + good + b"\n" + bad + b"\n" + good)
    assert (error.line, error.reason) == (3, "not valid UTF-8 text")
    cut = line_error(f"f{kind}", good + b"\n" + "😀".encode()[:2])  # ends mid-character
    assert (cut.line, cut.reason) == (2, "not valid UTF-8 text")


def test_jsonl_bom_and_emoji_are_read_line_by_line() -> None:
    data = codecs.BOM_UTF8 + row("😀 one", "a") + b"\r\n" + row("two\u00e9") + b"\n"
    assert contents(parse_upload_file("e.jsonl", data, LIMITS)) == [
        ("a", "😀 one"),
        ("row-2", "two\u00e9"),
    ]


def test_csv_from_a_bytearray_with_emoji_and_a_quoted_newline() -> None:
    data = bytearray('\ufeffprompt\n😀 first\n"multi\nline, quoted"\rthird\n'.encode())
    assert contents(parse_upload_file("e.csv", data, LIMITS)) == [
        ("row-1", "😀 first"),
        ("row-2", "multi\nline, quoted"),
        ("row-3", "third"),
    ]


# --- dialect .jsonl files ---------------------------------------------------------------


def openai_line(custom_id: str, content: str, model: str = "gpt-4o-mini") -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return orjson.dumps(line)


def anthropic_line(custom_id: str, content: str, model: str = "claude-haiku") -> bytes:
    params = {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": content}]}
    return orjson.dumps({"custom_id": custom_id, "params": params})


def dialect_error(data: bytes) -> LineError:
    with pytest.raises(LineError) as caught:
        parse_upload_file("d.jsonl", data, LIMITS, MODELS)
    return caught.value


def test_an_openai_batch_file_gives_rows_with_their_models() -> None:
    data = b"\n".join([openai_line("a", "one"), b"", openai_line("b", "two", "claude-haiku")])
    rows = parse_upload_file("batch.jsonl", data, LIMITS, MODELS)
    assert [(r.custom_id, r.model) for r in rows] == [("a", "gpt-4o-mini"), ("b", "claude-haiku")]
    assert rows[0].request_json == (
        '{"messages":[{"content":"one","role":"user"}],"model":"gpt-4o-mini"}'
    )


def test_an_anthropic_batch_file_gives_translated_rows() -> None:
    data = b"\n".join([anthropic_line("a", "one"), anthropic_line("b", "two", "gpt-4o-mini")])
    rows = parse_upload_file("batch.jsonl", data, LIMITS, MODELS)
    assert [(r.custom_id, r.model) for r in rows] == [("a", "claude-haiku"), ("b", "gpt-4o-mini")]
    assert orjson.loads(rows[1].request_json) == {
        "max_tokens": 16,
        "messages": [{"content": "two", "role": "user"}],
        "model": "gpt-4o-mini",
    }


@pytest.mark.parametrize(
    ("lines", "line", "reason"),
    [
        pytest.param(
            [openai_line("a", "x"), row("b")],
            2,
            "is a Relay request {custom_id?, messages} but the file's first line is an OpenAI"
            " batch line {custom_id, method, url, body}: a file holds one format",
            id="openai-then-relay",
        ),
        pytest.param(
            [row("a"), b"", anthropic_line("b", "x")],
            3,
            "is an Anthropic request {custom_id, params} but the file's first line is a Relay"
            " request {custom_id?, messages}: a file holds one format",
            id="relay-then-anthropic",
        ),
        pytest.param(
            [anthropic_line("a", "x"), openai_line("b", "x")],
            2,
            "is an OpenAI batch line {custom_id, method, url, body} but the file's first line"
            " is an Anthropic request {custom_id, params}: a file holds one format",
            id="anthropic-then-openai",
        ),
        pytest.param(
            [openai_line("a", "x"), b'{"custom_id": "b", "method": "POST"'],
            2,
            "not valid JSON (unexpected end of data at column 36)",
            id="broken",
        ),
        pytest.param(
            [openai_line("a", "x"), b"[]"],
            2,
            "must be a JSON object {custom_id, method, url, body}",
            id="not-object",
        ),
        pytest.param(
            [openai_line("a", "x"), openai_line("a", "y")],
            2,
            "custom_id 'a' duplicates line 1",
            id="openai-duplicate",
        ),
        pytest.param(
            [anthropic_line("a", "x"), anthropic_line("b", "x", "nope")],
            2,
            "params.model 'nope' is unknown",
            id="anthropic-model",
        ),
        pytest.param(
            [openai_line("a", "x"), openai_line("b", "x").replace(b'"POST"', b'"PUT"')],
            2,
            "method must be POST",
            id="openai-method",
        ),
        pytest.param(
            [
                row("a"),
                orjson.dumps({"messages": [{"role": "user", "content": "x"}], "model": "nope"}),
            ],
            2,
            "model 'nope' is unknown",
            id="relay-row-model",
        ),
    ],
)
def test_dialect_file_errors_name_the_line(lines: list[bytes], line: int, reason: str) -> None:
    error = dialect_error(b"\n".join(lines))
    assert (error.line, error.reason) == (line, reason)


@pytest.mark.parametrize(
    "line",
    [
        b'{"custom_id": "a\\udc00", "messages": [{"role": "user", "content": "hi"}]}',
        b'{"custom_id": "a\\ud800", "method": "POST", "url": "/v1/chat/completions", "body": {}}',
        b'{"custom_id": "a", "params": {"\\udc00": 1}}',
    ],
)
def test_a_lone_surrogate_in_a_jsonl_line_is_not_json(line: bytes) -> None:
    # Lines are decoded by orjson, which refuses an escaped lone surrogate: none can reach
    # the rows (or the ledger) from an uploaded file.
    error = line_error("f.jsonl", line + b"\n")
    assert error.line == 1
    assert error.reason.startswith("not valid JSON (")


# --- reading a chunk at a time ----------------------------------------------------------


def reader_of(filename: str, data: bytes, limits: SubmitLimits = LIMITS) -> FileReader:
    return FileReader(filename, io.BufferedReader(io.BytesIO(data)), limits)


def test_chunks_continue_indexes_default_ids_and_lines() -> None:
    data = b'{"messages": [{"role": "user", "content": "a"}]}\n\n' + b"".join(
        b'{"messages": [{"role": "user", "content": "%d"}]}\n' % i for i in range(4)
    )
    reader = reader_of("c.jsonl", data)
    chunks = []
    while chunk := reader.next_chunk(max_rows=2):
        chunks.append(contents(chunk))
    assert chunks == [
        [("row-1", "a"), ("row-2", "0")],
        [("row-3", "1"), ("row-4", "2")],
        [("row-5", "3")],
    ]
    assert (reader.rows, list(reader.lines)) == (5, [1, 3, 4, 5, 6])


def test_a_chunk_is_cut_by_bytes_but_holds_at_least_one_row() -> None:
    data = b"one\ntwo\nthree\n"
    reader = reader_of("d.csv", data)
    assert [len(reader.next_chunk(max_bytes=1)) for _ in range(4)] == [1, 1, 1, 0]


def test_a_bad_line_in_a_later_chunk_names_its_line() -> None:
    data = b"one\ntwo\n\nthree\n" + b'"unclosed\n'
    reader = reader_of("e.csv", data)
    assert len(reader.next_chunk(max_rows=2)) == 2
    with pytest.raises(LineError) as caught:
        reader.next_chunk(max_rows=2)
    assert caught.value.line == 5


def test_a_repeat_found_after_the_chunks_is_worded_in_lines() -> None:
    data = b'{"custom_id": "x", "messages": [{"role": "user", "content": "a"}]}\n' * 2
    reader = reader_of("f.jsonl", data)
    while reader.next_chunk(max_rows=1):
        pass
    error = reader.duplicate("x", 1, 0)
    assert (error.line, error.reason) == (2, "custom_id 'x' duplicates line 1")


def test_a_byte_that_is_not_utf8_is_found_before_any_chunk() -> None:
    data = b"one\ntwo\n" * 1000 + b"\xff\n"
    with pytest.raises(LineError) as caught:
        reader_of("g.csv", data, SubmitLimits(max_rows=10_000, max_content_bytes=64))
    assert (caught.value.line, caught.value.reason) == (2001, "not valid UTF-8 text")


def test_the_utf8_check_spans_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upload_formats, "CHECK_WINDOW", 3)
    good = "é\nü\n€\n".encode()  # characters cut across the 3-byte windows
    assert reader_of("h.csv", good).next_chunk() != []
    with pytest.raises(LineError) as caught:
        reader_of("h.csv", good + b"ok\n\xe2\x82\n")
    assert caught.value.line == 5


# --- one row's bytes ----------------------------------------------------------------------

ROW_CAP = SubmitLimits(max_rows=5, max_content_bytes=110, max_row_bytes=120)


class CountingReader(io.BytesIO):
    """A file that records the largest single read asked of it."""

    largest = 0

    def readline(self, size: int | None = -1) -> bytes:
        line = super().readline(size)
        self.largest = max(self.largest, len(line))
        return line


def test_a_jsonl_line_over_the_row_limit_names_its_line_read_no_further() -> None:
    message = b'{"role": "user", "content": "xxxxxxxxxx"}'
    long_row = b'{"messages": [' + b", ".join([message] * 1000) + b"]}"
    data = row("ok") + b"\n" + long_row + b"\n" + row("after")
    source = CountingReader(data)
    reader = FileReader("big.jsonl", source, ROW_CAP)
    with pytest.raises(LineError) as caught:
        while reader.next_chunk():
            pass
    assert (caught.value.line, caught.value.reason) == (2, "the row is larger than 120 bytes")
    assert source.largest <= 120 + 4  # bounded readline: the long line was never read whole


def test_a_jsonl_line_at_the_row_limit_passes_with_a_bom_and_as_the_last_line() -> None:
    line = b'{"messages": [{"role": "user", "content": "' + b"y" * 70 + b'"}]}'
    line += b" " * (120 - len(line))
    assert len(line) == 120
    rows = parse_upload_file("at.jsonl", codecs.BOM_UTF8 + line + b"\n" + line, ROW_CAP)
    assert len(rows) == 2


def test_a_csv_record_over_the_row_limit_names_its_first_line() -> None:
    many_fields = b",".join([b"abcdefghij"] * 50)  # fields within the field limit
    assert line_error("big.csv", b"one\n" + many_fields + b"\n", ROW_CAP).line == 2
    quoted = b"one\n" + b'"ab\ncd",' * 30 + b"x\n"  # one record of small fields, many lines
    error = line_error("quoted.csv", quoted, ROW_CAP)
    assert (error.line, error.reason) == (2, "the row is larger than 120 bytes")
    assert len(parse_upload_file("ok.csv", b"z" * 60 + b"\n" + b"w" * 60, ROW_CAP)) == 2


def test_a_csv_row_is_counted_in_utf8_bytes() -> None:
    prompt = "é" * 50  # 50 characters, 100 bytes
    assert len(parse_upload_file("e.csv", prompt.encode(), ROW_CAP)) == 1
    error = line_error("e.csv", ("é" * 61).encode(), ROW_CAP)  # 122 bytes
    assert error.reason == "the row is larger than 120 bytes"


def test_a_csv_file_left_early_closes_without_an_unraisable_error() -> None:
    spool = io.BufferedReader(io.BytesIO(b"one\ntwo\nthree\n"))
    reader = FileReader("x.csv", spool, LIMITS)
    assert len(reader.next_chunk(max_rows=1)) == 1
    spool.close()  # the upload's spool closes with the request; the reader goes after
    del reader
