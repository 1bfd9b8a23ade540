"""The submission rules of docs/api/native.md ("Submit a batch"), each tested once, on the pure
validation functions. ``tests/integration/test_submit_validation.py`` covers only what
needs HTTP (status codes, error object, content types, sizes, auth) and a few of these
rules end to end."""

from __future__ import annotations

import orjson
import pytest

from relay_batches.dialects.chat import PARAM_FIELDS
from relay_batches.errors import ApiError
from relay_batches.services.ingest_api.rows.job_fields import (
    BatchOptions,
    parse_budget_field,
    parse_priority_field,
    validate_budget,
    validate_cron,
)
from relay_batches.services.ingest_api.rows.validation import (
    BatchSpec,
    KnownModels,
    RowError,
    RowInput,
    RowRejected,
    SubmitLimits,
    decode_json_object,
    request_rows,
    row_api_error,
    scan_submit,
    validate_submit,
)
from tests.helpers.rows import LIMITS, MODELS

HI = [{"role": "user", "content": "hi"}]
HI_JSON = '[{"content":"hi","role":"user"}]'
ROW_FIELDS = ", ".join(sorted({*PARAM_FIELDS, "custom_id", "messages", "model"}))


def body(**fields: object) -> dict[str, object]:
    """A valid submission with one row, with ``fields`` replacing or adding keys."""
    payload: dict[str, object] = {"model": "gpt-4o-mini", "requests": [{"messages": HI}]}
    payload.update(fields)
    return payload


def rows(*requests: object) -> dict[str, object]:
    return body(requests=list(requests))


def rejected(payload: object, limits: SubmitLimits = LIMITS) -> ApiError:
    """The 400 of ``validate_submit``, which the streaming ``scan_submit`` of the same
    body as JSON text must give too (same message, same field)."""
    with pytest.raises(ApiError) as info:
        validate_submit(payload, limits, MODELS)  # type: ignore[arg-type]
    assert info.value.status == 400
    assert info.value.type == "invalid_request_error"
    try:
        raw = orjson.dumps(payload)
    except TypeError:  # lone surrogates: not JSON text that a client could send
        return info.value
    with pytest.raises(ApiError) as scanned:
        scan_submit(raw, limits, MODELS)
    assert scanned.value == info.value
    return info.value


def assert_invalid(
    payload: object, param: str, fragment: str, limits: SubmitLimits = LIMITS
) -> ApiError:
    """400 with exactly ``param``; the message names the field and contains ``fragment``."""
    err = rejected(payload, limits)
    assert err.param == param
    assert err.message.startswith(param), err.message
    assert fragment in err.message, err.message
    return err


# --- decode_json_object --------------------------------------------------------------


def test_decode_json_object_returns_the_object() -> None:
    assert decode_json_object(b' {"model": "m", "n": [1, 2.5]} ') == {"model": "m", "n": [1, 2.5]}


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"{'a': 1}", b"\xff\xfe", b"NaN", b'{"a": 1e999}', b'{"model": "\\ud800"}'],
)
def test_decode_json_object_rejects_non_json(raw: bytes) -> None:
    with pytest.raises(ApiError) as info:
        decode_json_object(raw)
    assert (info.value.status, info.value.param) == (400, None)
    assert info.value.message == "request body must be JSON"


@pytest.mark.parametrize("raw", [b"[]", b"[{}]", b"1", b'"text"', b"null", b"true"])
def test_decode_json_object_rejects_non_objects(raw: bytes) -> None:
    with pytest.raises(ApiError) as info:
        decode_json_object(raw)
    assert (info.value.status, info.value.param) == (400, None)
    assert info.value.message == "request body must be a JSON object"


# --- whole submission ----------------------------------------------------------------


def test_minimal_submission_gets_the_defaults() -> None:
    spec = validate_submit(
        rows({"messages": HI}, {"messages": HI}, {"messages": HI}), LIMITS, MODELS
    )
    assert spec == BatchSpec(
        BatchOptions(
            name=None,
            model="gpt-4o-mini",
            priority=0,
            webhook_url=None,
            cron=None,
            params_json="{}",
        ),
        rows=[RowInput("row-1", HI_JSON), RowInput("row-2", HI_JSON), RowInput("row-3", HI_JSON)],
    )


