"""A mixed-tools batch through the live system, answered by two providers at once: rows
of one job go to an OpenAI-compatible deployment (the job's alias ``gpt-4o-mini``) or to
an Anthropic one (per-row model ``sim-claude``, the simulator's Messages endpoint), with
tools, a tool turn and content parts; both answers of every row are checked: the native
results (content, tool_calls, error) and the ledger's whole outcome (finish reason, the
model that answered, the deployment).

The rows are stored straight into the ledger in the whole-request form the ingest paths
store (sorted-keys ``{"messages": [...], "model": ..., ...fields}``), so this test does
not depend on which ingest path accepts rich rows; the dispatcher's reconcile loop picks
the job up like any submitted one.
"""

from __future__ import annotations

from typing import Any

import orjson

from relay_batches.ids import new_id
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.pool import create_pool
from tests.helpers.processes import System
from tests.helpers.support import ApiClient

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = "Weather in Oslo? [sim:tool-call]"
PIXEL = "data:image/png;base64,iVBORw0KGgo="


def _asking() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Answer with tools."},
        {"role": "user", "content": [{"type": "text", "text": ASK}]},
    ]


def _tool_turn(call_id: str) -> list[dict[str, Any]]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    return [
        *_asking(),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": "snow, -3C"},
    ]


PARTS = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "describe "},
            {"type": "image_url", "image_url": {"url": PIXEL}},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            {"type": "text", "text": "these"},
        ],
    }
]
TOOLS = {"tools": [WEATHER], "tool_choice": "auto"}

# custom_id → the row's request (without "model": the job's alias, gpt-4o-mini)
ROWS: dict[str, dict[str, Any]] = {
    "claude-tools": {"messages": _asking(), "model": "sim-claude", **TOOLS},
    "gpt-tools": {"messages": _asking(), **TOOLS, "parallel_tool_calls": False},
    "claude-tool-turn": {"messages": _tool_turn("toolu_1"), "model": "sim-claude", **TOOLS},
    "gpt-tool-turn": {"messages": _tool_turn("call_1"), **TOOLS},
    "claude-parts": {"messages": PARTS, "model": "sim-claude", "max_completion_tokens": 64},
    "gpt-parts": {"messages": PARTS, "max_completion_tokens": 64, "seed": 7},
    "claude-seed": {"messages": PARTS, "model": "sim-claude", "seed": 7},
}


def _call(prefix: str) -> list[dict[str, Any]]:
    return [
        {
            "id": prefix,
            "type": "function",
            "function": {"name": "get_weather", "arguments": orjson.dumps({"text": ASK}).decode()},
        }
    ]


async def test_a_mixed_tools_batch_is_answered_by_both_providers(
    system: System, api: ApiClient
) -> None:
    pool = await create_pool(system.iso.database_url, max_size=2)
    try:
        workspace = await KeyStore(pool).workspace_for_key(api.key)
        assert workspace is not None
        job = await JobStore(pool).create(
            NewJob(new_id(), workspace, "dialects", "gpt-4o-mini", 0, len(ROWS), None, None, None),
            (
                (custom_id, orjson.dumps(request, option=orjson.OPT_SORT_KEYS).decode())
                for custom_id, request in ROWS.items()
            ),
        )
        batch = await api.wait_status(job.id, {"completed"}, timeout=60)
        results = {row["custom_id"]: row for row in (await api.results(job.id))["data"]}
        finished = await JobStore(pool).get(workspace, job.id)
        assert finished is not None
        answered = {
            row.custom_id: (row.finish_reason, row.model, row.deployment)
            async for page in JobStore(pool).answered_pages(finished)
            for row in page
        }
    finally:
        await pool.close()

    assert (batch["completed"], batch["failed"]) == (6, 1)
    claude_call = results["claude-tools"]["tool_calls"][0]["id"]
    gpt_call = results["gpt-tools"]["tool_calls"][0]["id"]
    assert claude_call.startswith("toolu_") and gpt_call.startswith("call_")
    assert results == {
        "claude-tools": {
            "custom_id": "claude-tools",
            "content": "",
            "tool_calls": _call(claude_call),
        },
        "gpt-tools": {"custom_id": "gpt-tools", "content": "", "tool_calls": _call(gpt_call)},
        "claude-tool-turn": {"custom_id": "claude-tool-turn", "content": "echo: snow, -3C"},
        "gpt-tool-turn": {"custom_id": "gpt-tool-turn", "content": "echo: snow, -3C"},
        "claude-parts": {"custom_id": "claude-parts", "content": "echo: describe these"},
        "gpt-parts": {"custom_id": "gpt-parts", "content": "echo: describe these"},
        "claude-seed": {
            "custom_id": "claude-seed",
            "error": "upstream_error: sim-claude: anthropic deployments cannot take seed",
        },
    }
    assert answered == {
        "claude-tools": ("tool_calls", "sim-claude", "sim-claude"),
        "gpt-tools": ("tool_calls", "sim-echo", "sim"),
        "claude-tool-turn": ("stop", "sim-claude", "sim-claude"),
        "gpt-tool-turn": ("stop", "sim-echo", "sim"),
        "claude-parts": ("stop", "sim-claude", "sim-claude"),
        "gpt-parts": ("stop", "sim-echo", "sim"),
        "claude-seed": (None, None, None),
    }
