"""One sample value of every chat-completions parameter a row may carry (besides
``messages`` and ``model``), as a real batch file would send it; shared by the model's
unit tests and the e2e file with one line per parameter."""

from __future__ import annotations

from typing import Any

SAMPLES: dict[str, Any] = {
    "audio": {"voice": "alloy", "format": "wav"},
    "frequency_penalty": 0.5,
    "function_call": "auto",
    "functions": [{"name": "lookup", "parameters": {"type": "object", "properties": {}}}],
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "max_completion_tokens": 64,
    "max_tokens": 64,
    "metadata": {"team": "search", "run": "7"},
    "modalities": ["text"],
    "moderation": {"model": "omni-moderation-latest", "policy": {"input": {"mode": "score"}}},
    "n": 3,
    "parallel_tool_calls": False,
    "prediction": {"type": "content", "content": "hello"},
    "presence_penalty": -0.5,
    "prompt_cache_key": "tenant-7",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    "prompt_cache_retention": "24h",
    "reasoning_effort": "low",
    "response_format": {"type": "json_object"},
    "safety_identifier": "user-hash-1",
    "seed": 42,
    "service_tier": "flex",
    "stop": ["\n\n"],
    "store": True,
    "stream": False,
    "temperature": 0.7,
    "tool_choice": "auto",
    "tools": [{"type": "function", "function": {"name": "lookup"}}],
    "top_logprobs": 2,
    "top_p": 0.9,
    "user": "user-1",
    "verbosity": "high",
    "web_search_options": {
        "search_context_size": "low",
        "user_location": {"type": "approximate", "approximate": {"country": "GB"}},
    },
}
# Every parameter a batch row may carry: stream_options is documented but refused.
REFUSED = frozenset({"stream_options"})
