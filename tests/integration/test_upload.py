"""``POST /v1/batches/upload``, ``GET /v1/models`` and the panel's static files, over real
HTTP against the ingest-api on the real Postgres and RabbitMQ.

No dispatcher runs here, so created jobs stay ``queued`` (or ``scheduled``).
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
from aiohttp.test_utils import TestServer

from relay_batches.dialects.chat import PARAM_FIELDS
from relay_batches.ids import new_id
from relay_batches.ledger.jobs import JobWriter
from relay_batches.services.ingest_api.rows import files as upload_formats
from relay_batches.services.relay_cli import admin
from tests.helpers.api import TEST_LIMITS, TEST_MAX_BODY
from tests.helpers.support import ApiClient, Isolation

ROW_FIELDS = ", ".join(sorted({*PARAM_FIELDS, "custom_id", "messages", "model"}))

MODEL = "gpt-4o-mini"
CSV = b'Classify: great product\n"Classify: good, but pricey"\n'
JSONL = (
    b'{"custom_id": "j-1", "messages": [{"role": "user", "content": "first"}]}\n'
    b'{"messages": [{"role": "system", "content": "be brief"}, '
    b'{"role": "user", "content": "second"}]}\n'
)


@pytest.fixture
async def fresh(iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession) -> ApiClient:
    """A client of a workspace of its own, empty at the start of the test."""
    created = await admin.create_key(iso.database_url, f"upload-{new_id()[:12]}")
    return ApiClient(str(api_server.make_url("")).rstrip("/"), created.key, http)


def form(files: list[tuple[str, bytes]], **fields: str) -> aiohttp.FormData:
    """A multipart body with ``file`` parts and option fields (model defaults to MODEL)."""
    data = aiohttp.FormData(default_to_multipart=True)
    for name, value in {"model": MODEL, **fields}.items():
        data.add_field(name, value)
    for filename, content in files:
        data.add_field("file", content, filename=filename, content_type="text/plain")
    return data


async def upload(client: ApiClient, body: Any, **kw: Any) -> tuple[int, Any]:
    """POST ``body`` to the upload endpoint."""
    return await client.request("POST", "/v1/batches/upload", data=body, **kw)


async def job_count(client: ApiClient) -> int:
    """How many jobs the client's workspace has."""
    status, page = await client.request("GET", "/v1/batches?limit=100")
    assert status == 200, page
    return len(page["data"])


async def stored_rows(pool: asyncpg.Pool, batch_id: str) -> list[tuple[str, Any]]:
    """(custom_id, messages) of every stored row, in order."""
    records = await pool.fetch(
        "SELECT custom_id, request FROM batch_rows WHERE batch_id = $1 ORDER BY row_index",
        batch_id,
    )
    return [(r["custom_id"], orjson.loads(r["request"])) for r in records]


def user(content: str) -> list[dict[str, str]]:
    return [{"content": content, "role": "user"}]


async def test_one_job_per_file_with_rows_in_order(fresh: ApiClient, pool: asyncpg.Pool) -> None:
    status, body = await upload(fresh, form([("reviews.csv", CSV), ("chats.jsonl", JSONL)]))
    assert status == 201, body
    assert body["object"] == "list"
    csv_job, jsonl_job = body["data"]
    assert (csv_job["name"], csv_job["total"], csv_job["status"]) == ("reviews.csv", 2, "queued")
    assert (jsonl_job["name"], jsonl_job["total"]) == ("chats.jsonl", 2)
    assert await fresh.get(csv_job["id"]) == csv_job
    assert await stored_rows(pool, csv_job["id"]) == [
        ("row-1", user("Classify: great product")),
        ("row-2", user("Classify: good, but pricey")),
    ]
    assert await stored_rows(pool, jsonl_job["id"]) == [
        ("j-1", user("first")),
        ("row-2", [{"content": "be brief", "role": "system"}, *user("second")]),
    ]


async def test_options_apply_to_every_job(fresh: ApiClient) -> None:
    fields = {
        "name": "October",
        "priority": "7",
        "webhookUrl": "https://example.com/hook",
        "cron": "0 6 * * 1",
    }
    status, body = await upload(fresh, form([("a.csv", b"x\n"), ("b.csv", b"y\n")], **fields))
    assert status == 201, body
    for job, filename in zip(body["data"], ["a.csv", "b.csv"], strict=True):
        assert job["name"] == f"October — {filename}"
        assert (job["priority"], job["cron"], job["status"]) == (7, "0 6 * * 1", "scheduled")
        assert job["next_run_at"] is not None


