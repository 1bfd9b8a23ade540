"""Every chat-completions parameter in a row (issue 28, item 1): accepted on every
surface that takes chat rows and stored as it came, refused with its path when out of
OpenAI's bounds, sent as it came to an OpenAI-speaking deployment, refused by name by
the Anthropic translation, and ``n`` choices kept whole for the OpenAI output line."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.chat import ChatCompletion

from relay_batches.dialects.anthropic import upstream as anthropic
from relay_batches.dialects.chat import RequestRow, check_row
from relay_batches.dialects.chat_params import (
    REASONING_EFFORTS,
    SERVICE_TIERS,
    VERBOSITIES,
    Params,
)
from relay_batches.dialects.openai import upstream as openai
from relay_batches.dialects.openai.render import OUTPUT, render_page
from relay_batches.model import JobStatus
from relay_batches.router.aliases import Deployment
from relay_batches.router.types import UnsupportedRequest
from relay_batches.services.ingest_api.rows.params import validate_params
from relay_batches.services.ingest_api.rows.row_formats import openai_line_row
from tests.helpers.chat_params import SAMPLES
from tests.helpers.fakes import answered_row
from tests.helpers.rows import HI, LIMITS, MODELS
from tests.unit.test_anthropic_render import job as anthropic_render_job
from tests.unit.test_row_formats import line

GPT = Deployment("gpt", "openai", "http://up/v1", "gpt-x")
CLAUDE = Deployment("claude-main", "anthropic", "http://up/v1", "claude-x")


@pytest.mark.parametrize("key", sorted(SAMPLES))
def test_every_parameter_is_accepted_on_every_surface_and_stored_as_it_came(key: str) -> None:
    value = SAMPLES[key]
    assert check_row(RequestRow, {"messages": [HI], key: value}, 1000, MODELS) is None
    assert orjson.loads(validate_params({key: value})) == {key: value}
    row = openai_line_row(0, line(**{key: value}), LIMITS, MODELS)
    assert orjson.loads(row.request_json)[key] == value


@pytest.mark.parametrize(
    ("fields", "path", "message"),
    [
        ({"logit_bias": {"1": 101}}, "logit_bias.1", "must be an integer from -100 to 100"),
        ({"logit_bias": {"x": 1}}, "logit_bias", "keys must be token ids (decimal digits)"),
        ({"top_logprobs": 21}, "top_logprobs", "must be an integer from 0 to 20"),
        ({"presence_penalty": 2.5}, "presence_penalty", "must be a number from -2 to 2"),
        ({"frequency_penalty": "1"}, "frequency_penalty", "must be a number"),
        ({"n": 129}, "n", "must be an integer from 1 to 128"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "at most 16"),
        ({"metadata": {"k": 1}}, "metadata.k", "must be a string"),
        ({"modalities": ["video"]}, "modalities[0]", "must be 'text' or 'audio'"),
        ({"audio": {"voice": "alloy"}}, "audio.format", "is required"),
        ({"reasoning_effort": "huge"}, "reasoning_effort", "must be 'none'"),
        ({"service_tier": "gold"}, "service_tier", "must be 'auto'"),
        ({"verbosity": 1}, "verbosity", "must be 'low', 'medium' or 'high'"),
        ({"store": "yes"}, "store", "must be a boolean"),
        (
            {"web_search_options": {"user_location": {"type": "exact"}}},
            "web_search_options.user_location.type",
            "must be 'approximate'",
        ),
        ({"prediction": {"type": "content"}}, "prediction.content", "is required"),
        ({"stream": True}, "stream", "must be false: batch rows are not streamed"),
        (
            {"stream_options": {"include_usage": True}},
            "stream_options",
            "is only for streamed replies: batch rows are not streamed",
        ),
        ({"best_of": 2}, "best_of", "is not a field of a request (fields: audio,"),
    ],
)
def test_out_of_bounds_values_are_refused_naming_their_path(
    fields: dict[str, Any], path: str, message: str
) -> None:
    problem = check_row(RequestRow, {"messages": [HI], **fields}, 1000, MODELS)
    assert problem is not None
    assert problem[0] == path
    assert message in problem[1]


def test_an_openai_deployment_gets_every_parameter_as_it_came() -> None:
    _, _, body = openai.build_request(GPT, [HI], SAMPLES)
    sent = orjson.loads(body)
    assert {k: sent[k] for k in SAMPLES} == SAMPLES
    assert (sent["model"], sent["messages"]) == ("gpt-x", [HI])


@pytest.mark.parametrize(
    "key",
    [
        "logit_bias",
        "n",
        "logprobs",
        "top_logprobs",
        "audio",
        "modalities",
        "prediction",
        "reasoning_effort",
        "verbosity",
        "web_search_options",
        "metadata",
        "seed",
        "presence_penalty",
        "service_tier",
        "prompt_cache_key",
        "moderation",
        "functions",
        "store",
    ],
)
def test_the_anthropic_translation_refuses_what_it_cannot_take_by_name(key: str) -> None:
    with pytest.raises(UnsupportedRequest) as refused:
        anthropic.translate_body(CLAUDE, [HI], {key: SAMPLES[key]})
    assert str(refused.value) == f"anthropic deployments cannot take {key}"


def test_the_anthropic_translation_takes_neutral_values_and_a_safety_identifier() -> None:
    neutral = {"n": 1, "logprobs": False, "store": False, "stream": False}
    body = anthropic.translate_body(CLAUDE, [HI], {**neutral, "safety_identifier": "u-1"})
    assert body["metadata"] == {"user_id": "u-1"}
    assert not set(neutral) & set(body)


def reply(choices: int, **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-x",
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": f"answer {i}"},
                "finish_reason": "stop",
                "logprobs": None,
                **choice,
            }
            for i in range(choices)
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8},
    }


def test_every_choice_is_kept_and_the_output_line_is_the_providers_body() -> None:
    three = reply(3)
    completion = openai.parse_reply(orjson.dumps(three)).completion
    assert completion is not None and completion.body is not None
    assert (completion.content, completion.completion_tokens) == ("answer 0", 6)
    job = anthropic_render_job(JobStatus.COMPLETED, total=1, completed=1)
    row = answered_row(0, "r0", content="answer 0", done=True, body=completion.body)
    (rendered,) = render_page(job, OUTPUT, [row]).splitlines()
    body = orjson.loads(rendered)["response"]["body"]
    assert body == three
    parsed = ChatCompletion.model_validate(body)
    assert [c.message.content for c in parsed.choices] == ["answer 0", "answer 1", "answer 2"]


def test_log_probabilities_keep_the_body_and_a_plain_answer_keeps_none() -> None:
    logprobs = {"content": [{"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}]}
    kept = openai.parse_reply(orjson.dumps(reply(1, logprobs=logprobs))).completion
    assert kept is not None and orjson.loads(kept.body or "null")["choices"][0]["logprobs"]
    plain = openai.parse_reply(orjson.dumps(reply(1))).completion
    assert plain is not None and plain.body is None


def test_a_rate_limit_counts_each_choice_at_the_cap() -> None:
    assert openai.token_cap(GPT, {"max_tokens": 100, "n": 3}) == 300
    assert openai.token_cap(GPT, {"max_tokens": 100}) == 100


def test_the_fast_checks_enums_are_the_models() -> None:
    properties = Params.model_json_schema()["properties"]
    for key, values in (
        ("reasoning_effort", REASONING_EFFORTS),
        ("service_tier", SERVICE_TIERS),
        ("verbosity", VERBOSITIES),
    ):
        (schema,) = [s for s in properties[key]["anyOf"] if "enum" in s]
        assert tuple(schema["enum"]) == values
