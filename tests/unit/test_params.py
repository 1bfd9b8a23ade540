"""Job-level ``params`` validation."""

from __future__ import annotations

import orjson
import pytest

from relay_batches.errors import ApiError
from relay_batches.services.ingest_api.rows.params import validate_params


def test_absent_params_are_an_empty_object() -> None:
    assert validate_params(None) == "{}"


def test_null_params_are_left_out() -> None:
    assert validate_params({"temperature": None, "seed": 3}) == '{"seed":3}'


def test_every_supported_param_is_kept() -> None:
    params = {
        "temperature": 0.5,
        "max_tokens": 64,
        "top_p": 1,
        "stop": ["\n", "END"],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        "seed": 42,
    }
    assert orjson.loads(validate_params(params)) == params


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ([], "params"),
        ({"temperature": 2.5}, "params.temperature"),
        ({"temperature": "0.5"}, "params.temperature"),
        ({"temperature": True}, "params.temperature"),
        ({"top_p": -0.1}, "params.top_p"),
        ({"max_tokens": 0}, "params.max_tokens"),
        ({"max_tokens": 1.5}, "params.max_tokens"),
        ({"seed": "1"}, "params.seed"),
        ({"stop": ""}, "params.stop"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "params.stop"),
        ({"stop": [1]}, "params.stop[0]"),
        ({"response_format": {"type": "xml"}}, "params.response_format.type"),
        ({"response_format": "json"}, "params.response_format.type"),
        ({"response_format": {"type": {}}}, "params.response_format.type"),
        ({"response_format": {"type": ["text"]}}, "params.response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "params.response_format.json_schema"),
        (
            {"response_format": {"type": "text", "json_schema": [None]}},
            "params.response_format.json_schema",
        ),
        ({"temprature": 0.5}, "params.temprature"),
        ({"tools": [{"type": "retrieval"}]}, "params.tools[0].type"),
        ({"tools": []}, "params.tools"),
        ({"tool_choice": "any"}, "params.tool_choice"),
        ({"max_completion_tokens": 0}, "params.max_completion_tokens"),
        (
            {"response_format": {"type": "json_object", "strict": True}},
            "params.response_format.strict",
        ),
    ],
)
def test_bad_params_are_400_naming_the_field(params: object, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        validate_params(params)
    assert (caught.value.status, caught.value.param) == (400, param)