def test_full_submission_from_api_md() -> None:
    raw = """{
      "name": "Review sentiment — October",
      "model": "gpt-4o-mini",
      "requests": [
        { "custom_id": "r-1",
          "messages": [{ "role": "user", "content": "Classify: great product!" }] },
        { "custom_id": "r-2",
          "messages": [{ "role": "user", "content": "Classify: terrible service" }] }
      ],
      "priority": 5,
      "webhookUrl": "https://my-app/relay-webhook",
      "cron": null
    }""".encode()
    spec = validate_submit(decode_json_object(raw), LIMITS, MODELS)
    assert spec.options == BatchOptions(
        "Review sentiment — October", "gpt-4o-mini", 5, "https://my-app/relay-webhook", None
    )
    assert spec.rows == [
        RowInput("r-1", '[{"content":"Classify: great product!","role":"user"}]'),
        RowInput("r-2", '[{"content":"Classify: terrible service","role":"user"}]'),
    ]


def test_explicit_nulls_are_absent() -> None:
    payload = rows({"custom_id": None, "messages": HI})
    payload.update(name=None, priority=None, webhookUrl=None, cron=None, params=None)
    spec = validate_submit(payload, LIMITS, MODELS)
    assert spec.options == BatchOptions(None, "gpt-4o-mini", 0, None, None, "{}")
    assert spec.rows == [RowInput("row-1", HI_JSON)]


@pytest.mark.parametrize("key", ["webhook_url", "budget", "Model", "expires_at"])
def test_an_unknown_top_level_key_is_refused_naming_it(key: str) -> None:
    err = rejected(body(**{key: 1}))
    assert err.param == key
    assert "is not a field of a batch" in err.message, err.message


@pytest.mark.parametrize(
    "payload",
    [
        body(),
        body(name="n", priority=-3, params={"temperature": 0.5, "stop": ["x"]}),
        {"requests": [{"custom_id": "b", "messages": HI * 3}], "model": "claude-haiku"},
        body(requests=[{"messages": [{"role": "user", "content": "é😀\u2028" * 300}]}] * 40),
    ],
)
def test_scanning_the_text_gives_what_validating_the_decoded_body_gives(
    payload: dict[str, object],
) -> None:
    expected = validate_submit(payload, LIMITS, MODELS)
    raw = orjson.dumps(payload, option=orjson.OPT_INDENT_2)
    assert scan_submit(raw, LIMITS, MODELS) == expected
    # windows far smaller than one value: every value is split across windows
    assert scan_submit(raw, LIMITS, MODELS, window=7) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "request body must be JSON"),
        (b'{"model": "gpt-4o-mini", "requests": [{"messages": []},]}', "request body must be JSON"),
        (b'{"model": NaN}', "request body must be JSON"),
        (b'{"model": "m"} x', "request body must be JSON"),
        (b"\xff", "request body must be JSON"),
        (b"[1, 2]", "request body must be a JSON object"),
        (b"[" * 5000, "request body must be JSON"),
    ],
)
def test_scanning_refuses_what_is_not_a_json_object(raw: bytes, message: str) -> None:
    with pytest.raises(ApiError) as info:
        scan_submit(raw, LIMITS, MODELS)
    assert (info.value.status, info.value.param) == (400, None)
    assert info.value.message.startswith(message), info.value.message


def test_params_are_a_job_level_field() -> None:
    # The params rules themselves are tested in test_params.py.
    spec = validate_submit(body(params={"temperature": 0.2, "max_tokens": 50}), LIMITS, MODELS)
    assert orjson.loads(spec.options.params_json) == {"temperature": 0.2, "max_tokens": 50}
    assert_invalid(body(params={"temperature": 3}), "params.temperature", "from 0 to 2")


@pytest.mark.parametrize("payload", [[], ["model"], None, "text", 5])
def test_top_level_not_an_object(payload: object) -> None:
    err = rejected(payload)
    assert err.param is None
    assert err.message == "request body must be a JSON object"


# --- model ---------------------------------------------------------------------------


def test_model_is_required() -> None:
    payload = body()
    del payload["model"]
    assert_invalid(payload, "model", "required")


@pytest.mark.parametrize("model", [None, 5, ["gpt-4o-mini"], {"id": "gpt-4o-mini"}])
def test_model_must_be_a_string(model: object) -> None:
    assert_invalid(body(model=model), "model", "must be a string")


@pytest.mark.parametrize("model", ["gpt-5-ultra", "", "GPT-4O-MINI"])
def test_unknown_model(model: str) -> None:
    err = assert_invalid(body(model=model), "model", "unknown")
    assert repr(model) in err.message


