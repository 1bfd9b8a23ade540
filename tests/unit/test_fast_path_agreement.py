"""The fast checks (plain messages, scalar parameters, the simple Anthropic translation)
accept exactly what the models accept and store the same bytes: every input here is run
both ways, with the fast checks on and forced off, and the outcomes compared."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from relay_batches.services.ingest_api.rows import row_formats, validation
from relay_batches.services.ingest_api.rows.row_formats import (
    anthropic_request_row,
    openai_line_row,
)
from relay_batches.services.ingest_api.rows.validation import (
    RowInput,
    RowRejected,
    SubmitLimits,
    request_rows,
)

MODELS = frozenset({"gpt-4o-mini"})
LIMITS = SubmitLimits(max_content_bytes=64)
HI = {"role": "user", "content": "hi"}
# Values on both sides of each scalar parameter's rule.
SCALARS: list[dict[str, Any]] = [
    {},
    {"max_tokens": 1},
    {"max_tokens": 1_000_000},
    {"max_tokens": 0},
    {"max_tokens": 1_000_001},
    {"max_tokens": True},
    {"max_tokens": 5.0},
    {"max_tokens": "5"},
    {"max_tokens": None},
    {"max_completion_tokens": 7, "seed": -(2**63)},
    {"seed": 2**63 - 1},
    {"seed": 2**63},
    {"temperature": 0},
    {"temperature": 2},
    {"temperature": 0.7, "top_p": 1},
    {"temperature": 2.0001},
    {"temperature": -0.0},
    {"temperature": -1e-9},
    {"temperature": False},
    {"temperature": float("inf")},
    {"temperature": float("nan")},
    {"top_p": 1.5},
    {"stop": "END"},
    {"stop": ""},
    {"stop": "x" * 256},
    {"stop": "x" * 257},
    {"stop": ["a", "b"]},
    {"stop": "\ud800"},
    {"tool_choice": "auto"},
    {"n": 1},
    {"n": 128, "logprobs": True, "top_logprobs": 20},
    {"n": 0},
    {"n": 129},
    {"n": True},
    {"top_logprobs": -1},
    {"top_logprobs": 21},
    {"logprobs": 1},
    {"store": False, "parallel_tool_calls": True},
    {"store": "false"},
    {"presence_penalty": -2, "frequency_penalty": 2.0},
    {"presence_penalty": 2.5},
    {"frequency_penalty": float("nan")},
    {"frequency_penalty": True},
    {"user": "u-1", "safety_identifier": "s", "prompt_cache_key": ""},
    {"user": 5},
    {"user": "\ud800"},
    {"reasoning_effort": "low", "verbosity": "high", "service_tier": "flex"},
    {"reasoning_effort": "huge"},
    {"verbosity": "LOW"},
    {"service_tier": None},
]
MESSAGES: list[Any] = [
    [HI],
    [{"role": "system", "content": "s"}, HI, {"role": "assistant", "content": "a"}],
    [{"role": "user", "content": "x" * 65}],
    [{"role": "user", "content": "é" * 33}],
    [{"role": "robot", "content": "x"}],
    [{"role": ["user"], "content": "x"}],
    [{"role": "user", "content": 5}],
    [{**HI, "name": "n"}],
    [],
    "hi",
]


def outcome(make: Callable[[], list[RowInput]]) -> object:
    try:
        return make()
    except RowRejected as exc:
        return exc.error


def both_ways(monkeypatch: pytest.MonkeyPatch, make: Callable[[], list[RowInput]]) -> None:
    fast = outcome(make)
    with monkeypatch.context() as forced:
        for module in (validation, row_formats):
            forced.setattr(module, "plain_params", lambda *_: False)
            forced.setattr(module, "plain_messages", lambda *_: False)
        forced.setattr(row_formats, "simple_translation", lambda _: None)
        slow = outcome(make)
    assert fast == slow


@pytest.mark.parametrize("messages", MESSAGES)
@pytest.mark.parametrize("scalars", SCALARS)
def test_native_rows_agree(
    monkeypatch: pytest.MonkeyPatch, scalars: dict[str, Any], messages: Any
) -> None:
    rows = [{"custom_id": "a", "messages": [HI]}, {"messages": messages, **scalars}]
    both_ways(monkeypatch, lambda: request_rows(rows, LIMITS.max_content_bytes, MODELS))


@pytest.mark.parametrize("messages", MESSAGES)
@pytest.mark.parametrize("scalars", SCALARS)
def test_openai_lines_agree(
    monkeypatch: pytest.MonkeyPatch, scalars: dict[str, Any], messages: Any
) -> None:
    body = {"model": "gpt-4o-mini", "messages": messages, **scalars}
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}
    both_ways(monkeypatch, lambda: [openai_line_row(0, line, LIMITS, MODELS)])


ANTHROPIC_EXTRA: list[dict[str, Any]] = [
    {},
    {"system": "Be brief."},
    {"system": ""},
    {"system": None},
    {"system": [{"type": "text", "text": "s"}]},
    {"system": 5},
    {"temperature": 1},
    {"temperature": 1.5},
    {"temperature": 0.5, "top_p": 0.1},
    {"top_p": None},
    {"max_tokens": 0},
    {"max_tokens": True},
    {"model": 5},
    {"model": "no-such-model"},
    {"stop_sequences": ["x"]},
    {"top_k": 5},
    {"messages": [{"role": "system", "content": "x"}]},
    {"messages": [{"role": [], "content": "x"}]},
    {"messages": [HI, {"role": "assistant", "content": "a"}, HI]},
    {"messages": [{"role": "user", "content": "x" * 65}]},
    {"messages": [{"role": "user", "content": "x\ud800"}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]},
    {"messages": [{**HI, "name": "n"}]},
    {"messages": []},
]


@pytest.mark.parametrize("extra", ANTHROPIC_EXTRA)
def test_anthropic_requests_agree(monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]) -> None:
    params = {"model": "gpt-4o-mini", "max_tokens": 10, "messages": [HI], **extra}
    request = {"custom_id": "a", "params": params}
    both_ways(monkeypatch, lambda: [anthropic_request_row(0, request, LIMITS, MODELS)])


def test_the_fast_paths_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("the model path was taken")

    monkeypatch.setattr(validation, "check_row", refuse)
    monkeypatch.setattr(row_formats, "check_row", refuse)
    monkeypatch.setattr(row_formats.AnthropicParams, "model_validate", refuse)
    scalars = {"max_tokens": 5, "temperature": 0.5, "top_p": 1, "seed": 3, "stop": "x"}
    request_rows([{"messages": [HI], **scalars}], LIMITS.max_content_bytes, MODELS)
    body = {"model": "gpt-4o-mini", "messages": [HI], "max_completion_tokens": 9, **scalars}
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}
    openai_line_row(0, line, LIMITS, MODELS)
    params = {"model": "gpt-4o-mini", "max_tokens": 9, "system": "s", "messages": [HI]}
    anthropic_request_row(0, {"custom_id": "a", "params": params}, LIMITS, MODELS)
