"""The OpenAPI document is valid OpenAPI 3.1 and says what the code says: the limits,
enums and shapes below are read from the code, not restated, so they cannot drift."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import jsonschema_rs
import orjson
import pytest

# The official OpenAPI 3.1 meta-schema, as schemathesis bundles it (schemathesis is pinned).
from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

from relay_batches.errors import ERROR_TYPES, ApiError
from relay_batches.model import Job, JobStatus
from relay_batches.services.ingest_api.app import AUTHENTICATED_PREFIXES
from relay_batches.services.ingest_api.openapi import load_document
from relay_batches.services.ingest_api.rows import job_fields, params, validation
from relay_batches.services.ingest_api.surfaces.anthropic import PREFIX as ANTHROPIC_PREFIX
from relay_batches.services.ingest_api.surfaces.native.batches import DEFAULT_PAGE, MAX_PAGE
from relay_batches.services.ingest_api.surfaces.openai import PREFIX as OPENAI_PREFIX
from tests.helpers import chat_params
from tests.helpers.openapi_ops import component_validator, documented_operations

DOC = load_document()
SCHEMAS = DOC["components"]["schemas"]
DIALECT_PREFIXES = (f"{OPENAI_PREFIX}/", f"{ANTHROPIC_PREFIX}/")
CREATE = SCHEMAS["CreateBatch"]["properties"]
PARAMS = SCHEMAS["Params"]["properties"]
EXAMPLE = DOC["paths"]["/v1/batches"]["post"]["requestBody"]["content"]["application/json"][
    "examples"
]["two-rows"]["value"]


def batch(**fields: Any) -> Job:
    """A batch as the ledger returns it."""
    values: dict[str, Any] = {
        "id": "9f2c1b7e4a8d4e51b0c6d3f2a1e5c7b9",
        "workspace_id": "0" * 32,
        "name": "October",
        "model": "gpt-4o-mini",
        "priority": 5,
        "status": "running",
        "total": 2,
        "completed": 1,
        "failed": 0,
        "dead_letter": 0,
        "webhook_url": None,
        "cron": None,
        "next_run_at": None,
        "template_id": None,
        "rows_batch_id": "9f2c1b7e4a8d4e51b0c6d3f2a1e5c7b9",
        "params": "{}",
        "error": None,
        "created_at": datetime(2026, 10, 4, 9, 12, 44, tzinfo=UTC),
        "started_at": datetime(2026, 10, 4, 9, 12, 45, tzinfo=UTC),
        "completed_at": None,
        "prompt_tokens": 12,
        "completion_tokens": 7,
    }
    return Job(**{**values, **fields})


def operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, DOC["paths"][path][method.lower()])
        for method, path in sorted(documented_operations(DOC))
    ]


def test_the_document_is_valid_openapi_3_1() -> None:
    assert DOC["openapi"].startswith("3.1.")
    OPENAPI_31_VALIDATOR.validate(DOC)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_component_schema_is_valid_json_schema_2020_12(name: str) -> None:
    jsonschema_rs.meta.validate(SCHEMAS[name])


def test_v1_operations_need_the_bearer_key_and_service_endpoints_do_not() -> None:
    scheme = DOC["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for method, path, operation in operations():
        if path.startswith(AUTHENTICATED_PREFIXES):
            assert operation["security"] == [{"bearerAuth": []}], (method, path)
            assert "401" in operation["responses"], (method, path)
        else:
            assert operation["security"] == [], (method, path)


def test_error_responses_name_the_type_the_code_sends_for_their_status() -> None:
    for method, path, operation in operations():
        for code, response in operation["responses"].items():
            if int(code) < 400 or path in ("/readyz",) or path.startswith(DIALECT_PREFIXES):
                continue  # the dialects' error objects: their own tests
            name = response["$ref"].rsplit("/", 1)[-1]
            body = DOC["components"]["responses"][name]["content"]["application/json"]
            schema = SCHEMAS[body["schema"]["$ref"].rsplit("/", 1)[-1]]
            documented = schema["properties"]["error"]["properties"]["type"]["const"]
            assert documented == ERROR_TYPES.get(int(code), "internal_error"), (method, path, code)


def test_submission_limits_are_the_validation_constants() -> None:
    row = SCHEMAS["RequestRow"]["properties"]
    assert CREATE["name"]["maxLength"] == job_fields.MAX_NAME_CHARS
    assert row["custom_id"]["anyOf"][0]["maxLength"] == validation.MAX_CUSTOM_ID_CHARS
    assert CREATE["webhookUrl"]["maxLength"] == job_fields.MAX_WEBHOOK_URL_CHARS
    assert CREATE["cron"]["maxLength"] == job_fields.MAX_CRON_CHARS
    assert (CREATE["priority"]["minimum"], CREATE["priority"]["maximum"]) == (
        job_fields.PRIORITY_MIN,
        job_fields.PRIORITY_MAX,
    )
    roles = [
        SCHEMAS[m["$ref"].rsplit("/", 1)[-1]]["properties"]["role"]["const"]
        for m in SCHEMAS["Message"]["oneOf"]
    ]
    assert tuple(roles) == validation.ROLES


def test_params_limits_are_the_params_constants() -> None:
    # Params is generated from chat_rows.Params; an optional field is ``anyOf [T, null]``.
    def first(name: str) -> dict[str, Any]:
        schema: dict[str, Any] = PARAMS[name]["anyOf"][0]
        return schema

    stop_string, stop_list = PARAMS["stop"]["anyOf"][:2]
    assert first("max_tokens")["maximum"] == params.MAX_TOKENS_LIMIT
    assert first("max_completion_tokens")["maximum"] == params.MAX_TOKENS_LIMIT
    assert (first("seed")["minimum"], first("seed")["maximum"]) == params.SEED_RANGE
    assert stop_string["maxLength"] == params.MAX_STOP_CHARS
    assert stop_list["maxItems"] == params.MAX_STOP_SEQUENCES
    formats = [
        SCHEMAS[m["$ref"].rsplit("/", 1)[-1]]["properties"]["type"]["const"]
        for m in first("response_format")["oneOf"]
    ]
    assert sorted(formats) == sorted(params.RESPONSE_FORMAT_TYPES)


def test_documented_params_are_exactly_the_accepted_ones() -> None:
    samples = chat_params.SAMPLES
    assert set(samples) | chat_params.REFUSED == set(PARAMS) == set(params.PARAM_FIELDS)
    for key, value in samples.items():
        params.validate_params({key: value})
    assert SCHEMAS["Params"]["additionalProperties"] is False


def test_the_upload_form_documents_every_job_level_field_of_the_json_create() -> None:
    form = SCHEMAS["UploadForm"]["properties"]
    assert set(CREATE) - {"requests"} == set(job_fields.JOB_FIELDS)
    assert set(form) - {"file"} == set(job_fields.JOB_FIELDS)
    assert form["params"]["$ref"] == "#/components/schemas/Params"
    encoding = DOC["paths"]["/v1/batches/upload"]["post"]["requestBody"]["content"][
        "multipart/form-data"
    ]["encoding"]
    assert encoding["params"] == {"contentType": "application/json"}


def test_status_enum_and_list_limits_are_the_code_ones() -> None:
    assert SCHEMAS["Status"]["enum"] == [status.value for status in JobStatus]
    limit = DOC["paths"]["/v1/batches"]["get"]["parameters"][0]
    assert limit["name"] == "limit"
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, MAX_PAGE)
    assert limit["schema"]["default"] == DEFAULT_PAGE


def test_the_request_example_is_valid_for_the_schema_and_the_code() -> None:
    component_validator(DOC, "CreateBatch").validate(EXAMPLE)
    validation.validate_submit(EXAMPLE, validation.SubmitLimits(), {EXAMPLE["model"]})


@pytest.mark.parametrize(
    "payload",
    [
        {"model": "m", "requests": []},
        {"model": "m", "requests": [{"messages": [{"role": "robot", "content": "x"}]}]},
        {"model": "m", "requests": [{"messages": [{"role": "user"}]}], "priority": 1.5},
        {"model": "m", "requests": [{"messages": []}]},
        {"requests": [{"messages": [{"role": "user", "content": "x"}]}]},
        {**EXAMPLE, "name": "n" * 257},
        {**EXAMPLE, "params": {"temperature": 3}},
        {**EXAMPLE, "params": {"bogus": 1}},
        {**EXAMPLE, "params": {"response_format": {"type": "json_schema"}}},
        {**EXAMPLE, "webhookUrl": "ftp://example.test/hook"},
    ],
)
def test_the_schema_refuses_what_the_code_refuses(payload: dict[str, Any]) -> None:
    assert not component_validator(DOC, "CreateBatch").is_valid(payload)
    with pytest.raises(ApiError):
        validation.validate_submit(payload, validation.SubmitLimits(), {"m", "gpt-4o-mini"})


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"params": orjson.dumps(EXAMPLE["params"]).decode()},
        {"status": "scheduled", "cron": "0 9 * * 1", "next_run_at": datetime.now(UTC)},
        {"status": "completed", "completed_at": datetime.now(UTC), "template_id": "a" * 32},
        {"status": "failed", "error": "alias no longer resolves", "priority": -(2**31)},
    ],
)
def test_the_batch_object_matches_the_batch_schema(fields: dict[str, Any]) -> None:
    shown = batch(**fields).to_api()

    component_validator(DOC, "Batch").validate(shown)
    assert set(SCHEMAS["Batch"]["required"]) == set(shown) == set(SCHEMAS["Batch"]["properties"])