def test_unknown_model_message_is_cut_short() -> None:
    err = assert_invalid(body(model="x" * 10_000), "model", "unknown")
    assert len(err.message) < 200


def test_model_checked_against_any_container() -> None:
    spec = validate_submit(body(model="claude-haiku"), LIMITS, {"claude-haiku": object()})
    assert spec.options.model == "claude-haiku"


# --- requests ------------------------------------------------------------------------


def test_requests_is_required() -> None:
    payload = body()
    del payload["requests"]
    assert_invalid(payload, "requests", "required")


@pytest.mark.parametrize("value", [[], None, {}, "rows", 3, {"messages": HI}])
def test_requests_must_be_a_non_empty_array(value: object) -> None:
    err = assert_invalid(body(requests=value), "requests", "")
    assert err.message == "requests must be a non-empty array"


def test_too_many_requests() -> None:
    limits = SubmitLimits(max_rows=3)
    assert len(validate_submit(rows(*[{"messages": HI}] * 3), limits, MODELS).rows) == 3
    assert_invalid(
        rows(*[{"messages": HI}] * 4), "requests", "at most 3 requests per batch", limits
    )


def test_default_row_limit_is_1_000_000() -> None:
    assert LIMITS.max_rows == 1_000_000
    assert_invalid(rows(*[{"messages": HI}] * 1_000_001), "requests", "at most 1,000,000")


@pytest.mark.parametrize("row", ["text", 1, None, [], [{"messages": HI}], True])
def test_request_must_be_an_object(row: object) -> None:
    assert_invalid(rows({"messages": HI}, row), "requests[1]", "must be an object")


@pytest.mark.parametrize(
    "row",
    [
        {"messages": []},
        {"messages": None},
        {"messages": {}},
        {"messages": "hi"},
        {"messages": {"role": "user", "content": "hi"}},
        {"custom_id": "r-3"},
    ],
)
def test_messages_must_be_a_non_empty_array(row: dict[str, object]) -> None:
    err = assert_invalid(
        rows({"messages": HI}, {"messages": HI}, {"messages": HI}, row), "requests[3].messages", ""
    )
    assert err.message == "requests[3].messages must be a non-empty array"  # docs/api/native.md


@pytest.mark.parametrize("message", ["hi", None, 5, [], ["user", "hi"]])
def test_message_must_be_an_object(message: object) -> None:
    payload = rows({"messages": HI}, {"messages": [HI[0], message]})
    assert_invalid(payload, "requests[1].messages[1]", "must be an object")


@pytest.mark.parametrize("role", ["robot", "User", "", None, 5, ["user"], {"user": 1}])
def test_message_role_must_be_known(role: object) -> None:
    payload = rows({"messages": [HI[0], {"role": role, "content": "x"}]})
    assert_invalid(
        payload,
        "requests[0].messages[1].role",
        "must be one of system, developer, user, assistant, tool",
    )


def test_a_tool_message_needs_its_tool_call_id() -> None:
    payload = rows({"messages": [HI[0], {"role": "tool", "content": "42"}]})
    assert_invalid(payload, "requests[0].messages[1].tool_call_id", "is required")


def test_message_role_missing() -> None:
    payload = rows({"messages": [{"content": "x"}]})
    assert_invalid(payload, "requests[0].messages[0].role", "must be one of")


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant"])
def test_every_role_is_accepted(role: str) -> None:
    spec = validate_submit(rows({"messages": [{"role": role, "content": "x"}]}), LIMITS, MODELS)
    assert spec.rows[0].request_json == f'[{{"content":"x","role":"{role}"}}]'


@pytest.mark.parametrize("content", [None, 5, 1.5, True, {"type": "text", "text": "hi"}])
def test_message_content_must_be_a_string(content: object) -> None:
    bad = {"messages": [{"role": "user", "content": content}, HI[0]]}
    payload = rows({"messages": HI}, {"messages": HI}, bad)
    assert_invalid(payload, "requests[2].messages[0].content", "must be a string")


def test_message_content_parts_must_be_objects() -> None:
    bad = {"messages": [{"role": "user", "content": ["hi"]}]}
    assert_invalid(rows(bad), "requests[0].messages[0].content[0]", "must be an object")


