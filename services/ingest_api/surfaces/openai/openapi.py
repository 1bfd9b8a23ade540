"""The OpenAI-compatible surface in the OpenAPI document: its paths, and its schemas
generated from the very models of :mod:`.shapes` (one entry of ``openapi.FRAGMENTS``)."""

from __future__ import annotations

from typing import Any

from relay_batches.dialects.openai.models import OpenAIModel, OpenAIModelList
from relay_batches.dialects.openai.shapes import (
    OpenAIBatch,
    OpenAIBatchList,
    OpenAICreateBatch,
    OpenAIError,
    OpenAIFile,
    OpenAIFileDeleted,
    OpenAIFileList,
    OpenAIUploadForm,
)
from relay_batches.services.ingest_api import webhook_endpoint_shapes as endpoints

TAG = ["openai"]
SECURITY: list[dict[str, list[str]]] = [{"bearerAuth": []}]
_ERRORS = {
    400: "The request is invalid; `param` names the offending field.",
    401: "Missing or unknown API key.",
    404: "No such object in the caller's workspace (another workspace's id included).",
    408: "The body stalled or arrived too slowly.",
    409: "The batch already ended otherwise (cancel), or the Idempotency-Key was reused.",
    413: "The body exceeds the endpoint's limit (a file: 256 MiB).",
    415: "The Content-Type or Content-Encoding is not one this endpoint takes, or a JSON body"
    " declares a `charset` other than UTF-8.",
    503: "The ledger is briefly unavailable, or every large-body slot is busy; retry later.",
}


REF_TEMPLATE = "#/components/schemas/{model}"  # openapi.REF_TEMPLATE (checked by a test)


def _ref(model: type) -> dict[str, str]:
    return {"$ref": REF_TEMPLATE.format(model=model.__name__)}


def _json(model: type, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _error(status: int) -> dict[str, Any]:
    response = _json(OpenAIError, _ERRORS[status])
    if status == 503:
        response["headers"] = {
            "Retry-After": {
                "description": "Seconds to wait before retrying.",
                "schema": {"type": "integer", "minimum": 1},
            }
        }
    return response


def _operation(
    operation_id: str,
    summary: str,
    ok: dict[str, Any],
    errors: tuple[int, ...],
    **extra: Any,
) -> dict[str, Any]:
    responses = {"200": ok, **{str(s): _error(s) for s in (401, 503, *errors)}}
    return {
        "operationId": operation_id,
        "summary": summary,
        "tags": TAG,
        "security": SECURITY,
        **extra,
        "responses": dict(sorted(responses.items())),
    }


def _path_param(name: str, description: str) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "in": "path",
            "required": True,
            "description": description,
            "schema": {"type": "string"},
        }
    ]


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


