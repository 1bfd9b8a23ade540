"""The Anthropic-compatible surface's part of the OpenAPI document: its paths, with the
schemas of :mod:`relay_batches.dialects.anthropic.shapes`."""

from __future__ import annotations

from typing import Any

from relay_batches.dialects.anthropic.models import AnthropicModelInfo, AnthropicModelList
from relay_batches.dialects.anthropic.render import BATCHES_PATH
from relay_batches.dialects.anthropic.shapes import (
    AnthropicCreateBatch,
    AnthropicDeletedMessageBatch,
    AnthropicError,
    AnthropicMessageBatch,
    AnthropicMessageBatchList,
    AnthropicResultLine,
)

TAG = "anthropic"
MODELS_PATH = "/anthropic/v1/models"
_SECURITY: list[dict[str, list[str]]] = [{"bearerAuth": []}]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


def _error(description: str) -> dict[str, Any]:
    return _json(description, "AnthropicError")


_UNAVAILABLE = {
    **_error("The ledger is briefly unreachable or behind this release; retry shortly."),
    "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}},
}
_COMMON = {
    "401": _error("Missing or unknown API key (`x-api-key` or `Authorization: Bearer`)."),
    "503": _UNAVAILABLE,
}
_NOT_FOUND = _error(
    "No such message batch in the caller's workspace (another workspace's gets exactly this)."
)
_BAD = _error("The request is invalid; the message names the field.")
_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "`msgbatch_` and the batch's 32-hex id; anything else is 404.",
    "schema": {"type": "string"},
}
_VERSION = {
    "name": "anthropic-version",
    "in": "header",
    "required": False,
    "description": "Accepted and ignored (as is `anthropic-beta`).",
    "schema": {"type": "string"},
}


def _operation(op_id: str, summary: str, responses: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "operationId": op_id,
        "summary": summary,
        "tags": [TAG],
        "security": _SECURITY,
        **extra,
        "responses": {**responses, **_COMMON},
    }


def _create() -> dict[str, Any]:
    return _operation(
        "anthropicCreateMessageBatch",
        "Create a message batch (Anthropic-compatible)",
        {
            "200": _json("The batch, `in_progress`.", "AnthropicMessageBatch"),
            "400": _BAD,
            "408": _error("The body arrived too slowly."),
            "409": _error("The Idempotency-Key was used with a different request."),
            "413": _error("The body exceeds the configured limit."),
            "415": _error(
                "The body is not `application/json` (or not in an encoding we inflate), or"
                " declares a `charset` other than UTF-8."
            ),
        },
        parameters=[
            _VERSION,
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": "Retry safety: the same key within 24 hours returns the batch"
                " first created and creates nothing new.",
                "schema": {"type": "string"},
            },
        ],
        requestBody={
            "required": True,
            "content": {"application/json": {"schema": _ref("AnthropicCreateBatch")}},
        },
    )


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


def _page_parameters(after: str, before: str) -> list[dict[str, Any]]:
    """The version header and the cursor parameters of a list (Anthropic's paging)."""
    return [
        _VERSION,
        _query("limit", "1 to 1000, default 20.", {"type": "integer"}),
        _query("after_id", after, {"type": "string"}),
        _query("before_id", before, {"type": "string"}),
    ]


def _list() -> dict[str, Any]:
    return _operation(
        "anthropicListMessageBatches",
        "List message batches, newest first (Anthropic-compatible)",
        {"200": _json("A page of batches.", "AnthropicMessageBatchList"), "400": _BAD},
        parameters=_page_parameters(
            "The page of older batches after this one.",
            "The page of newer batches before this one.",
        ),
    )


def _by_id() -> dict[str, Any]:
    return {
        "parameters": [_ID, _VERSION],
        "get": _operation(
            "anthropicGetMessageBatch",
            "Retrieve a message batch (Anthropic-compatible)",
            {"200": _json("The batch.", "AnthropicMessageBatch"), "404": _NOT_FOUND},
        ),
        "delete": _operation(
            "anthropicDeleteMessageBatch",
            "Delete an ended message batch and everything stored for it",
            {
                "200": _json("Deleted.", "AnthropicDeletedMessageBatch"),
                "404": _NOT_FOUND,
                "409": _error("The batch has not ended."),
            },
        ),
    }


def _cancel() -> dict[str, Any]:
    return {
        "parameters": [_ID, _VERSION],
        "post": _operation(
            "anthropicCancelMessageBatch",
            "Cancel a message batch (Anthropic-compatible)",
            {
                "200": _json(
                    "The batch: `ended` with `cancel_initiated_at` (cancel is synchronous);"
                    " an ended batch as it is.",
                    "AnthropicMessageBatch",
                ),
                "404": _NOT_FOUND,
            },
        ),
    }


def _results() -> dict[str, Any]:
    lines = {
        "type": "string",
        "description": "One `AnthropicResultLine` (#/components/schemas/AnthropicResultLine)"
        " per request, in request order, each line ending in a newline.",
    }
    return {
        "parameters": [_ID, _VERSION],
        "get": _operation(
            "anthropicGetMessageBatchResults",
            "The results of an ended message batch, as JSON lines",
            {
                "200": {
                    "description": "The results.",
                    "content": {"application/x-jsonl": {"schema": lines}},
                },
                "404": _NOT_FOUND,
                "409": _error("The batch has not ended yet."),
            },
        ),
    }


def _models() -> dict[str, Any]:
    return {
        "get": _operation(
            "anthropicListModels",
            "List the models: the route aliases, in id order (Anthropic-compatible)",
            {"200": _json("A page of models.", "AnthropicModelList"), "400": _BAD},
            parameters=_page_parameters(
                "The page of ids after this one.", "The page of ids before this one."
            ),
        )
    }


def _model() -> dict[str, Any]:
    model_id = {
        "name": "model_id",
        "in": "path",
        "required": True,
        "description": "An alias, or a name one of its patterns matches (a dated snapshot).",
        "schema": {"type": "string"},
    }
    return {
        "parameters": [model_id, _VERSION],
        "get": _operation(
            "anthropicGetModel",
            "Retrieve a model (Anthropic-compatible)",
            {
                "200": _json("The model.", "AnthropicModelInfo"),
                "404": _error("No such model: neither an alias nor a name its patterns match."),
            },
        ),
    }


def anthropic_fragment() -> dict[str, dict[str, Any]]:
    """The surface's paths and schemas for :data:`.openapi.FRAGMENTS`."""
    # Imported here: openapi.py lists this function among its fragments.
    from relay_batches.services.ingest_api.openapi import model_schemas

    schemas = model_schemas(
        AnthropicMessageBatch,
        AnthropicMessageBatchList,
        AnthropicDeletedMessageBatch,
        AnthropicError,
        AnthropicResultLine,
        AnthropicModelInfo,
        AnthropicModelList,
        mode="serialization",
    )
    schemas.update(model_schemas(AnthropicCreateBatch))
    return {
        "paths": {
            BATCHES_PATH: {"post": _create(), "get": _list()},
            f"{BATCHES_PATH}/{{id}}": _by_id(),
            f"{BATCHES_PATH}/{{id}}/cancel": _cancel(),
            f"{BATCHES_PATH}/{{id}}/results": _results(),
            MODELS_PATH: _models(),
            f"{MODELS_PATH}/{{model_id}}": _model(),
        },
        "schemas": schemas,
    }