def test_message_content_missing() -> None:
    assert_invalid(
        rows({"messages": [{"role": "user"}]}), "requests[0].messages[0].content", "is required"
    )


def test_content_limit_counts_utf8_bytes() -> None:
    limits = SubmitLimits(max_content_bytes=8)

    def one_message(content: str) -> dict[str, object]:
        return rows({"messages": [{"role": "user", "content": content}]})

    for fits in ("12345678", "éééé", "😀😀"):  # 8 bytes as 8, 4 and 2 characters
        assert validate_submit(one_message(fits), limits, MODELS).rows
    for too_big in ("123456789", "ééééé", "😀😀x"):
        param = "requests[0].messages[0].content"
        assert_invalid(one_message(too_big), param, "at most 8 bytes", limits)


def test_default_content_limit_is_one_mebibyte() -> None:
    mib = 1024 * 1024
    for fits in ("a" * mib, "😀" * (mib // 4)):
        payload = rows({"messages": [{"role": "user", "content": fits}]})
        assert validate_submit(payload, LIMITS, MODELS).rows
    for too_big in ("a" * (mib + 1), "😀" * (mib // 4) + "a", "é" * (mib // 2 + 1)):
        payload = rows({"messages": [HI[0], {"role": "user", "content": too_big}]})
        assert_invalid(payload, "requests[0].messages[1].content", f"at most {mib} bytes")


def test_content_with_lone_surrogate_is_a_400() -> None:
    # orjson never decodes one, but a payload built another way might carry it.
    payload = rows({"messages": [HI[0], {"role": "user", "content": "bad \ud800"}]})
    assert_invalid(payload, "requests[0].messages[1].content", "valid Unicode")


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        pytest.param(
            rows({"custom_id": "a\udc00", "messages": HI}), "requests[0].custom_id", id="fast-id"
        ),
        pytest.param(
            rows({"custom_id": "\ud800", "messages": HI, "seed": 1}),
            "requests[0].custom_id",
            id="model-id",
        ),
        pytest.param(body(name="job \ud800"), "name", id="name"),
        pytest.param(body(metadata={"a": "\ud800"}), "metadata.a", id="metadata-value"),
        pytest.param(body(metadata={"\udc00": "v"}), "metadata", id="metadata-key"),
    ],
)
def test_a_lone_surrogate_the_ledger_cannot_store_is_a_400(
    payload: dict[str, object], param: str
) -> None:
    err = assert_invalid(payload, param, "must be valid Unicode text")
    keys = " keys" if param == "metadata" else ""
    assert err.message == f"{param}{keys} must be valid Unicode text"


def test_first_bad_message_is_reported() -> None:
    payload = rows(
        {"messages": HI},
        {"messages": [HI[0], {"role": "robot", "content": 1}, {"content": None}]},
    )
    assert_invalid(payload, "requests[1].messages[1].role", "must be one of")


# --- request_json -------------------------------------------------------------------


def test_request_json_is_compact_with_only_role_and_content() -> None:
    messages = [
        {"role": "system", "content": "Be terse."},
        {"content": 'Say "hi"\nplease — ünïcødé 😀', "role": "user"},
        {"role": "assistant", "content": "", "tool_calls": None},  # null: absent
    ]
    spec = validate_submit(rows({"messages": messages}), LIMITS, MODELS)
    text = spec.rows[0].request_json
    assert text == (
        '[{"content":"Be terse.","role":"system"},'
        '{"content":"Say \\"hi\\"\\nplease — ünïcødé 😀","role":"user"},'
        '{"content":"","role":"assistant"}]'
    )
    assert orjson.loads(text) == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": 'Say "hi"\nplease — ünïcødé 😀'},
        {"role": "assistant", "content": ""},
    ]


def test_an_unknown_message_key_is_a_400_never_dropped() -> None:
    bad = {"messages": [{"role": "system", "content": "Be terse.", "extra": {"a": [1]}}]}
    assert_invalid(
        rows(bad),
        "requests[0].messages[0].extra",
        "is not a field of a system message (fields: content, name, role)",
    )


def test_request_json_does_not_depend_on_key_order() -> None:
    variants = [{"role": "user", "content": "hi"}, {"content": "hi", "role": "user"}]
    spec = validate_submit(rows(*({"messages": [m]} for m in variants)), LIMITS, MODELS)
    assert {row.request_json for row in spec.rows} == {HI_JSON}


def test_a_known_message_key_is_kept_in_the_object_form() -> None:
    spec = validate_submit(
        rows({"messages": [{"name": "n", "content": "hi", "role": "user"}]}), LIMITS, MODELS
    )
    assert spec.rows[0].request_json == '{"messages":[{"content":"hi","name":"n","role":"user"}]}'


def test_input_messages_are_not_modified() -> None:
    message = {"role": "user", "content": "hi", "name": "n"}
    validate_submit(rows({"messages": [message]}), LIMITS, MODELS)
    assert message == {"role": "user", "content": "hi", "name": "n"}


# --- custom_id -----------------------------------------------------------------------


def test_custom_ids_default_by_one_based_position() -> None:
    spec = validate_submit(
        rows({"messages": HI}, {"custom_id": "mine", "messages": HI}, {"messages": HI}),
        LIMITS,
        MODELS,
    )
    assert [row.custom_id for row in spec.rows] == ["row-1", "mine", "row-3"]


@pytest.mark.parametrize("custom_id", [7, 1.5, True, ["a"], {"id": "a"}])
def test_custom_id_must_be_a_string(custom_id: object) -> None:
    payload = rows({"messages": HI}, {"custom_id": custom_id, "messages": HI})
    assert_invalid(payload, "requests[1].custom_id", "must be a string")


def test_default_custom_id_colliding_with_an_earlier_explicit_one() -> None:
    payload = rows({"messages": HI}, {"custom_id": "row-1", "messages": HI})
    err = assert_invalid(payload, "requests[1].custom_id", "'row-1'")
    assert err.message == "requests[1].custom_id 'row-1' duplicates requests[0].custom_id"


def test_an_explicit_id_may_take_its_own_rows_default() -> None:
    payload = rows(
        {"custom_id": "row-1", "messages": HI},
        {"messages": HI},
        {"custom_id": "row-9", "messages": HI},
    )
    spec = validate_submit(payload, LIMITS, MODELS)
    assert [row.custom_id for row in spec.rows] == ["row-1", "row-2", "row-9"]


def test_custom_id_length() -> None:
    spec = validate_submit(rows({"custom_id": "x" * 256, "messages": HI}), LIMITS, MODELS)
    assert spec.rows[0].custom_id == "x" * 256
    payload = rows({"custom_id": "x" * 257, "messages": HI})
    assert_invalid(payload, "requests[0].custom_id", "at most 256 characters")


def test_custom_id_without_nul() -> None:
    payload = rows({"messages": HI}, {"custom_id": "a\x00b", "messages": HI})
    assert_invalid(payload, "requests[1].custom_id", "must not contain NUL")


def test_duplicate_custom_id_names_the_later_one() -> None:
    payload = rows(
        {"custom_id": "a", "messages": HI},
        {"custom_id": "b", "messages": HI},
        {"custom_id": "a", "messages": HI},
        {"custom_id": "b", "messages": HI},
    )
    err = assert_invalid(payload, "requests[2].custom_id", "'a'")
    assert "requests[0].custom_id" in err.message


def test_duplicate_after_defaulting() -> None:
    payload = rows({"custom_id": "row-2", "messages": HI}, {"messages": HI})
    assert_invalid(payload, "requests[1].custom_id", "'row-2'")


# --- name ----------------------------------------------------------------------------


def test_name() -> None:
    assert validate_submit(body(name="October"), LIMITS, MODELS).options.name == "October"
    assert validate_submit(body(name="n" * 256), LIMITS, MODELS).options.name == "n" * 256
    assert_invalid(body(name="n" * 257), "name", "at most 256 characters")


def test_name_without_nul() -> None:
    assert_invalid(body(name="Oct\x00ober"), "name", "must not contain NUL")


@pytest.mark.parametrize("name", [5, True, ["a"], {"a": 1}])
def test_name_must_be_a_string(name: object) -> None:
    assert_invalid(body(name=name), "name", "must be a string")


# --- priority ------------------------------------------------------------------------


@pytest.mark.parametrize("priority", [0, 5, -5, 100, 1000, -1000])
def test_priority_accepted(priority: int) -> None:
    assert validate_submit(body(priority=priority), LIMITS, MODELS).options.priority == priority


@pytest.mark.parametrize("priority", ["5", 5.5, 5.0, True, False, [5], {"p": 5}])
def test_priority_must_be_an_integer(priority: object) -> None:
    assert_invalid(body(priority=priority), "priority", "must be an integer")


def test_priority_5_point_0_from_json_is_rejected() -> None:
    payload = decode_json_object(orjson.dumps(body()).replace(b"{", b'{"priority":5.0,', 1))
    assert payload["priority"] == 5.0
    assert_invalid(payload, "priority", "must be an integer")


@pytest.mark.parametrize("raw", [b"18446744073709551616", b"-9223372036854775809"])
def test_priority_beyond_int64_in_json_is_not_an_integer(raw: bytes) -> None:
    # orjson reads an integer beyond 64 bits as a float.
    payload = decode_json_object(orjson.dumps(body())[:-1] + b',"priority":' + raw + b"}")
    assert_invalid(payload, "priority", "must be an integer")


@pytest.mark.parametrize("priority", [1001, -1001, 2**31, -(2**31) - 1, 2**64])
def test_priority_range(priority: int) -> None:
    assert_invalid(body(priority=priority), "priority", "between -1000 and 1000")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("5", 5), ("-5", -5), ("+7", 7), (" 12\n", 12), ("0", 0), ("1000", 1000), ("-1000", -1000)],
)
def test_parse_priority_field(text: str, expected: int) -> None:
    assert parse_priority_field(text) == expected