async def test_blank_optional_fields_are_absent(fresh: ApiClient) -> None:
    fields = {"name": "", "priority": "", "webhookUrl": "", "cron": ""}
    status, body = await upload(fresh, form([("only.jsonl", JSONL)], **fields))
    assert status == 201, body
    (job,) = body["data"]
    assert (job["name"], job["priority"], job["cron"]) == ("only.jsonl", 0, None)


async def test_a_bad_line_names_file_and_line_and_creates_no_job(fresh: ApiClient) -> None:
    bad = JSONL + b'{"messages": "not a list"}\n'
    status, body = await upload(fresh, form([("good.csv", CSV), ("bad.jsonl", bad)]))
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == "file[1]"
    assert body["error"]["message"] == "'bad.jsonl' line 3: messages must be a non-empty array"
    assert await job_count(fresh) == 0


@pytest.mark.parametrize(
    ("fields", "files", "param", "fragment"),
    [
        pytest.param({"model": "nope"}, [("a.csv", CSV)], "model", "unknown", id="model"),
        pytest.param({"priority": "high"}, [("a.csv", CSV)], "priority", "integer", id="priority"),
        pytest.param({"cron": "61 * * * *"}, [("a.csv", CSV)], "cron", "not valid", id="cron"),
        pytest.param({}, [], "file", "at least one file", id="no-files"),
        pytest.param({}, [("a.txt", b"hi")], "file[0]", "'a.txt': file name", id="extension"),
        pytest.param({}, [("a.csv", b"a,b\n")], "file[0]", "'a.csv' line 1", id="csv-fields"),
    ],
)
async def test_rejected_uploads_create_no_job(
    fresh: ApiClient,
    fields: dict[str, str],
    files: list[tuple[str, bytes]],
    param: str,
    fragment: str,
) -> None:
    status, body = await upload(fresh, form(files, **fields))
    assert status == 400, body
    assert body["error"]["param"] == param
    assert fragment in body["error"]["message"]
    assert await job_count(fresh) == 0


@pytest.mark.parametrize("value", ["a\x00b", "two\nlines", "tab\there"])
async def test_a_field_with_control_characters_is_refused(fresh: ApiClient, value: str) -> None:
    status, body = await upload(fresh, form([("a.csv", CSV)], name=value))
    assert (status, body["error"]["param"]) == (400, "name"), body
    assert await job_count(fresh) == 0


async def test_an_unknown_part_is_refused_naming_it(fresh: ApiClient) -> None:
    data = form([("a.csv", CSV)])
    data.add_field("webhook_url", "https://example.com/hook")
    status, body = await upload(fresh, data)
    assert (status, body["error"]["param"]) == (400, "webhook_url"), body
    assert "is not a field of an upload" in body["error"]["message"]
    assert await job_count(fresh) == 0


async def test_an_empty_file_input_is_dropped(fresh: ApiClient) -> None:
    data = form([("a.csv", CSV)])
    data.add_field("file", b"", filename="", content_type="application/octet-stream")
    status, body = await upload(fresh, data)
    assert status == 201, body
    assert [b["name"] for b in body["data"]] == ["a.csv"]


async def test_a_field_given_twice_is_refused(fresh: ApiClient) -> None:
    data = form([("a.csv", CSV)])
    data.add_field("model", MODEL)
    status, body = await upload(fresh, data)
    assert (status, body["error"]["param"]) == (400, "model")


async def test_wrong_content_type_is_415(fresh: ApiClient) -> None:
    status, body = await fresh.request(
        "POST", "/v1/batches/upload", json={"model": MODEL, "requests": []}
    )
    assert (status, body["error"]["type"]) == (415, "unsupported_media_type")


def multipart_bytes(size: int) -> tuple[bytes, str]:
    """A multipart body with one .csv file of about ``size`` bytes, and its content type."""
    boundary = "relayboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{MODEL}\r\n'
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="big.csv"\r\n'
        "Content-Type: text/csv\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    return head + b"p\n" * (size // 2) + tail, f"multipart/form-data; boundary={boundary}"


