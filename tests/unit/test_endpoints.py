"""Endpoints beyond chat, unit by unit: each body's model, the stored row and its
round trip on the bus, the OpenAI wire of a body, Responses translated to Messages, and
the simulator's embedding vectors."""

from __future__ import annotations

import math

import orjson
import pytest

from relay_batches.dialects.anthropic.responses import ResponsesWire, chat_of
from relay_batches.dialects.endpoints import (
    COMPLETIONS,
    EMBEDDINGS,
    MODERATIONS,
    RESPONSES,
    answer_endpoint,
    body_reply,
    check_body,
    stored_body,
)
from relay_batches.dialects.openai.endpoints import BodyWire
from relay_batches.messages import RowRequest, request_json, row_request
from relay_batches.router.aliases import Deployment
from relay_batches.router.types import UnsupportedRequest
from relay_batches.services.upstream_sim.openai_endpoints import vector

KNOWN = {"text-embedding-3-small"}
DEPLOYMENT = Deployment(
    name="d",
    provider="openai",
    base_url="http://up.test/v1",
    model="upstream-embed",
    api_key="k",
    params={"user": "relay"},
)


@pytest.mark.parametrize(
    ("endpoint", "body", "error"),
    [
        (EMBEDDINGS, {"input": "x"}, None),
        (EMBEDDINGS, {"input": ["a", "b"], "dimensions": 8, "encoding_format": "base64"}, None),
        (EMBEDDINGS, {"input": [[1, 2], [3]]}, None),
        (EMBEDDINGS, {}, ("input", "is required")),
        (EMBEDDINGS, {"input": "x", "dimensions": 0}, ("dimensions", "must be an integer")),
        (EMBEDDINGS, {"input": "x", "encoding_format": "hex"}, ("encoding_format", "must be")),
        (EMBEDDINGS, {"input": "x", "messages": []}, ("messages", "is not a field of an")),
        (EMBEDDINGS, {"input": "x", "model": "nope"}, ("model", "'nope' is unknown")),
        (COMPLETIONS, {"prompt": "x", "max_tokens": 5, "logit_bias": {"1": -100}}, None),
        (COMPLETIONS, {"prompt": "x", "stream": True}, ("stream", "must be False")),
        (MODERATIONS, {"input": [{"type": "text", "text": "x"}]}, None),
        (RESPONSES, {"input": [{"role": "user", "content": "x"}], "text": {"format": {}}}, None),
        (RESPONSES, {"input": "x", "temperature": 3}, ("temperature", "must be a number from")),
    ],
)
def test_each_body_is_checked_by_its_model(
    endpoint: str, body: dict[str, object], error: tuple[str, str] | None
) -> None:
    problem = check_body(endpoint, body, KNOWN)
    if error is None:
        assert problem is None
    else:
        assert problem is not None
        assert problem[0] == error[0] and problem[1].startswith(error[1]), problem


def test_a_native_row_may_carry_a_custom_id_and_a_body_may_not() -> None:
    assert check_body(EMBEDDINGS, {"custom_id": "a", "input": "x"}, KNOWN, row=True) is None
    assert check_body(EMBEDDINGS, {"custom_id": "a", "input": "x"}, KNOWN) == (
        "custom_id",
        "is not a field of an embeddings request"
        " (fields: dimensions, encoding_format, input, model, user)",
    )


def test_the_stored_row_carries_its_endpoint_and_round_trips_on_the_bus() -> None:
    stored = stored_body(EMBEDDINGS, {"custom_id": "a", "input": "x", "user": None, "model": "m"})
    assert stored == '{"endpoint":"/v1/embeddings","input":"x","model":"m"}'
    request = row_request(orjson.loads(stored))
    assert request == RowRequest([], "m", {"input": "x"}, EMBEDDINGS)
    assert row_request(orjson.loads(request_json(request))) == request
    chat = row_request([{"role": "user", "content": "hi"}])
    assert chat.endpoint is None


def test_a_body_is_sent_whole_with_the_deployments_model() -> None:
    url, headers, body = BodyWire(EMBEDDINGS).build_request(
        DEPLOYMENT, (), {"input": "x", "model": "alias", "dimensions": 8}
    )
    assert url == "http://up.test/v1/embeddings"
    assert headers["Authorization"] == "Bearer k"
    assert orjson.loads(body) == {
        "user": "relay",
        "input": "x",
        "model": "upstream-embed",
        "dimensions": 8,
    }
    assert BodyWire(COMPLETIONS).token_cap(DEPLOYMENT, {"max_tokens": 7}) == 7
    assert BodyWire(EMBEDDINGS).token_cap(DEPLOYMENT, {}) == 0
    assert BodyWire(EMBEDDINGS).estimate({"input": ["abcd", "efgh"]}, 0) == 2


def test_a_reply_is_the_rows_answer_with_its_usage() -> None:
    raw = b'{"object":"list","data":[],"model":"m","usage":{"prompt_tokens":3,"total_tokens":3}}'
    completion = body_reply(EMBEDDINGS, raw).completion
    assert completion is not None
    assert (completion.content, completion.prompt_tokens, completion.model) == (
        raw.decode(),
        3,
        "m",
    )
    assert body_reply(EMBEDDINGS, b"[1]").error == "malformed response from upstream"
    usage = b'{"object":"response","usage":{"input_tokens":4,"output_tokens":5}}'
    answered = body_reply(RESPONSES, usage).completion
    assert answered is not None and (answered.prompt_tokens, answered.completion_tokens) == (4, 5)


def test_an_answer_tells_its_endpoint() -> None:
    assert answer_endpoint({"object": "list"}) == EMBEDDINGS
    assert answer_endpoint({"object": "text_completion"}) == COMPLETIONS
    assert answer_endpoint({"object": "response"}) == RESPONSES
    assert answer_endpoint({"id": "modr-1", "results": []}) == MODERATIONS
    assert answer_endpoint({"object": "chat.completion"}) == "/v1/chat/completions"


def test_responses_translate_to_chat_where_they_fit() -> None:
    messages, params = chat_of(
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "a"}]},
                {"type": "message", "role": "assistant", "content": "b"},
            ],
            "instructions": "be brief",
            "max_output_tokens": 9,
            "store": False,
            "metadata": {"k": "v"},
        }
    )
    assert messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
    ]
    assert params == {"max_tokens": 9}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "x", "reasoning": {"effort": "low"}}, "reasoning"),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "content[0]"),
    ],
)
def test_what_does_not_fit_is_refused_by_name(body: dict[str, object], named: str) -> None:
    with pytest.raises(
        UnsupportedRequest, match=r"cannot translate .*" + named.replace("[", r"\[")
    ):
        ResponsesWire().build_request(DEPLOYMENT, (), body)


def test_simulated_vectors_are_deterministic_unit_vectors() -> None:
    first, again, other = vector("a", 1536), vector("a", 1536), vector("b", 1536)
    assert first == again and first != other and len(first) == 1536
    assert math.sqrt(sum(v * v for v in first)) == pytest.approx(1.0, abs=1e-6)
    assert len(vector("a", 3)) == 3