@pytest.mark.parametrize("text", ["", " ", "5.0", "5.5", "1_000", "abc", "0x10", "٣", "--5", "5 5"])
def test_parse_priority_field_rejects_non_integers(text: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_priority_field(text)
    assert (info.value.status, info.value.param) == (400, "priority")
    assert info.value.message == "priority must be an integer"


@pytest.mark.parametrize("text", ["1001", "-1001", "2147483648", "-2147483649", "9" * 5000])
def test_parse_priority_field_range(text: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_priority_field(text)
    assert (info.value.status, info.value.param) == (400, "priority")
    assert "between" in info.value.message


# --- cron ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "stored"),
    [
        ("*/5 * * * *", "*/5 * * * *"),
        ("0 9 * * MON-FRI", "0 9 * * MON-FRI"),
        ("  0\t0  1 * *\n", "0 0 1 * *"),
        ("0 0 29 2 *", "0 0 29 2 *"),
    ],
)
def test_cron_accepted_and_normalized(expr: str, stored: str) -> None:
    assert validate_submit(body(cron=expr), LIMITS, MODELS).options.cron == stored
    assert validate_cron(expr) == stored


@pytest.mark.parametrize("expr", ["0 0 * * * *", "* * * *", "@daily", "", "   ", "0 0 1 1 * 2030"])
def test_cron_needs_exactly_five_fields(expr: str) -> None:
    assert_invalid(body(cron=expr), "cron", "exactly 5 fields")


@pytest.mark.parametrize(
    "expr",
    [
        "60 * * * *",
        "0 24 * * *",
        "* * * * funday",
        "a b c d e",
        "*/0 * * * *",
        "R * * * *",
        "H * * * *",
        "٣ * * * *",
    ],
)
def test_cron_invalid_field(expr: str) -> None:
    assert_invalid(body(cron=expr), "cron", "is not valid")


def test_cron_that_never_fires() -> None:
    assert_invalid(body(cron="0 0 30 2 *"), "cron", "never fires")


@pytest.mark.parametrize("expr", [5, True, ["* * * * *"], {"cron": "* * * * *"}])
def test_cron_must_be_a_string(expr: object) -> None:
    assert_invalid(body(cron=expr), "cron", "must be a string")


def test_cron_length_is_bounded() -> None:
    assert_invalid(body(cron=",".join(["1"] * 200) + " * * * *"), "cron", "at most 256")


def test_validate_cron_alone_raises_with_param_cron() -> None:
    with pytest.raises(ApiError) as info:
        validate_cron("* * * * * *")
    assert (info.value.status, info.value.param) == (400, "cron")


# --- webhookUrl ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://my-app/relay-webhook",
        "http://localhost:8080/hook?x=1#f",
        "HTTPS://Example.COM",
        "https://[::1]:9000/h",
        "https://user:pw@hooks.example.com/x",
        "http://127.0.0.1:8080/hook",
    ],
)
def test_webhook_url_accepted(url: str) -> None:
    assert validate_submit(body(webhookUrl=url), LIMITS, MODELS).options.webhook_url == url