async def test_body_over_the_limit_is_413_declared_or_chunked(fresh: ApiClient) -> None:
    raw, content_type = multipart_bytes(TEST_MAX_BODY + 10)
    headers = {"Content-Type": content_type}
    status, body = await upload(fresh, io.BytesIO(raw), headers=headers)
    assert (status, body["error"]["type"]) == (413, "request_too_large")

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(raw), 32 * 1024):
            yield raw[start : start + 32 * 1024]

    status, body = await upload(fresh, chunks(), headers=headers)
    assert (status, body["error"]["type"]) == (413, "request_too_large")
    assert await job_count(fresh) == 0


def file_part_body(disposition: bytes) -> bytes:
    """A multipart body (boundary ``b``) with the model and one file part."""
    return (
        b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\n' + MODEL.encode() + b"\r\n"
        b"--b\r\nContent-Disposition: " + disposition + b"\r\n\r\nhello\r\n--b--\r\n"
    )


async def test_a_filename_with_control_characters_is_cleaned(fresh: ApiClient) -> None:
    raw = file_part_body(b"form-data; name=\"file\"; filename*=utf-8''dir%2Fa%00b%01.csv")
    headers = {"Content-Type": "multipart/form-data; boundary=b"}
    status, body = await upload(fresh, raw, headers=headers)
    assert status == 201, body
    assert body["data"][0]["name"] == "ab.csv"


@pytest.mark.parametrize(
    "disposition",
    [
        pytest.param(b'form-data; name="file"; filename="a\x00b.csv"', id="nul-in-header"),
        pytest.param(b'\\orm-data;\x9dname="file"', id="bad-disposition"),
    ],
)
async def test_malformed_part_headers_are_400(fresh: ApiClient, disposition: bytes) -> None:
    raw = file_part_body(disposition)
    headers = {"Content-Type": "multipart/form-data; boundary=b"}
    status, body = await upload(fresh, raw, headers=headers)
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error"
    assert await job_count(fresh) == 0


async def test_malformed_multipart_is_400(fresh: ApiClient) -> None:
    headers = {"Content-Type": "multipart/form-data; boundary=zzz"}
    status, body = await upload(fresh, b"this is not multipart at all", headers=headers)
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error"


async def test_upload_needs_a_key(fresh: ApiClient) -> None:
    status, body = await upload(fresh, form([("a.csv", CSV)]), key="rk_not_a_key")
    assert (status, body["error"]["type"]) == (401, "authentication_error")