def _paths() -> dict[str, Any]:
    file_id = _path_param("file_id", "`file-<32 hex>`.")
    batch_id = _path_param("batch_id", "`batch_<32 hex>`.")
    after = {"type": "string"}
    return {
        "/openai/v1/files": {
            "post": _operation(
                "openaiCreateFile",
                "Upload a batch input file (.jsonl, purpose batch, up to 256 MiB)",
                _json(OpenAIFile, "The stored file."),
                (400, 408, 413, 415),
                requestBody={
                    "required": True,
                    "content": {"multipart/form-data": {"schema": _ref(OpenAIUploadForm)}},
                },
            ),
            "get": _operation(
                "openaiListFiles",
                "List files",
                _json(OpenAIFileList, "A page of files."),
                (400,),
                parameters=[
                    _query("limit", "1 to 10,000 (default 10,000).", {"type": "integer"}),
                    _query("after", "The last file id of the previous page.", after),
                    _query(
                        "order",
                        "By creation time (default desc).",
                        {"type": "string", "enum": ["asc", "desc"]},
                    ),
                    _query(
                        "purpose",
                        "Only files of this purpose.",
                        {"type": "string", "enum": ["batch", "batch_output"]},
                    ),
                ],
            ),
        },
        "/openai/v1/files/{file_id}": {
            "parameters": file_id,
            "get": _operation(
                "openaiGetFile", "Retrieve a file", _json(OpenAIFile, "The file."), (404,)
            ),
            "delete": _operation(
                "openaiDeleteFile",
                "Delete a file",
                _json(OpenAIFileDeleted, "The file is deleted."),
                (404,),
            ),
        },
        "/openai/v1/files/{file_id}/content": {
            "parameters": file_id,
            "get": _operation(
                "openaiGetFileContent",
                "The file's content: as uploaded, or an output or error file's JSONL lines",
                {
                    "description": "The content, streamed.",
                    "content": {
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}
                        }
                    },
                },
                (404,),
            ),
        },
        "/openai/v1/batches": {
            "post": _operation(
                "openaiCreateBatch",
                "Create a batch from an uploaded input file",
                _json(OpenAIBatch, "The batch, in progress (or failed: its file's errors)."),
                (400, 404, 408, 409, 413, 415),
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": _ref(OpenAICreateBatch)}},
                },
            ),
            "get": _operation(
                "openaiListBatches",
                "List batches, newest first",
                _json(OpenAIBatchList, "A page of batches."),
                (400,),
                parameters=[
                    _query("limit", "1 to 100 (default 20).", {"type": "integer"}),
                    _query("after", "The last batch id of the previous page.", after),
                ],
            ),
        },
        "/openai/v1/batches/{batch_id}": {
            "parameters": batch_id,
            "get": _operation(
                "openaiGetBatch", "Retrieve a batch", _json(OpenAIBatch, "The batch."), (404,)
            ),
        },
        "/openai/v1/models": {
            "get": _operation(
                "openaiListModels",
                "List the models: the route aliases",
                _json(OpenAIModelList, "Every alias, sorted by id (`owned_by`: `relay`)."),
                (),
            ),
        },
        "/openai/v1/models/{model}": {
            "parameters": _path_param(
                "model", "An alias, or a name one of its patterns matches (a dated snapshot)."
            ),
            "get": _operation(
                "openaiGetModel", "Retrieve a model", _json(OpenAIModel, "The model."), (404,)
            ),
        },
        **_webhook_endpoints(),
        "/openai/v1/batches/{batch_id}/cancel": {
            "parameters": batch_id,
            "post": _operation(
                "openaiCancelBatch",
                "Cancel a batch (again: the cancelled batch)",
                _json(OpenAIBatch, "The batch, cancelled."),
                (404, 409),
            ),
        },
    }


def _webhook_endpoints() -> dict[str, Any]:
    """``/openai/v1/webhook_endpoints``: the native API's, with OpenAI's error object (the
    objects' schemas are the native fragment's: one object, served by both surfaces)."""
    endpoint_id = _path_param("id", "`we_<32 hex>`.")
    created = _json(endpoints.WebhookEndpoint, "Created, with its secret.")
    create = _operation(
        "openaiCreateWebhookEndpoint",
        endpoints.SUMMARIES["create"],
        created,
        (400, 408, 409, 413, 415),
        description=endpoints.CREATE_DESCRIPTION,
        requestBody={
            "required": True,
            "content": {"application/json": {"schema": _ref(endpoints.CreateWebhookEndpoint)}},
        },
    )
    create["responses"] = {"201": create["responses"].pop("200"), **create["responses"]}
    return {
        "/openai/v1/webhook_endpoints": {
            "post": create,
            "get": _operation(
                "openaiListWebhookEndpoints",
                endpoints.SUMMARIES["list"],
                _json(endpoints.WebhookEndpointList, "Every endpoint, oldest first."),
                (),
            ),
        },
        "/openai/v1/webhook_endpoints/{id}": {
            "parameters": endpoint_id,
            "delete": _operation(
                "openaiDeleteWebhookEndpoint",
                endpoints.SUMMARIES["delete"],
                _json(endpoints.WebhookEndpointDeleted, "Deleted."),
                (404,),
            ),
        },
    }


def openai_fragment() -> dict[str, dict[str, Any]]:
    """The surface's paths and schemas for ``openapi.FRAGMENTS``."""
    # Imported here: openapi.py imports this module for its FRAGMENTS.
    from relay_batches.services.ingest_api import openapi

    schemas = openapi.model_schemas(OpenAICreateBatch, OpenAIUploadForm)
    responses = openapi.model_schemas(
        OpenAIFile,
        OpenAIFileList,
        OpenAIFileDeleted,
        OpenAIBatch,
        OpenAIBatchList,
        OpenAIError,
        OpenAIModel,
        OpenAIModelList,
        mode="serialization",
    )
    return {"paths": _paths(), "schemas": {**schemas, **responses}}