@pytest.mark.parametrize(
    "url",
    [
        "",
        "ftp://example.com/x",
        "javascript:alert(1)",
        "mailto:ops@example.com",
        "/relative/hook",
        "my-app/hook",
        "//my-app/hook",
        "https://",
        "http:///path",
        "http://:80/x",
        "https://exa mple.com/",
        "https://example.com/\n",
        " https://example.com/",
        "https://example.com/\x00",
        "http://[::1/x",
        "http://example.com:99999/",
        "http://example.com:port/",
    ],
)
def test_webhook_url_rejected(url: str) -> None:
    assert_invalid(body(webhookUrl=url), "webhookUrl", "absolute http or https URL")


@pytest.mark.parametrize("url", [5, True, ["https://x.io"], {"url": "https://x.io"}])
def test_webhook_url_must_be_a_string(url: object) -> None:
    assert_invalid(body(webhookUrl=url), "webhookUrl", "must be a string")


def test_webhook_url_length() -> None:
    base = "https://example.com/"
    ok = base + "a" * (2048 - len(base))
    assert validate_submit(body(webhookUrl=ok), LIMITS, MODELS).options.webhook_url == ok
    assert_invalid(body(webhookUrl=ok + "a"), "webhookUrl", "at most 2048 characters")


# --- row errors as data --------------------------------------------------------------


