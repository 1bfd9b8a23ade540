"""The OpenAI-compatible surface's shapes, written once as pydantic models: the requests
it validates and the objects it answers (files, batches, lists, errors), from which the
OpenAPI document's schemas are generated (the ingest-api's OpenAI surface).

The objects follow OpenAI's own definitions field for field (the ``openai`` SDK's
``OpenAIFile``, ``Batch`` and ``OpenAIFileDeleted`` read them strictly in the tests).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from relay_batches.dialects.endpoints import CHAT
from relay_batches.errors import ApiError, invalid

BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
CHAT_ENDPOINT = CHAT  # re-exported: the endpoint of a chat batch


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class OpenAICreateBatch(_Strict):
    """``POST /batches``: ``endpoint`` must be ``/v1/chat/completions``;
    ``completion_window`` is ``24h`` or any ``<n>s|m|h|d`` from 1 s to 7 d; ``metadata``
    at most 16 string pairs, keys up to 64 characters, values up to 512."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


class OpenAIFile(BaseModel):
    """OpenAI's file object."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class OpenAIFileList(BaseModel):
    """``GET /files``: a cursor page of files."""

    object: Literal["list"] = "list"
    data: list[OpenAIFile]
    has_more: bool
    first_id: str | None
    last_id: str | None


class OpenAIFileDeleted(BaseModel):
    """``DELETE /files/{file_id}``."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool


class OpenAIBatchError(BaseModel):
    """One error of a batch's input file: ``line`` is 1-based."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class OpenAIBatchErrors(BaseModel):
    """The errors of a batch whose input file failed validation."""

    object: Literal["list"] = "list"
    data: list[OpenAIBatchError]


class OpenAIRequestCounts(BaseModel):
    """How many requests a batch holds, and how many ended well or badly."""

    total: int
    completed: int
    failed: int


class OpenAIInputTokensDetails(BaseModel):
    """Breakdown of input tokens (Relay keeps no cache: always 0)."""

    cached_tokens: int = 0


class OpenAIOutputTokensDetails(BaseModel):
    """Breakdown of output tokens (Relay does not count reasoning tokens: always 0)."""

    reasoning_tokens: int = 0


class OpenAIBatchUsage(BaseModel):
    """Tokens used by the batch's requests so far."""

    input_tokens: int
    input_tokens_details: OpenAIInputTokensDetails = OpenAIInputTokensDetails()
    output_tokens: int
    output_tokens_details: OpenAIOutputTokensDetails = OpenAIOutputTokensDetails()
    total_tokens: int


class OpenAIBatch(BaseModel):
    """OpenAI's batch object; every time a Unix-second integer."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: OpenAIBatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: OpenAIRequestCounts
    metadata: dict[str, str] | None = None
    model: str | None = None
    usage: OpenAIBatchUsage | None = None


class OpenAIBatchList(BaseModel):
    """``GET /batches``: a cursor page of batches, newest first."""

    object: Literal["list"] = "list"
    data: list[OpenAIBatch]
    has_more: bool
    first_id: str | None
    last_id: str | None


class OpenAIErrorDetail(BaseModel):
    """The inside of OpenAI's error object."""

    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    """OpenAI's error object, the answer of every failure on this surface."""

    error: OpenAIErrorDetail


class OpenAIUploadForm(BaseModel):
    """``POST /files`` (multipart/form-data): the ``.jsonl`` file and ``purpose=batch``."""

    file: bytes
    purpose: Literal["batch"]


def validation_error(exc: ValidationError) -> ApiError:
    """The first problem pydantic found as a 400 naming the field's dotted path."""
    first = exc.errors(include_url=False)[0]
    param = ".".join(str(part) for part in first["loc"]) or None
    if first["type"] == "extra_forbidden":
        return invalid(f"{param} is not a parameter of this request", param)
    if first["type"] == "missing":
        return invalid(f"{param} is required", param)
    where = f"{param}: " if param else ""
    return invalid(f"{where}{first['msg']}", param)
