"""``relay batch results`` formats and ``submit``'s ``key=value`` options (no servers)."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from relay_batches.services.relay_cli.__main__ import _parser
from relay_batches.services.relay_cli.args import UsageError, pairs
from relay_batches.services.relay_cli.batch import upload_fields
from relay_batches.services.relay_cli.outputs import (
    CsvWriter,
    FormatError,
    JsonWriter,
    RowWriter,
    ndjson_lines,
    output_format,
)

ROWS = [
    {"custom_id": "a", "content": "one, with a comma"},
    {
        "custom_id": "b",
        "error": "upstream_error: 503",
        "usage": {"prompt_tokens": 3, "completion_tokens": 0},
        "attempts": 4,
        "deployment": None,
        "latency_ms": 900,
        "finish_reason": None,
    },
    {
        "custom_id": "c",
        "content": "",
        "tool_calls": [
            {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    },
]


def written(writer: RowWriter) -> bytes:
    return writer.head() + b"".join(writer.row(orjson.dumps(r)) for r in ROWS) + writer.tail()


def test_the_format_is_the_flag_else_the_extension_else_jsonl() -> None:
    assert output_format(None, None) == "jsonl"
    assert output_format(None, Path("out.CSV")) == "csv"
    assert output_format(None, Path("out.json")) == "json"
    assert output_format(None, Path("out.jsonl")) == "jsonl"
    assert output_format(None, Path("out.ndjson")) == "jsonl"
    assert output_format("csv", Path("out.jsonl")) == "csv"
    with pytest.raises(FormatError, match=r"out\.txt .*--format"):
        output_format(None, Path("out.txt"))


def test_jsonl_json_and_csv_writers() -> None:
    lines = written(RowWriter({}, False)).splitlines()
    assert [orjson.loads(line) for line in lines] == ROWS
    writer = JsonWriter({"id": "x", "status": "completed"}, False)
    assert orjson.loads(written(writer)) == {"id": "x", "status": "completed", "data": ROWS}
    assert writer.rows == 3
    empty = JsonWriter({"id": "x", "status": "completed"}, False)
    assert orjson.loads(empty.head() + empty.tail()) == {
        "id": "x",
        "status": "completed",
        "data": [],
    }

    records = list(csv.reader(io.StringIO(written(CsvWriter({}, False)).decode())))
    assert records[0] == ["custom_id", "content", "error", "tool_calls"]
    assert records[1] == ["a", "one, with a comma", "", ""]
    assert records[2] == ["b", "", "upstream_error: 503", ""]
    assert orjson.loads(records[3][3])[0]["function"]["name"] == "f"
    detailed = list(csv.reader(io.StringIO(written(CsvWriter({}, True)).decode())))
    assert detailed[0][4:] == [
        "prompt_tokens",
        "completion_tokens",
        "attempts",
        "deployment",
        "latency_ms",
        "finish_reason",
        "cost_usd",
    ]
    assert detailed[2][4:] == ["3", "0", "4", "", "900", "", ""]


async def test_ndjson_lines_however_the_chunks_cut_them() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for chunk in (b'{"a":', b'1}\n{"b"', b":2}\n\n", b'{"c":3}'):
            yield chunk

    assert [line async for line in ndjson_lines(chunks())] == [b'{"a":1}', b'{"b":2}', b'{"c":3}']


def test_pairs_read_json_values_else_text() -> None:
    raw = ["temperature=0.2", 'stop=["x"]', "user=ann", "seed=7", "empty="]
    assert pairs(raw, "--param", as_json=True) == {
        "temperature": 0.2,
        "stop": ["x"],
        "user": "ann",
        "seed": 7,
        "empty": "",
    }
    assert pairs(["n=7"], "--metadata", as_json=False) == {"n": "7"}
    with pytest.raises(UsageError, match="--metadata takes KEY=VALUE, got 'team'"):
        pairs(["team"], "--metadata", as_json=False)
    with pytest.raises(UsageError, match="--param a is given more than once"):
        pairs(["a=1", "a=2"], "--param", as_json=True)


def test_submit_options_become_upload_fields() -> None:
    args = _parser().parse_args(
        [
            "batch",
            "submit",
            "f.csv",
            "--model",
            "m",
            "--param",
            "top_p=0.5",
            "--temperature",
            "0.2",
            "--max-tokens",
            "64",
            "--metadata",
            "team=search",
            "--completion-window",
            "2h",
            "--priority",
            "3",
            "--budget",
            "1.5",
            "--prompt-column",
            "text",
            "--id-column",
            "id",
        ]
    )
    fields = upload_fields(args)
    assert orjson.loads(fields.pop("params")) == {
        "top_p": 0.5,
        "temperature": 0.2,
        "max_tokens": 64,
    }
    assert fields == {
        "model": "m",
        "metadata": '{"team":"search"}',
        "completion_window": "2h",
        "priority": "3",
        "budget_usd": "1.5",
        "prompt_column": "text",
        "id_column": "id",
    }
    twice = _parser().parse_args(
        ["batch", "submit", "f.csv", "--param", "temperature=1", "--temperature", "0.5"]
    )
    with pytest.raises(UsageError, match="temperature is given twice"):
        upload_fields(twice)
    assert upload_fields(_parser().parse_args(["batch", "submit", "f.csv"])) == {}