@pytest.mark.parametrize(
    ("requests", "error"),
    [
        pytest.param(["x"], RowError(0, "", "must be an object"), id="row"),
        pytest.param(
            [{"messages": HI}, {"messages": [HI[0], {"role": "bot", "content": "x"}]}],
            RowError(
                1, "messages[1].role", "must be one of system, developer, user, assistant, tool"
            ),
            id="message-field",
        ),
        pytest.param(
            [
                {"custom_id": "a", "messages": HI},
                {"messages": HI},
                {"custom_id": "a", "messages": HI},
            ],
            RowError(2, "custom_id", "'a' duplicates", earlier=0),
            id="duplicate",
        ),
        pytest.param(
            [{"messages": HI}, {"custom_id": "b", "messages": HI, "bogus": 1}],
            RowError(1, "bogus", f"is not a field of a request (fields: {ROW_FIELDS})"),
            id="unknown-key",
        ),
        pytest.param(
            [{"bogus": 1}],
            RowError(0, "bogus", f"is not a field of a request (fields: {ROW_FIELDS})"),
            id="unknown-key-before-missing-messages",
        ),
    ],
)
def test_a_bad_row_is_reported_as_data(requests: list[object], error: RowError) -> None:
    with pytest.raises(RowRejected) as caught:
        request_rows(requests, LIMITS.max_content_bytes)
    assert caught.value.error == error


def test_a_row_error_renders_as_the_path_of_its_field() -> None:
    whole = row_api_error(RowError(4, "", "must be an object"))
    assert (whole.param, whole.message) == ("requests[4]", "requests[4] must be an object")
    duplicate = row_api_error(RowError(2, "custom_id", "'a' duplicates", earlier=0))
    assert duplicate.param == "requests[2].custom_id"
    assert duplicate.message == "requests[2].custom_id 'a' duplicates requests[0].custom_id"


# --- robustness ----------------------------------------------------------------------

ODD_VALUES: list[object] = [None, True, 0, -1, 2**70, 1.5, "", "x", [], [None], {}, {"a": []}]


@pytest.mark.parametrize("value", ODD_VALUES)
@pytest.mark.parametrize(
    "path",
    [
        ("model",),
        ("name",),
        ("priority",),
        ("cron",),
        ("webhookUrl",),
        ("params",),
        ("requests",),
        ("requests", 0),
        ("requests", 0, "messages"),
        ("requests", 0, "messages", 0),
        ("requests", 0, "messages", 0, "role"),
        ("requests", 0, "messages", 0, "content"),
        ("requests", 0, "custom_id"),
    ],
)
def test_odd_values_give_a_spec_or_a_400(path: tuple[str | int, ...], value: object) -> None:
    payload = orjson.loads(orjson.dumps(body()))
    target = payload
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        validate_submit(payload, LIMITS, MODELS)
    except ApiError as err:
        assert err.status == 400
        assert err.param is not None


def test_nul_in_message_content_is_kept_escaped() -> None:
    # Postgres text cannot hold NUL; message content is stored as escaped JSON, so it can.
    spec = validate_submit(
        rows({"messages": [{"role": "user", "content": "a\x00b"}]}), LIMITS, MODELS
    )
    assert "\\u0000" in spec.rows[0].request_json