async def test_models_lists_the_router_aliases(fresh: ApiClient) -> None:
    status, body = await fresh.request("GET", "/v1/models")
    assert status == 200
    assert body == {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
    status, body = await fresh.request("GET", "/v1/models", key="rk_not_a_key")
    assert status == 401


async def test_panel_is_served_without_a_key_with_a_strict_policy(
    api_server: TestServer, http: aiohttp.ClientSession
) -> None:
    base = str(api_server.make_url("")).rstrip("/")
    async with http.get(f"{base}/panel") as response:
        assert response.status == 200
        assert response.content_type == "text/html"
        assert "script-src 'self'" in response.headers["Content-Security-Policy"]
        page = await response.text()
    assert '<script type="module" src="/panel/static/main.js">' in page
    assert "http://" not in page and "https://" not in page.replace("https://my-app", "")
    async with http.get(f"{base}/panel/static/main.js") as response:
        assert response.status == 200
        assert response.content_type == "text/javascript"
    for missing in ("/panel/static/nope.js", "/panel/static/..%2f__init__.py"):
        async with http.get(base + missing) as response:
            assert response.status == 404
            assert (await response.json())["error"]["type"] == "not_found_error"


async def test_idempotency_key_on_upload_replays_and_creates_once(fresh: ApiClient) -> None:
    files = [
        ("a.csv", b"one\ntwo\n"),
        ("b.jsonl", b'{"messages":[{"role":"user","content":"x"}]}\n'),
    ]
    headers = {"Idempotency-Key": f"upload-{new_id()}"}
    s1, first = await upload(fresh, form(files, name="idem"), headers=headers)
    s2, second = await upload(fresh, form(files, name="idem"), headers=headers)
    assert (s1, s2) == (201, 201)
    assert second == first
    assert await job_count(fresh) == 2
    s3, conflict = await upload(fresh, form(files[:1], name="idem"), headers=headers)
    assert (s3, conflict["error"]["type"], conflict["error"]["param"]) == (
        409,
        "conflict_error",
        "Idempotency-Key",
    )
    assert await job_count(fresh) == 2


async def test_a_blank_field_and_an_absent_one_are_the_same_upload_for_idempotency(
    fresh: ApiClient,
) -> None:
    files = [("a.csv", b"one\n")]
    headers = {"Idempotency-Key": f"upload-{new_id()}"}
    s1, first = await upload(fresh, form(files, name="", webhookUrl=""), headers=headers)
    s2, second = await upload(fresh, form(files), headers=headers)
    assert (s1, s2) == (201, 201)
    assert second == first  # replayed: a blank field means absent, here too
    assert await job_count(fresh) == 1


async def test_uploaded_jobs_are_invisible_to_another_workspace(
    fresh: ApiClient, client_b: ApiClient
) -> None:
    status, created = await upload(fresh, form([("a.csv", b"hello\n")]))
    assert status == 201
    batch_id = created["data"][0]["id"]
    for method, path in (
        ("GET", f"/v1/batches/{batch_id}"),
        ("GET", f"/v1/batches/{batch_id}/results"),
        ("GET", f"/v1/batches/{batch_id}/dead_letter"),
        ("POST", f"/v1/batches/{batch_id}/cancel"),
    ):
        status, body = await client_b.request(method, path)
        assert (status, body["error"]["type"]) == (404, "not_found_error"), path
    _, listing = await client_b.request("GET", "/v1/batches?limit=100")
    assert batch_id not in {b["id"] for b in listing["data"]}


# --- the job-level fields of POST /v1/batches ------------------------------------------

PARAMS = {"temperature": 0.2, "max_tokens": 50}


async def test_params_field_gives_the_jobs_params(fresh: ApiClient) -> None:
    status, body = await upload(
        fresh, form([("a.csv", CSV), ("b.jsonl", JSONL)], params=orjson.dumps(PARAMS).decode())
    )
    assert status == 201, body
    for job in body["data"]:
        assert job["params"] == PARAMS
        assert (await fresh.get(job["id"]))["params"] == PARAMS


async def test_upload_and_json_create_build_the_same_job(fresh: ApiClient) -> None:
    fields: dict[str, Any] = {
        "name": "October",
        "priority": 7,
        "webhookUrl": "https://example.com/hook",
        "cron": "0 6 * * 1",
        "params": {"stop": ["\n\n"], "response_format": {"type": "json_object"}},
    }
    rows = [{"messages": [{"role": "user", "content": "Classify: great product"}]}]
    created = await fresh.submit({"model": MODEL, "requests": rows, **fields})
    as_text = {**fields, "priority": "7", "params": orjson.dumps(fields["params"]).decode()}
    status, body = await upload(fresh, form([("a.csv", b"Classify: great product\n")], **as_text))
    assert status == 201, body
    (uploaded,) = body["data"]
    differ = ("id", "created_at", "next_run_at")
    assert {k: v for k, v in uploaded.items() if k not in differ} == {
        k: v for k, v in created.items() if k not in differ
    }


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"temperature": 5}, id="out-of-range"),
        pytest.param({"temprature": 0.2}, id="unknown-key"),
        pytest.param({"response_format": {"type": "xml"}}, id="nested"),
        pytest.param([0.2], id="not-an-object"),
    ],
)
async def test_bad_params_get_the_json_creates_error(fresh: ApiClient, params: Any) -> None:
    s1, from_json = await fresh.request(
        "POST",
        "/v1/batches",
        json={"model": MODEL, "requests": [{"messages": user("x")}], "params": params},
    )
    s2, from_upload = await upload(
        fresh, form([("a.csv", CSV)], params=orjson.dumps(params).decode())
    )
    assert (s1, s2) == (400, 400)
    assert from_upload == from_json
    assert from_upload["error"]["param"].startswith("params")
    assert await job_count(fresh) == 0


async def test_the_budget_field_gives_every_job_its_budget(fresh: ApiClient) -> None:
    status, body = await upload(fresh, form([("a.csv", CSV), ("b.csv", CSV)], budget_usd="2.5"))
    assert status == 201, body
    assert [job["budget_usd"] for job in body["data"]] == [2.5, 2.5]