def test_known_models_is_a_container_of_the_routers_aliases() -> None:
    known = KnownModels(lambda alias: alias == "gpt-4o-mini")
    assert "gpt-4o-mini" in known
    assert "other" not in known
    assert 42 not in known  # never hands a non-string to the router
    assert validate_submit(body(), LIMITS, known).options.model == "gpt-4o-mini"


def test_ingest_api_builds_jobs_in_one_place() -> None:
    from relay_batches.services.ingest_api import submit
    from relay_batches.services.ingest_api.surfaces.native import aliases as models
    from relay_batches.services.ingest_api.surfaces.native import batches as routes
    from relay_batches.services.ingest_api.surfaces.native import upload

    assert submit.KnownModels is KnownModels
    for handlers in (models, routes, upload):
        assert not hasattr(handlers, "KnownModels")
        assert not hasattr(handlers, "NewJob")


# --- budget_usd ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "stored"), [(1, 1.0), (0.01, 0.01), (1_000_000, 1e6), (2.5, 2.5)]
)
def test_a_budget_is_a_positive_number_of_usd(value: object, stored: float) -> None:
    spec = validate_submit(body(budget_usd=value), LIMITS, MODELS)
    assert spec.options.budget_usd == stored
    assert scan_submit(orjson.dumps(body(budget_usd=value)), LIMITS, MODELS) == spec


def test_no_budget_is_none() -> None:
    assert validate_submit(body(), LIMITS, MODELS).options.budget_usd is None
    assert validate_submit(body(budget_usd=None), LIMITS, MODELS).options.budget_usd is None


@pytest.mark.parametrize("value", ["5", True, False, [1], {"usd": 1}])
def test_a_budget_that_is_not_a_number_is_a_400(value: object) -> None:
    err = assert_invalid(body(budget_usd=value), "budget_usd", "must be a number")
    assert err.message == "budget_usd must be a number (USD)"


@pytest.mark.parametrize("value", [0, 0.0, -0.0, -1, 1_000_000.001, 10**30, 1e300])
def test_a_budget_out_of_range_is_a_400(value: object) -> None:
    err = assert_invalid(body(budget_usd=value), "budget_usd", "greater than 0")
    assert err.message == "budget_usd must be greater than 0 and at most 1,000,000 (USD)"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_budget_that_is_not_finite_is_a_400(value: float) -> None:
    # not JSON text (orjson writes them as null), so checked on the decoded value only
    with pytest.raises(ApiError) as info:
        validate_budget(value)
    assert (info.value.status, info.value.param) == (400, "budget_usd")


@pytest.mark.parametrize(("text", "value"), [("2.5", 2.5), (" 10 ", 10.0), ("1e3", 1000.0)])
def test_a_budget_form_field_is_a_decimal_number(text: str, value: float) -> None:
    assert parse_budget_field(text) == value


@pytest.mark.parametrize(
    "text", ["abc", "true", "NaN", "Infinity", "1_000", '"5"', "0", "-2", "1000001", "9" * 100]
)
def test_a_bad_budget_form_field_is_a_400_naming_it(text: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_budget_field(text)
    assert (info.value.status, info.value.param) == (400, "budget_usd")
    assert info.value.message.startswith("budget_usd must be"), info.value.message


@pytest.mark.parametrize("window", [7, 1024 * 1024])
def test_a_json_body_row_over_the_row_limit_is_refused_naming_it(window: int) -> None:
    limits = SubmitLimits(max_row_bytes=100)
    small = {"messages": [{"role": "user", "content": "hi"}]}
    large = {"messages": [{"role": "user", "content": "é" * 55}]}  # 98 characters, 153 bytes
    raw = orjson.dumps({"model": "gpt-4o-mini", "requests": [small, large, small]})
    with pytest.raises(ApiError) as caught:
        scan_submit(raw, limits, MODELS, window=window)
    assert (caught.value.status, caught.value.param) == (400, "requests[1]")
    assert caught.value.message == "requests[1] is larger than 100 bytes"
    fits = {"messages": [{"role": "user", "content": "e" * 57}]}  # 100 bytes
    raw = orjson.dumps({"model": "gpt-4o-mini", "requests": [small, fits]})
    assert len(scan_submit(raw, limits, MODELS, window=window).rows) == 2