@pytest.mark.parametrize("budget", ["two", "0", "-1", "1e7", "true", "NaN"])
async def test_a_bad_budget_field_is_400_and_creates_no_job(fresh: ApiClient, budget: str) -> None:
    status, body = await upload(fresh, form([("a.csv", CSV)], budget_usd=budget))
    assert status == 400, body
    assert body["error"]["param"] == "budget_usd"
    assert await job_count(fresh) == 0


async def test_params_that_are_not_json_are_400(fresh: ApiClient) -> None:
    status, body = await upload(fresh, form([("a.csv", CSV)], params="temperature=0.2"))
    assert status == 400, body
    assert body["error"] == {
        "type": "invalid_request_error",
        "message": "params must be JSON text",
        "param": "params",
    }


async def test_a_json_field_may_be_longer_than_a_text_field(fresh: ApiClient) -> None:
    schema = {"type": "object", "description": "d" * 20_000}
    params = {"response_format": {"type": "json_schema", "json_schema": schema}}
    status, body = await upload(
        fresh,
        form([("a.csv", CSV)], params=orjson.dumps(params, option=orjson.OPT_INDENT_2).decode()),
    )
    assert status == 201, body
    assert body["data"][0]["params"] == params


async def test_an_unknown_key_of_a_jsonl_row_is_refused_naming_it(fresh: ApiClient) -> None:
    bogus = b'{"messages": [{"role": "user", "content": "x"}], "bogus": 1}\n'
    status, data = await upload(fresh, form([("a.jsonl", JSONL + bogus)]))
    assert status == 400, data
    assert data["error"]["param"] == "file[0]"
    assert data["error"]["message"] == (
        f"'a.jsonl' line 3: bogus is not a field of a request (fields: {ROW_FIELDS})"
    )
    assert await job_count(fresh) == 0


# --- OpenAI and Anthropic files --------------------------------------------------------


def openai_line(custom_id: str, content: str) -> bytes:
    body = {"model": MODEL, "messages": user(content), "max_tokens": 8}
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return orjson.dumps(line)


def anthropic_line(custom_id: str, content: Any) -> bytes:
    params = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    return orjson.dumps({"custom_id": custom_id, "params": params})


def no_model_form(files: list[tuple[str, bytes]]) -> aiohttp.FormData:
    data = aiohttp.FormData(default_to_multipart=True)
    for filename, content in files:
        data.add_field("file", content, filename=filename, content_type="text/plain")
    return data


async def test_dialect_files_need_no_model_field_and_keep_each_rows_model(
    fresh: ApiClient, pool: asyncpg.Pool
) -> None:
    openai_file = openai_line("o-1", "first") + b"\n" + openai_line("o-2", "second") + b"\n"
    parts = [{"type": "text", "text": "look"}]
    anthropic_file = anthropic_line("a_1", parts) + b"\n"
    status, body = await upload(
        fresh, no_model_form([("openai.jsonl", openai_file), ("anthropic.jsonl", anthropic_file)])
    )
    assert status == 201, body
    openai_job, anthropic_job = body["data"]
    assert (openai_job["model"], openai_job["total"]) == (MODEL, 2)
    assert (anthropic_job["model"], anthropic_job["total"]) == (MODEL, 1)
    assert await stored_rows(pool, openai_job["id"]) == [
        ("o-1", {"max_tokens": 8, "messages": user("first"), "model": MODEL}),
        ("o-2", {"max_tokens": 8, "messages": user("second"), "model": MODEL}),
    ]
    assert await stored_rows(pool, anthropic_job["id"]) == [
        ("a_1", {"max_tokens": 8, "messages": [{"content": parts, "role": "user"}], "model": MODEL})
    ]


async def test_a_file_without_row_models_still_needs_the_model_field(fresh: ApiClient) -> None:
    status, body = await upload(fresh, no_model_form([("a.csv", CSV)]))
    assert (status, body["error"]["param"]) == (400, "model")
    assert body["error"]["message"] == (
        "model is required: give the model field, or a model in every row of the file"
        " (OpenAI and Anthropic lines always carry one)"
    )
    assert await job_count(fresh) == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(
            openai_line("o-1", "x") + b"\n" + anthropic_line("a", "y"),
            "'mixed.jsonl' line 2: is an Anthropic request {custom_id, params} but the file's"
            " first line is an OpenAI batch line {custom_id, method, url, body}: a file holds"
            " one format",
            id="mixed",
        ),
        pytest.param(
            anthropic_line("a", "x") + b"\n\n" + anthropic_line("b", "y")[:-2],
            "'mixed.jsonl' line 3: not valid JSON (unexpected end of data at column 107)",
            id="broken",
        ),
        pytest.param(
            openai_line("o-1", "x").replace(b"/v1/chat/completions", b"/v1/audio/speech"),
            "'mixed.jsonl' line 1: url must be one of /v1/chat/completions, /v1/embeddings,"
            " /v1/completions, /v1/moderations, /v1/responses (the endpoints Relay runs)",
            id="endpoint",
        ),
        pytest.param(
            openai_line("o-1", "x").replace(b"/v1/chat/completions", b"/v1/embeddings"),
            "'mixed.jsonl' line 1: body.messages is not a field of an embeddings request"
            " (fields: dimensions, encoding_format, input, model, user)",
            id="embeddings-body",
        ),
    ],
)
async def test_a_mixed_or_broken_dialect_file_names_the_line(
    fresh: ApiClient, content: bytes, message: str
) -> None:
    status, body = await upload(fresh, form([("ok.jsonl", JSONL), ("mixed.jsonl", content)]))
    assert (status, body["error"]["param"], body["error"]["message"]) == (400, "file[1]", message)
    assert await job_count(fresh) == 0


# --- files stored a chunk at a time -------------------------------------------------------


def numbered(tag: str, count: int) -> bytes:
    """A .jsonl of ``count`` rows ``<tag>-0`` … with the content ``c<i>``."""
    return b"".join(
        orjson.dumps({"custom_id": f"{tag}-{i}", "messages": user(f"c{i}")}) + b"\n"
        for i in range(count)
    )


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows validated and COPY'd three at a time, so a small file spans several chunks."""
    monkeypatch.setattr(upload_formats, "CHUNK_ROWS", 3)


@pytest.mark.usefixtures("small_chunks")
async def test_a_file_of_many_chunks_lands_exactly(fresh: ApiClient, pool: asyncpg.Pool) -> None:
    tag = new_id()[:8]
    status, body = await upload(fresh, form([("a.jsonl", numbered(tag, 10)), ("b.csv", CSV)]))
    assert status == 201, body
    many, other = body["data"]
    assert (many["total"], other["total"]) == (10, 2)
    assert await stored_rows(pool, many["id"]) == [(f"{tag}-{i}", user(f"c{i}")) for i in range(10)]
    assert [cid for cid, _ in await stored_rows(pool, other["id"])] == ["row-1", "row-2"]


@pytest.mark.usefixtures("small_chunks")
async def test_a_repeat_in_a_later_chunk_stores_nothing(
    fresh: ApiClient, pool: asyncpg.Pool
) -> None:
    tag = new_id()[:8]
    data = numbered(tag, 8) + orjson.dumps({"custom_id": f"{tag}-2", "messages": user("x")})
    status, body = await upload(fresh, form([("ok.csv", CSV), ("dup.jsonl", data)]))
    assert status == 400, body
    assert body["error"]["param"] == "file[1]"
    assert body["error"]["message"] == f"'dup.jsonl' line 9: custom_id '{tag}-2' duplicates line 3"
    assert await job_count(fresh) == 0
    kept = await pool.fetchval(
        "SELECT count(*) FROM batch_rows WHERE custom_id LIKE $1", f"{tag}-%"
    )
    assert kept == 0


@pytest.mark.usefixtures("small_chunks")
async def test_a_bad_line_after_stored_chunks_stores_nothing(
    fresh: ApiClient, pool: asyncpg.Pool
) -> None:
    tag = new_id()[:8]
    status, body = await upload(fresh, form([("late.jsonl", numbered(tag, 7) + b"{oops\n")]))
    assert status == 400, body
    assert body["error"]["message"].startswith("'late.jsonl' line 8: not valid JSON")
    assert await job_count(fresh) == 0
    kept = await pool.fetchval(
        "SELECT count(*) FROM batch_rows WHERE custom_id LIKE $1", f"{tag}-%"
    )
    assert kept == 0


# --- bounds and order of the store --------------------------------------------------------


async def test_a_row_over_the_row_limit_names_its_file_and_line(
    fresh: ApiClient, pool: asyncpg.Pool
) -> None:
    tag = new_id()[:8]
    long_row = {"custom_id": f"{tag}-long", "messages": user("x" * 1000) * 200}  # ~200 KiB
    data = numbered(tag, 2) + orjson.dumps(long_row) + b"\n" + numbered(tag + "z", 1)
    status, body = await upload(fresh, form([("ok.csv", CSV), ("long.jsonl", data)]))
    assert (status, body["error"]["param"]) == (400, "file[1]"), body
    assert body["error"]["message"] == (
        f"'long.jsonl' line 3: the row is larger than {TEST_LIMITS.max_row_bytes} bytes"
    )
    assert await job_count(fresh) == 0
    kept = await pool.fetchval("SELECT count(*) FROM batch_rows WHERE custom_id LIKE $1", f"{tag}%")
    assert kept == 0


async def test_a_bad_field_without_a_model_field_is_refused_before_the_rows(
    fresh: ApiClient,
) -> None:
    data = no_model_form([("o.jsonl", openai_line("o-1", "x") + b"\n{oops\n")])
    data.add_field("cron", "every day")
    status, body = await upload(fresh, data)
    assert (status, body["error"]["param"]) == (400, "cron"), body  # not the bad line
    assert await job_count(fresh) == 0


async def test_no_lock_on_batches_is_held_while_the_files_stream(
    fresh: ApiClient, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration's ALTER TABLE batches would queue behind a lock held from the first
    file's job on; the jobs' rows go in after the last file, so it does not."""
    streaming, resume = asyncio.Event(), asyncio.Event()
    seen: list[str] = []
    add_rows = JobWriter.add_rows

    async def add_rows_pausing_on_the_second_file(
        writer: JobWriter, batch_id: str, start: int, rows: Any
    ) -> None:
        if batch_id not in seen:
            seen.append(batch_id)
        if len(seen) == 2 and not streaming.is_set():
            streaming.set()
            await resume.wait()
        await add_rows(writer, batch_id, start, rows)

    monkeypatch.setattr(JobWriter, "add_rows", add_rows_pausing_on_the_second_file)
    sent = asyncio.ensure_future(upload(fresh, form([("a.csv", CSV), ("b.jsonl", JSONL)])))
    try:
        await asyncio.wait_for(streaming.wait(), 10)
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL lock_timeout = '2s'")
            await conn.execute("LOCK TABLE batches IN ACCESS EXCLUSIVE MODE")  # as ALTER TABLE
    finally:
        resume.set()
        status, body = await sent
    assert status == 201, body
    assert [job["total"] for job in body["data"]] == [2, 2]


async def test_an_upload_runs_the_forms_endpoint_or_its_openai_lines_url(
    fresh: ApiClient, pool: asyncpg.Pool
) -> None:
    native = b'{"custom_id": "e-1", "input": "alpha", "dimensions": 4}\n{"input": ["b", "c"]}\n'
    status, body = await upload(fresh, form([("embed.jsonl", native)], endpoint="/v1/embeddings"))
    assert status == 201, body
    (job,) = body["data"]
    assert (job["endpoint"], job["total"]) == ("/v1/embeddings", 2)
    assert await stored_rows(pool, job["id"]) == [
        ("e-1", {"dimensions": 4, "endpoint": "/v1/embeddings", "input": "alpha"}),
        ("row-2", {"endpoint": "/v1/embeddings", "input": ["b", "c"]}),
    ]
    line = {"custom_id": "o-1", "method": "POST", "url": "/v1/embeddings"}
    lines = orjson.dumps({**line, "body": {"model": MODEL, "input": "x"}})
    status, body = await upload(fresh, form([("openai.jsonl", lines)]))
    assert status == 201, body
    assert body["data"][0]["endpoint"] == "/v1/embeddings"
    # A chat row under an embeddings form: 400 naming the file and line.
    chat = orjson.dumps({"messages": user("hi")})
    status, body = await upload(fresh, form([("chat.jsonl", chat)], endpoint="/v1/embeddings"))
    assert status == 400, body
    assert body["error"]["message"].startswith("'chat.jsonl' line 1: messages is not a field")
